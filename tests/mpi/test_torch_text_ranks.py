"""hpcopt.torch.text at any world size: each rank trains on its share of the windows, and the
evaluation (each rank its block of the windows, one allreduce) is the serial mean over all."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hpcopt.torch import evaluate_tokens, language_workload  # noqa: E402
from hpcopt.torch.models import word_lstm  # noqa: E402
from hpcopt.torch.text import sequence_loss, windows  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.extra]

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


def test_a_carried_state_resumes_bitwise_from_a_mid_round_checkpoint(comm, shared_dir):
    """``--model torch:...`` of a module carrying its state on a corpus: every rank's state (h, c)
    and integer buffer go through a checkpoint taken mid-round and mid-pass, and the resumed
    run, crossing the point where each rank's streams restart, is the uninterrupted one."""
    import h5py

    from hpcopt.config import build_config
    from tests.runs import assert_same_state, fresh_train

    # 2,024 training tokens: 16 streams of 126 // N tokens per rank, 16 // N windows of 8 per pass
    def config(steps, out):
        return build_config(None, {"model": "torch:tests.torch_models:tiny_carried_lm",
                                   "dataset": "shakespeare", "corpus_fraction": "0.0005",
                                   "batch_size": "16", "bptt": "8", "steps": steps, "interval": "4",
                                   "algorithm": "celgc", "lr": "1", "gamma": "0.5", "momentum": "0.9",
                                   "checkpoint_every": "10", "out": str(out), "progress": "false"})

    whole_summary, whole = fresh_train(config("24", shared_dir / "whole"))
    fresh_train(config("10", shared_dir / "part"))
    with h5py.File(shared_dir / "part" / "checkpoints" / "step-000000010.h5") as f:
        hidden = f["ranks/hidden"][...]
    assert hidden.shape == (comm.size, 2 + 2 * 16 * 8)  # the calls counter's pair, then h and c
    assert np.all(hidden[:, 2:].any(axis=1))  # a state mid-pass, not zeros
    summary, resumed = fresh_train(config("24", shared_dir / "part"), resume=shared_dir / "part")
    assert_same_state(resumed, whole)
    assert summary.final.perplexity == whole_summary.final.perplexity
