"""hpcopt.torch.text at any world size: each rank trains on its share of the windows, and the
evaluation (each rank its block of the windows, one allreduce) is the serial mean over all."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hpcopt.torch import evaluate_tokens, language_workload  # noqa: E402
from hpcopt.torch.models import word_lstm  # noqa: E402
from hpcopt.torch.text import sequence_loss, windows  # noqa: E402

pytestmark = pytest.mark.mpi

VOCAB, BPTT = 11, 4


def factory():
    return word_lstm(VOCAB, embedding=6, hidden=6)


def test_windows_are_dealt_once_and_evaluation_is_the_serial_mean(comm):
    rng = np.random.default_rng(5)
    train, valid = rng.integers(0, VOCAB, 401), rng.integers(0, VOCAB, 97)
    run = language_workload(factory, train, valid, comm, bptt=BPTT, batch_size=3, seed=1,
                            dtype="float64", eval_chunk=5)
    mine = run.problem.batches.inputs
    counts = np.array([mine.shape[0]], dtype=np.int64)
    comm.mpi.Allreduce(np.array(counts), counts)
    assert counts[0] == windows(train, BPTT)[0].shape[0]  # every window on exactly one rank
    assert run.steps_per_epoch == (100 // comm.size) // 3
    module = copy.deepcopy(run.problem.model.module).eval()
    inputs, targets = windows(valid, BPTT)
    with torch.no_grad():
        expected = sequence_loss(module(inputs), targets).item()
    for evaluation in (run.evaluate(run.x0, None, comm),
                       evaluate_tokens(run, run.x0, valid, comm, bptt=BPTT, chunk=2)):
        assert evaluation.loss == pytest.approx(expected, rel=1e-12)
        assert evaluation.tokens == inputs.numel()
