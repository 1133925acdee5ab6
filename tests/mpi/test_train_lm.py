"""The LSTM language model run through ``train()`` on every world size: CELGC on it matches the
serial reference, the summary and trace speak of perplexity and tokens, and T from epochs is the
same on every rank; on CPU and on the GPU."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt import train
from hpcopt.config import build_config
from hpcopt.io.trace import read_trace
from hpcopt.problems.language_model import LMEvaluation
from tests.conftest import host
from tests.mpi.lm_corpus import write_tiny_ptb
from tests.reference import celgc_reference, worker_parts

pytestmark = pytest.mark.mpi


@pytest.fixture
def shared_dir(shared_dir, comm):
    """The shared directory with a tiny PTB corpus in ``ptb/``."""
    if comm.rank == 0:
        write_tiny_ptb(shared_dir / "ptb")
    comm.mpi.Barrier()
    return shared_dir


def lm_config(directory, **overrides):
    base = dict(dataset="ptb", path=str(directory / "ptb"), model="lstm", hidden="8,8", embed="6",
                batch_size="3", bptt="7", steps="13", dtype="float64", lr="2", interval="4",
                progress="false", seed="5", algorithm="celgc", gamma="0.3")
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, base)


def test_celgc_on_the_lstm_matches_the_serial_reference(comm, shared_dir, device):
    config = lm_config(shared_dir, momentum=0.5, tie="true", hidden="6", device=device)
    summary, state = train(config, comm, verbose=False)
    algo = config.algorithm
    parts = worker_parts(config, comm.size)
    schedule = parts[0].algorithm.lr_at
    models, counts = celgc_reference(parts[0].workload.x0, [p.workload.problem.oracle for p in parts],
                                     config.run.steps, algo.interval, lr=schedule, gamma=algo.gamma,
                                     base_lr=algo.lr, momentum=algo.momentum)
    np.testing.assert_allclose(host(state.x), sum(models) / comm.size, rtol=1e-9, atol=1e-12)
    assert int(state.clip_count) == counts[comm.rank]
    assert summary.clip_fraction == sum(counts) / (config.run.steps * comm.size) > 0
    assert isinstance(summary.final, LMEvaluation) and summary.unit == "tokens"
    assert np.isclose(summary.final.perplexity, np.exp(summary.final.loss))
    assert "test perplexity" in summary.lines()[0]
    assert "tokens/s" in "\n".join(summary.lines())


def test_prsgd_lstm_epochs_trace_and_perplexity(comm, shared_dir, device):
    out = shared_dir / "run"
    config = lm_config(shared_dir, algorithm="prsgd", gamma="inf", steps=0, epochs=1.5,
                       eval_every=8, trace_every=4, out=str(out), partition="block", device=device)
    summary, state = train(config, comm, verbose=False)
    # 3000 words + <eos> per line over N ranks, 3 streams, windows of 7
    words = 3000 + 250
    windows = -(-((words // comm.size) // 3 - 1) // 7)
    assert state.step == int(np.ceil(1.5 * windows))
    if comm.rank == 0:
        trace = read_trace(out / "trace.h5")
        ppl = trace.columns["eval_perplexity"]
        assert np.isfinite(ppl).sum() == len(summary.history) > 0
        assert np.all(np.isnan(trace.columns["eval_accuracy"]))
        assert trace.summary["eval_perplexity"] == summary.final.perplexity
        assert trace.summary["eval_tokens"] == summary.final.tokens
