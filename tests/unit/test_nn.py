"""Layer and model gradients against central finite differences (float64), on NumPy and CuPy."""

import numpy as np
import pytest

from hpcopt.nn import Linear, ReLU, Sequential, Tanh, mlp, softmax_cross_entropy
from tests.conftest import host
from tests.gradcheck import numeric_grad


def model_loss_and_grads(model, x_in, labels, params, grads):
    model.bind(params, grads)
    loss, dlogits = softmax_cross_entropy(model.forward(x_in), labels)
    dx = model.backward(dlogits, need_input_grad=True)
    return float(loss), dx


@pytest.mark.parametrize("layers", [
    lambda: [Linear(4, 3, name="fc")],
    lambda: [Linear(4, 5, name="a"), ReLU(), Linear(5, 3, name="b")],
    lambda: [Linear(4, 5, name="a"), Tanh(), Linear(5, 3, name="b")],
])
def test_parameter_and_input_gradients_match_finite_differences(layers, xp):
    rng = np.random.default_rng(0)
    model = Sequential(layers())
    params = xp.zeros(model.layout.size)
    grads = xp.zeros_like(params)
    model.init(params, rng)
    params += xp.asarray(0.1 * rng.standard_normal(params.size))  # nonzero biases
    x_in = xp.asarray(rng.standard_normal((6, 4)))
    labels = xp.asarray(rng.integers(0, 3, size=6))
    _, dx = model_loss_and_grads(model, x_in, labels, params, grads)

    def f():
        return float(softmax_cross_entropy(model.forward(x_in), labels)[0])

    np.testing.assert_allclose(host(grads), numeric_grad(f, params), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(host(dx), numeric_grad(f, x_in), rtol=1e-6, atol=1e-8)


def test_softmax_cross_entropy_value_and_gradient(xp):
    rng = np.random.default_rng(1)
    logits_host = rng.standard_normal((5, 4)) * 10
    labels_host = np.array([0, 3, 1, 1, 2])
    logits, labels = xp.asarray(logits_host), xp.asarray(labels_host)
    loss, grad = softmax_cross_entropy(logits, labels)
    p = np.exp(logits_host - logits_host.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert float(loss) == pytest.approx(-np.log(p[np.arange(5), labels_host]).mean(), rel=1e-12)
    np.testing.assert_allclose(host(grad),
                               numeric_grad(lambda: float(softmax_cross_entropy(logits, labels)[0]),
                                            logits), rtol=1e-6, atol=1e-9)
    # stable for huge logits
    big, _ = softmax_cross_entropy(xp.asarray([[1e4, 0.0]]), xp.asarray([1]))
    assert float(big) == pytest.approx(1e4)


def test_mlp_gradient_and_layout_names(xp):
    model = mlp(6, [5, 4], 3, activation="tanh")
    assert model.layout.names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                  "fc3.weight", "fc3.bias"]
    rng = np.random.default_rng(2)
    params = xp.zeros(model.layout.size)
    grads = xp.zeros_like(params)
    model.init(params, rng)
    x_in, labels = xp.asarray(rng.standard_normal((7, 6))), xp.asarray(rng.integers(0, 3, size=7))
    model_loss_and_grads(model, x_in, labels, params, grads)
    f = lambda: float(softmax_cross_entropy(model.forward(x_in), labels)[0])  # noqa: E731
    np.testing.assert_allclose(host(grads), numeric_grad(f, params), rtol=1e-6, atol=1e-8)


def test_backward_overwrites_gradients_instead_of_accumulating(xp):
    model = mlp(3, [4], 2)
    params = xp.zeros(model.layout.size)
    grads = xp.zeros_like(params)
    model.init(params, np.random.default_rng(3))
    x_in, labels = xp.ones((2, 3)), xp.asarray([0, 1])
    model_loss_and_grads(model, x_in, labels, params, grads)
    first = host(grads)
    model_loss_and_grads(model, x_in, labels, params, grads)
    np.testing.assert_array_equal(host(grads), first)


def test_bad_layer_arguments():
    with pytest.raises(ValueError):
        Linear(0, 3)
    with pytest.raises(ValueError, match="activation"):
        mlp(3, [4], 2, activation="sigmoidal")
    with pytest.raises(ValueError, match="unique"):
        Sequential([Linear(2, 2, name="a"), Linear(2, 2, name="a")])
