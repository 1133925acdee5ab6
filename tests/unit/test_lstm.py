"""LSTM language model: gradients against central finite differences (float64), state carrying,
tied weights and the overwrite contract."""

import numpy as np
import pytest

from hpcopt.nn.embedding import Embedding
from hpcopt.nn.language_model import LSTMLanguageModel
from hpcopt.nn.lstm import LSTM
from tests.gradcheck import numeric_grad


def make_model(tie, layers=2, vocab=7, embed=4, hidden=5, seed=0):
    model = LSTMLanguageModel(vocab, embed, hidden, layers=layers, tie=tie)
    params = np.zeros(model.layout.size)
    model.init(params, np.random.default_rng(seed))
    params *= 3.0  # larger weights: saturating gates and non-trivial dynamics over time
    return model, params, np.zeros_like(params)


def window(vocab=7, steps=6, batch=3, seed=1):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(steps + 1, batch))
    return tokens[:-1], tokens[1:]


@pytest.mark.parametrize("tie", [False, True])
def test_two_layer_gradient_through_six_steps_matches_finite_differences(tie):
    model, params, grads = make_model(tie)
    inputs, targets = window()
    rng = np.random.default_rng(2)
    state = [(rng.standard_normal((3, n)), rng.standard_normal((3, n)))
             for n in (lstm.hidden for lstm in model.lstms)]  # a carried-over, non-zero state
    loss, _ = model.loss_and_grad(params, grads, inputs, targets, state)
    scratch = np.zeros_like(params)

    def f():
        return float(model.loss(params, scratch, inputs, targets, state)[0])

    assert float(loss) == pytest.approx(f(), rel=1e-14)
    np.testing.assert_allclose(grads, numeric_grad(f, params), rtol=1e-6, atol=1e-9)


def test_lstm_input_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    lstm = LSTM(3, 4)
    weight, bias = rng.standard_normal((7, 16)), rng.standard_normal(16)
    lstm.bind({"weight": weight, "bias": bias},
              {"weight": np.zeros_like(weight), "bias": np.zeros_like(bias)})
    x, w_out = rng.standard_normal((5, 2, 3)), rng.standard_normal((5, 2, 4))
    lstm.forward(x)
    dx = lstm.backward(w_out.copy())
    np.testing.assert_allclose(dx, numeric_grad(lambda: float((lstm.forward(x) * w_out).sum()), x),
                               rtol=1e-6, atol=1e-9)


def test_tied_model_has_one_shared_matrix_and_ties_the_last_layer_width():
    tied, params, grads = make_model(tie=True, layers=2, embed=4, hidden=5)
    tied.bind(params, grads)
    untied, _, _ = make_model(tie=False, layers=2, embed=4, hidden=5)
    assert tied.layout.names == ["embedding.weight", "lstm1.weight", "lstm1.bias",
                                 "lstm2.weight", "lstm2.bias", "decoder.bias"]
    assert [(l.inputs, l.hidden) for l in tied.lstms] == [(4, 5), (5, 4)]
    assert dict(tied.layout.entries)["lstm2.weight"] == (5 + 4, 4 * 4)
    assert dict(untied.layout.entries)["decoder.weight"] == (5, 7)
    assert np.shares_memory(tied.decoder.params["weight"], params)  # E^T is a view, not a copy
    np.testing.assert_array_equal(tied.decoder.params["weight"], tied.embedding.params["weight"].T)


def test_state_is_carried_between_windows_and_matches_one_long_window():
    model, params, grads = make_model(tie=False, layers=2)
    tokens = np.random.default_rng(4).integers(0, 7, size=(9, 2))
    state = model.initial_state(2)
    scratch = np.zeros_like(params)
    first, state = model.loss(params, scratch, tokens[:4], tokens[1:5], state)
    second, state = model.loss(params, scratch, tokens[4:8], tokens[5:9], state)
    whole, whole_state = model.loss(params, scratch, tokens[:8], tokens[1:9],
                                    model.initial_state(2))
    assert float(whole) == pytest.approx((float(first) + float(second)) / 2, rel=1e-12)
    for (h, c), (hw, cw) in zip(state, whole_state):
        np.testing.assert_allclose(h, hw, rtol=1e-12)
        np.testing.assert_allclose(c, cw, rtol=1e-12)


def test_returned_state_is_detached_from_later_windows():
    model, params, grads = make_model(tie=True)
    inputs, targets = window()
    _, state = model.loss_and_grad(params, grads, inputs, targets, model.initial_state(3))
    saved = [(h.copy(), c.copy()) for h, c in state]
    model.loss_and_grad(params, grads, inputs, targets, state)
    for (h, c), (h0, c0) in zip(state, saved):
        np.testing.assert_array_equal(h, h0)
        np.testing.assert_array_equal(c, c0)


def test_gradients_are_overwritten_not_accumulated():
    for tie in (False, True):
        model, params, grads = make_model(tie)
        inputs, targets = window()
        state = model.initial_state(3)
        grads[...] = 123.0
        model.loss_and_grad(params, grads, inputs, targets, state)
        first = grads.copy()
        model.loss_and_grad(params, grads, inputs, targets, state)
        np.testing.assert_array_equal(grads, first)


def test_float32_model_stays_float32():
    model = LSTMLanguageModel(11, 6, 8, layers=1)
    params = np.zeros(model.layout.size, dtype=np.float32)
    model.init(params, np.random.default_rng(0))
    grads = np.zeros_like(params)
    inputs, targets = window(vocab=11)
    loss, state = model.loss_and_grad(params, grads, inputs, targets,
                                      model.initial_state(3, np, np.float32))
    assert loss.dtype == np.float32 and state[0][0].dtype == np.float32
    assert np.isfinite(grads).all() and float(loss) == pytest.approx(np.log(11), rel=0.05)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError):
        LSTMLanguageModel(10, 0, 4)
    with pytest.raises(ValueError):
        LSTM(0, 3)
    with pytest.raises(ValueError):
        Embedding(5, 0)
