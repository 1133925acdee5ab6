"""A torch language model that carries its state (``forward(tokens, state) -> (scores, state)``):
truncated BPTT over contiguous streams, the state reset where a rank's streams restart, the
evaluation carrying it, the state through a checkpoint vector, and the modules refused."""

import copy

import numpy as np
import pytest

pytestmark = pytest.mark.extra
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from hpcopt.data.bptt import rank_streams  # noqa: E402
from hpcopt.errors import HpcoptError  # noqa: E402
from hpcopt.torch import evaluate_tokens, language_workload  # noqa: E402
from hpcopt.torch.models import word_lstm, word_lstm_carried  # noqa: E402
from hpcopt.torch.problem import TorchProblem  # noqa: E402
from hpcopt.torch.streams import StreamProblem  # noqa: E402
from hpcopt.torch.text import sequence_loss  # noqa: E402
from tests.torch_models import tiny_carried_lm  # noqa: E402

VOCAB, BPTT, STREAMS = 13, 5, 3


def tokens(n, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, n)


def carried():
    return word_lstm_carried(VOCAB, embedding=8, hidden=8)


def workload(comm, module=carried, train=None, **options):
    train = tokens(3 * 4 * BPTT * STREAMS + STREAMS) if train is None else train
    return language_workload(module, train, tokens(200, 1), comm, bptt=BPTT, batch_size=STREAMS,
                             seed=0, dtype="float64", partition="block", **options)


def windows_of(streams, bptt):
    """The (B, T) windows of one pass over (L, B) streams, in order."""
    length = streams.shape[0]
    return [(torch.from_numpy(streams[s:min(s + bptt, length - 1)].T.copy()),
             torch.from_numpy(streams[s + 1:min(s + bptt, length - 1) + 1].T.copy()))
            for s in range(0, length - 1, bptt)]


def test_the_state_is_carried_across_windows_and_reset_where_the_streams_restart(comm):
    train = tokens(STREAMS * (3 * BPTT + 2) + 1)  # 4 windows per pass, the last one 1 token
    run = workload(comm, train=train)
    problem = run.problem
    assert isinstance(problem, StreamProblem) and problem.sampler.windows_per_epoch == 4
    assert run.steps_per_epoch == 4 and run.processed(5) == STREAMS * (3 * BPTT + 1 + BPTT)
    reference = copy.deepcopy(problem.model.module)
    passes = windows_of(rank_streams(train, STREAMS), BPTT)
    state, zero_state_losses = None, []
    for step in range(2 * len(passes) + 1):
        grads = np.full_like(run.x0, np.nan)
        loss = problem.oracle(run.x0, grads)
        inputs, targets = passes[step % len(passes)]
        if step % len(passes) == 0:
            state = None  # the stream restarts: the module's zero state again
        scores, new_state = reference(inputs, state)
        expected = sequence_loss(scores, targets)
        flat = torch.cat([g.reshape(-1) for g in torch.autograd.grad(expected, list(reference.parameters()))])
        assert float(loss) == expected.item(), step
        np.testing.assert_array_equal(grads, flat.numpy())
        zero_state_losses.append(sequence_loss(reference(inputs)[0], targets).item())
        state = tuple(t.detach() for t in new_state)
    assert zero_state_losses[0] == zero_state_losses[4] == zero_state_losses[8] == float(loss)


def test_the_oracle_differs_from_zero_state_windows_after_the_first(comm):
    run = workload(comm)
    problem, reference = run.problem, copy.deepcopy(run.problem.model.module)
    passes = windows_of(rank_streams(tokens(3 * 4 * BPTT * STREAMS + STREAMS), STREAMS), BPTT)
    losses = [float(problem.oracle(run.x0, np.empty_like(run.x0))) for _ in range(2)]
    alone = [sequence_loss(reference(x)[0], y).item() for x, y in passes[:2]]
    assert losses[0] == alone[0] and losses[1] != alone[1]


def test_evaluation_carries_the_state_through_each_rank_s_streams(comm):
    run = workload(comm)
    module = copy.deepcopy(run.problem.model.module).eval()
    for split, evaluation in ((tokens(200, 1), run.evaluate(run.x0, None, comm)),
                              (tokens(151, 2), evaluate_tokens(run, run.x0, tokens(151, 2), comm, bptt=4))):
        bptt = BPTT if split.size == 200 else 4
        total, count, state = 0.0, 0, None
        with torch.no_grad():
            for inputs, targets in windows_of(rank_streams(split, STREAMS), bptt):
                scores, state = module(inputs, state)
                total += sequence_loss(scores, targets).item() * targets.numel()
                count += targets.numel()
        assert evaluation.tokens == count
        assert evaluation.loss == pytest.approx(total / count, rel=1e-12)


def test_a_module_returning_only_scores_keeps_the_windows(comm):
    run = workload(comm, module=lambda: word_lstm(VOCAB, embedding=8, hidden=8))
    assert type(run.problem) is TorchProblem and run.carried is None


def test_the_state_and_integer_buffers_go_through_the_carried_vector(comm):
    run = workload(comm, module=lambda: tiny_carried_lm(VOCAB))
    problem = run.problem
    before = problem.carried()
    assert before.dtype == np.float64 and not before[2:].any()  # the calls counter, then zeros
    for _ in range(3):
        problem.oracle(run.x0, np.empty_like(run.x0))
    saved = problem.carried()
    again = workload(comm, module=lambda: tiny_carried_lm(VOCAB)).problem
    again.load_carried(saved.copy())
    assert int(again.model.module.calls) == int(problem.model.module.calls) == 3
    for a, b in zip(again.state, problem.state):
        assert torch.equal(a, b)
    wanted = (r"module state has 47 values, this module's state "
              r"\(\(1, 3, 8\) float64, \(1, 3, 8\) float64\) has 48")
    with pytest.raises(HpcoptError, match=wanted):
        again.load_carried(saved[:-1])


class Pair(nn.Module):
    """A language model whose forward returns (scores, what ``kind`` says)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.embedding = nn.Embedding(VOCAB, 4)
        self.decoder = nn.Linear(4, VOCAB)

    def forward(self, tokens, *state):
        scores = self.decoder(self.embedding(tokens))
        if self.kind == "no state argument" and state:
            raise TypeError("forward() takes 2 positional arguments but 3 were given")
        if self.kind == "string":
            return scores, "hidden"
        if self.kind == "growing":
            return scores, torch.zeros(1 + sum(s.numel() for s in state), dtype=scores.dtype)
        if self.kind == "integer":
            return scores, torch.zeros(3, dtype=torch.int64)
        return scores, (torch.zeros(2, dtype=scores.dtype),)


@pytest.mark.parametrize("kind,match", [
    ("string", "the state holds str: a state is tensors nested in tuples and lists"),
    ("no state argument", r"cannot take its own state back, forward\(tokens, state\) on a batch of inputs "
                          r"\(3, 5\) int64 and the state \(\(2,\) float64\): TypeError"),
    ("growing", r"returns the state \(2,\) float64, but forward\(tokens\) returned \(1,\) float64"),
    ("integer", r"state \(3,\) int64 .* must be tensors of the model's dtype float64"),
])
def test_a_module_that_breaks_the_state_convention_is_refused(comm, kind, match):
    with pytest.raises(HpcoptError, match=match):
        workload(comm, module=lambda: Pair(kind))


def test_a_carried_state_trains_on_contiguous_streams_only(comm):
    with pytest.raises(HpcoptError, match="contiguous streams dealt iid or block, not dirichlet"):
        language_workload(carried, tokens(400), tokens(100), comm, bptt=BPTT, batch_size=STREAMS,
                          partition="dirichlet")
