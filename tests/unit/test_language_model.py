"""The language-model problem: windows in order, hidden state carried and reset per epoch,
distributed perplexity, on NumPy and CuPy."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from hpcopt.backend import get_backend
from hpcopt.data.bptt import BpttSampler, rank_streams
from hpcopt.nn.language_model import LSTMLanguageModel
from hpcopt.problems.language_model import LanguageModelProblem
from tests.conftest import host

TOKENS = np.random.default_rng(0).integers(0, 9, size=200)


def setup(xp, rank=0, size=1, bptt=6, batch=4):
    """Model, its parameters, this rank's token streams and the problem, all on ``xp``."""
    model = LSTMLanguageModel(9, 5, 6, layers=2)
    params = xp.zeros(model.layout.size)
    model.init(params, np.random.default_rng(1))
    streams = xp.asarray(rank_streams(TOKENS, batch, rank, size))
    backend = get_backend("cpu" if xp is np else "gpu")
    problem = LanguageModelProblem(model, BpttSampler(streams, bptt), backend, np.float64)
    return model, params, streams, problem


def test_oracle_carries_the_hidden_state_and_resets_it_each_epoch(xp):
    model, params, streams, problem = setup(xp)
    windows = problem.sampler.windows_per_epoch  # 49 inputs per stream: 9 windows
    grads, expected_grads = xp.zeros_like(params), xp.zeros_like(params)
    reference = BpttSampler(streams, 6)
    for _epoch in range(2):
        state = model.initial_state(4, xp)
        for _ in range(windows):
            inputs, targets = reference.next_window()
            expected, state = model.loss_and_grad(params, expected_grads, inputs, targets, state)
            loss = problem.oracle(params, grads)
            assert float(loss) == float(expected)
            np.testing.assert_array_equal(host(grads), host(expected_grads))
    assert problem.sampler.epoch == 2


def fake_comm(totals_of_other_ranks=()):
    """A one-process stand-in for Comm that adds the other ranks' (sum, count) pairs."""
    def allreduce_host_(values, label):
        assert label == "eval"
        for other in totals_of_other_ranks:
            values += other
        return values
    return SimpleNamespace(allreduce_host_=allreduce_host_)


def test_perplexity_is_exp_of_the_token_weighted_mean_loss_over_ranks(xp):
    parts = []
    for rank in range(2):
        model, params, _, problem = setup(xp, rank, 2)
        streams = xp.asarray(rank_streams(TOKENS, 3, rank, 2))
        sampler, state, total, count = BpttSampler(streams, 5), model.initial_state(3, xp), 0.0, 0
        for _ in range(sampler.windows_per_epoch):
            inputs, targets = sampler.next_window()
            loss, state = model.loss(params, xp.zeros_like(params), inputs, targets, state)
            total, count = total + float(loss) * targets.size, count + targets.size
        parts.append((problem, params, streams, np.array([total, count])))
    problem, params, streams, _ = parts[0]
    result = problem.evaluate(params, xp.zeros_like(params), streams, 5, fake_comm([parts[1][3]]))
    total, count = parts[0][3] + parts[1][3]
    assert result.tokens == count == 2 * 3 * 32  # 100 tokens per rank: 3 streams of 33, 32 targets
    assert result.loss == pytest.approx(total / count, rel=1e-12)
    assert result.perplexity == pytest.approx(math.exp(total / count), rel=1e-12)
    assert 5 < result.perplexity < 15  # an untrained model over 9 tokens: about uniform


def test_evaluation_does_not_touch_the_training_stream_or_state(xp):
    _, params, streams, problem = setup(xp)
    problem.oracle(params, xp.zeros_like(params))
    hidden, position = problem.hidden, problem.sampler.position
    problem.evaluate(params, xp.zeros_like(params), streams, 7, fake_comm())
    assert problem.hidden is hidden and problem.sampler.position == position
