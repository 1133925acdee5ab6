"""LSTM language model: gradients against central finite differences (float64), state carrying,
tied weights and the overwrite contract, on NumPy and CuPy."""

import numpy as np
import pytest

from hpcopt.nn.embedding import Embedding
from hpcopt.nn.language_model import LSTMLanguageModel
from hpcopt.nn.lstm import LSTM
from tests.conftest import host
from tests.gradcheck import numeric_grad


def make_model(tie, xp, layers=2, vocab=7, embed=4, hidden=5, seed=0):
    model = LSTMLanguageModel(vocab, embed, hidden, layers=layers, tie=tie)
    params = xp.zeros(model.layout.size)
    model.init(params, np.random.default_rng(seed))
    params *= 3.0  # larger weights: saturating gates and non-trivial dynamics over time
    return model, params, xp.zeros_like(params)


def window(xp, vocab=7, steps=6, batch=3, seed=1):
    rng = np.random.default_rng(seed)
    tokens = xp.asarray(rng.integers(0, vocab, size=(steps + 1, batch)))
    return tokens[:-1], tokens[1:]


@pytest.mark.parametrize("tie", [False, True])
def test_two_layer_gradient_through_six_steps_matches_finite_differences(tie, xp):
    model, params, grads = make_model(tie, xp)
    inputs, targets = window(xp)
    rng = np.random.default_rng(2)
    state = [(xp.asarray(rng.standard_normal((3, n))), xp.asarray(rng.standard_normal((3, n))))
             for n in (lstm.hidden for lstm in model.lstms)]  # a carried-over, non-zero state
    loss, _ = model.loss_and_grad(params, grads, inputs, targets, state)
    scratch = xp.zeros_like(params)

    def f():
        return float(model.loss(params, scratch, inputs, targets, state)[0])

    assert float(loss) == pytest.approx(f(), rel=1e-14)
    np.testing.assert_allclose(host(grads), numeric_grad(f, params), rtol=1e-6, atol=1e-9)


def test_lstm_input_gradient_matches_finite_differences(xp):
    rng = np.random.default_rng(3)
    lstm = LSTM(3, 4)
    weight, bias = xp.asarray(rng.standard_normal((7, 16))), xp.asarray(rng.standard_normal(16))
    lstm.bind({"weight": weight, "bias": bias},
              {"weight": xp.zeros_like(weight), "bias": xp.zeros_like(bias)})
    x = xp.asarray(rng.standard_normal((5, 2, 3)))
    w_out = xp.asarray(rng.standard_normal((5, 2, 4)))
    lstm.forward(x)
    dx = lstm.backward(w_out.copy())
    np.testing.assert_allclose(host(dx),
                               numeric_grad(lambda: float((lstm.forward(x) * w_out).sum()), x),
                               rtol=1e-6, atol=1e-9)


def test_tied_model_has_one_shared_matrix_and_ties_the_last_layer_width(xp):
    tied, params, grads = make_model(tie=True, xp=xp, layers=2, embed=4, hidden=5)
    tied.bind(params, grads)
    untied, _, _ = make_model(tie=False, xp=xp, layers=2, embed=4, hidden=5)
    assert tied.layout.names == ["embedding.weight", "lstm1.weight", "lstm1.bias",
                                 "lstm2.weight", "lstm2.bias", "decoder.bias"]
    assert [(layer.inputs, layer.hidden) for layer in tied.lstms] == [(4, 5), (5, 4)]
    assert dict(tied.layout.entries)["lstm2.weight"] == (5 + 4, 4 * 4)
    assert dict(untied.layout.entries)["decoder.weight"] == (5, 7)
    assert xp.shares_memory(tied.decoder.params["weight"], params)  # E^T is a view, not a copy
    np.testing.assert_array_equal(host(tied.decoder.params["weight"]),
                                  host(tied.embedding.params["weight"]).T)


def test_state_is_carried_between_windows_and_matches_one_long_window(xp):
    model, params, grads = make_model(tie=False, xp=xp, layers=2)
    tokens = xp.asarray(np.random.default_rng(4).integers(0, 7, size=(9, 2)))
    state = model.initial_state(2, xp)
    scratch = xp.zeros_like(params)
    first, state = model.loss(params, scratch, tokens[:4], tokens[1:5], state)
    second, state = model.loss(params, scratch, tokens[4:8], tokens[5:9], state)
    whole, whole_state = model.loss(params, scratch, tokens[:8], tokens[1:9],
                                    model.initial_state(2, xp))
    assert float(whole) == pytest.approx((float(first) + float(second)) / 2, rel=1e-12)
    for (h, c), (hw, cw) in zip(state, whole_state):
        np.testing.assert_allclose(host(h), host(hw), rtol=1e-12)
        np.testing.assert_allclose(host(c), host(cw), rtol=1e-12)


def test_returned_state_is_detached_from_later_windows(xp):
    model, params, grads = make_model(tie=True, xp=xp)
    inputs, targets = window(xp)
    _, state = model.loss_and_grad(params, grads, inputs, targets, model.initial_state(3, xp))
    saved = [(host(h), host(c)) for h, c in state]
    model.loss_and_grad(params, grads, inputs, targets, state)
    for (h, c), (h0, c0) in zip(state, saved):
        np.testing.assert_array_equal(host(h), h0)
        np.testing.assert_array_equal(host(c), c0)


@pytest.mark.parametrize("tie", [False, True])
def test_gradients_are_overwritten_not_accumulated(tie, xp):
    model, params, grads = make_model(tie, xp)
    inputs, targets = window(xp)
    state = model.initial_state(3, xp)
    grads[...] = 123.0
    model.loss_and_grad(params, grads, inputs, targets, state)
    first = host(grads)
    model.loss_and_grad(params, grads, inputs, targets, state)
    np.testing.assert_array_equal(host(grads), first)


def test_float32_model_stays_float32(xp):
    model = LSTMLanguageModel(11, 6, 8, layers=1)
    params = xp.zeros(model.layout.size, dtype=np.float32)
    model.init(params, np.random.default_rng(0))
    grads = xp.zeros_like(params)
    inputs, targets = window(xp, vocab=11)
    loss, state = model.loss_and_grad(params, grads, inputs, targets,
                                      model.initial_state(3, xp, np.float32))
    assert loss.dtype == np.float32 and state[0][0].dtype == np.float32
    assert np.isfinite(host(grads)).all() and float(loss) == pytest.approx(np.log(11), rel=0.05)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError):
        LSTMLanguageModel(10, 0, 4)
    with pytest.raises(ValueError):
        LSTM(0, 3)
    with pytest.raises(ValueError):
        Embedding(5, 0)
