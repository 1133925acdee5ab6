"""Staged problems: losses and gradients against finite differences, bounds, known optima, with
their data on NumPy and on CuPy arrays (the ``xp`` fixture)."""

import numpy as np
import pytest

from hpcopt.data.datasets import load_dataset
from hpcopt.nn.margin import attack_margin, multiclass_hinge
from hpcopt.problems.attack import adversarial_attack, train_classifier
from hpcopt.problems.few_shot import accuracy, few_shot
from hpcopt.problems.l1_chain import l1_chain
from tests.conftest import host


def value_at(problem, xp):
    """f at a host point, evaluated through one device buffer written in place (Sequential.bind
    caches by array identity, which a fresh temporary may reuse on the emulated CuPy)."""
    point = xp.zeros(problem.params.size)

    def value(x):
        point[...] = xp.asarray(x)
        return problem.value(point)

    return value


def finite_differences(f, x, eps=1e-6):
    out = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = eps
        out[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return out


@pytest.mark.parametrize("loss", [multiclass_hinge, attack_margin])
def test_margin_losses_gradients_match_finite_differences(xp, loss):
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((6, 4)) * 3, rng.integers(0, 4, 6)
    value, grad = loss(xp.asarray(logits), xp.asarray(labels))
    assert isinstance(grad, xp.ndarray)
    numeric = finite_differences(
        lambda z: float(loss(xp.asarray(z.reshape(6, 4)), xp.asarray(labels))[0]), logits.ravel())
    np.testing.assert_allclose(host(grad).ravel(), numeric, atol=1e-8)
    margins = logits[np.arange(6), labels] - np.where(np.eye(4)[labels] > 0, -np.inf, logits).max(1)
    expected = {multiclass_hinge: np.maximum(0, 1 - margins).mean(),
                attack_margin: np.maximum(margins, 0.0).mean()}[loss]
    assert float(value) == pytest.approx(expected)


def test_l1_chain_has_its_known_minimum_and_lipschitz_bound(xp):
    problem = l1_chain(blocks=3, block_dim=2, rows=10, seed=1, xp=xp)
    assert problem.xp is xp and isinstance(problem.source(0), xp.ndarray)

    value = value_at(problem, xp)
    star = problem.extras["theta_star"]
    assert value(star) == pytest.approx(0.0, abs=1e-14)
    assert problem.radius == pytest.approx(np.linalg.norm(star))
    rng = np.random.default_rng(2)
    for _ in range(5):
        x, g = rng.standard_normal(6), xp.zeros(6)
        loss = problem.value_and_grad(xp.asarray(x), g)
        assert loss > 0 and np.linalg.norm(host(g)) <= problem.lipschitz
        np.testing.assert_allclose(host(g), finite_differences(value, x), atol=1e-7)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_attack_problem_freezes_the_classifier_and_bounds_the_perturbation(digits, xp):
    model, params = train_classifier(digits, hidden=(16,), epochs=2, seed=0)
    images = digits.x_test[:3] / 16
    problem = adversarial_attack(model, params, images, digits.y_test[:3], eps=0.1, xp=xp)
    assert isinstance(problem.source(0), xp.ndarray)
    n = images.size
    assert problem.frozen == {"fc1", "fc2"}
    mask = problem.trainable_mask()
    assert mask[:n].all() and not mask[n:].any()
    np.testing.assert_array_equal(problem.params[n:], params)
    lower, upper = problem.lower[:n], problem.upper[:n]
    assert (lower <= 0).all() and (upper >= 0).all() and (upper - lower <= 0.2 + 1e-15).all()
    assert (images.ravel() + lower >= 0).all() and (images.ravel() + upper <= 1).all()
    x, g = problem.params.copy(), xp.zeros(problem.params.size)
    x[:n] = np.random.default_rng(0).uniform(lower, upper)
    problem.value_and_grad(xp.asarray(x), g)

    value = value_at(problem, xp)

    def f(delta):
        y = x.copy()
        y[:n] = delta
        return value(y)

    np.testing.assert_allclose(host(g)[:n], finite_differences(f, x[:n]), atol=1e-6)


def test_few_shot_problem_uses_a_few_samples_per_class(digits, xp):
    problem = few_shot(digits, shots=3, hidden=(8,), seed=4, xp=xp)
    features = host(problem.source(0))
    assert features.shape == (30, 64) and problem.input_shape == (30, 64)
    assert 0 <= features.min() and features.max() <= 1
    x, g = xp.asarray(problem.params), xp.zeros(problem.params.size)
    assert problem.value_and_grad(x, g) > 0 and float(abs(g).sum()) > 0
    acc = accuracy(problem, problem.params, problem.extras["test_features"],
                   problem.extras["test_labels"])
    assert 0 <= acc <= 1
