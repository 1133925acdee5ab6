"""The pipeline run loop under MPI (Delta = world size): bitwise resume from per-stage
checkpoints, traffic per iteration, the rank-count check before any work."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.io.trace import read_trace
from hpcopt.run.pipeline import train_pipeline
from tests.runs import PIPELINE_TIME_COLUMNS, fresh_pipeline

pytestmark = pytest.mark.mpi


def config(out, **overrides):
    base = dict(algorithm="pprs", problem="l1_chain", lr="0.02", momentum="0.8", dtype="float64", progress="false", seed="5", trace_every="3",
                out=str(out) if out else "")
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, base)



@pytest.mark.parametrize("overrides", [{"samples": 3, "smoothing": 0.05},
                                       {"samples": 3, "smoothing": 0.05, "outer": "accelerated"},
                                       {"algorithm": "pipelined_agd", "pipeline": "1f1b"}])
def test_resume_continues_bitwise_like_an_uninterrupted_run(comm, shared_dir, overrides):
    whole, half = shared_dir / "whole", shared_dir / "half"
    _, want = fresh_pipeline(config(whole, steps=10, **overrides))
    first, _ = fresh_pipeline(config(half, steps=5, **overrides))
    assert first.checkpoint.endswith("step-000000005.h5")
    summary, got = fresh_pipeline(config("", steps=10, **overrides), resume=half)
    for name in ("x", "prev", "z", "anchor", "grad_sum"):
        if getattr(want, name) is not None:
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert (got.step, got.alpha) == (want.step, want.alpha)
    comm.mpi.Barrier()
    if comm.rank == 0:
        a, b = read_trace(whole / "trace.h5"), read_trace(half / "trace.h5")
        assert a.rows == b.rows == 4  # rows at 3, 6, 9 and the partial window at 10
        for name, column in a.columns.items():
            if name not in PIPELINE_TIME_COLUMNS and not name.startswith(("busy_", "idle_")):
                np.testing.assert_array_equal(column, b.columns[name], err_msg=name)
        with h5py.File(whole / "checkpoints/step-000000010.h5") as f, \
                h5py.File(half / "checkpoints/step-000000010.h5") as g:
            np.testing.assert_array_equal(f["model/flat"][()], g["model/flat"][()])
            assert sorted(f["stages"]) == [str(s) for s in range(comm.size)]


def test_each_iteration_sends_k_activations_and_k_gradients_per_boundary(comm):
    samples, steps = 4, 6
    summary, _ = train_pipeline(config("", samples=samples, smoothing=0.05, steps=steps), comm,
                                verbose=False)
    boundaries = comm.size - 1
    assert summary.messages == 2 * samples * boundaries * steps
    assert [row["messages"] for row in summary.history] == \
        [2 * samples * boundaries * t for t in (3, 6)]
    rows = {(op, label): calls for op, label, calls, _, _ in comm.stats.as_rows()}
    for kind, sends in (("activation", comm.rank < comm.size - 1), ("gradient", comm.rank > 0)):
        ops = {op for op, label in rows if label == f"pprs.{kind}"}
        assert ops <= {"send", "recv", "wait"}  # point-to-point only: no collective
        assert rows.get(("send", f"pprs.{kind}"), 0) == (samples * steps if sends else 0)
    for row in summary.history:
        assert row["bubble_ideal"] == boundaries / (samples + boundaries)
        assert 0 <= row["bubble"] < 1
        assert all(row[f"busy_{s}"] > 0 for s in range(comm.size))


def test_rank_count_must_fit_the_stage_plan_before_any_work(comm):
    cfg = config("", stages=",".join(str(i) for i in range(1, comm.size + 1)), steps=2)
    with pytest.raises(HpcoptError, match=f"{comm.size + 1} stage\\(s\\) but runs on {comm.size}"):
        train_pipeline(cfg, comm, verbose=False)
    assert {label for _, label, *_ in comm.stats.as_rows()} == {"preflight"}


def test_sigterm_on_one_stage_stops_every_stage_with_a_checkpoint(comm, shared_dir, monkeypatch):
    """SIGTERM reaches only the last stage mid-window: all stages stop at the next trace row,
    write a checkpoint, and the resumed run ends as the uninterrupted one."""
    import os
    import signal

    from hpcopt.pipeline import Pipeline

    calls = {"n": 0}
    original = Pipeline.gradient

    def gradient(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4 and comm.rank == comm.size - 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args, **kwargs)

    options = dict(samples=3, smoothing=0.05, steps=10)
    _, want = fresh_pipeline(config(shared_dir / "whole", **options))
    monkeypatch.setattr(Pipeline, "gradient", gradient)
    summary, _ = fresh_pipeline(config(shared_dir / "part", **options))
    monkeypatch.undo()
    assert summary.stopped and summary.final_loss is None and summary.steps == 6
    assert summary.checkpoint.endswith("step-000000006.h5")
    _, got = fresh_pipeline(config(shared_dir / "part", **options), resume=shared_dir / "part")
    np.testing.assert_array_equal(got.x, want.x)
    np.testing.assert_array_equal(got.prev, want.prev)
