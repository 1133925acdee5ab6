"""``--checkpoint-minutes`` under MPI at any world size: rank 0's wall clock asks for
checkpoints at trace rows that every rank agrees on; the run's state, trace rows and counted
calls and bytes are those of the same run without them (but the checkpoints' own), and a
resume from one of them is bitwise the uninterrupted run. Data-parallel and pipeline runs."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hpcopt.io import data_parallel_checkpoint as ckpt_io
from hpcopt.io.trace import read_trace
from hpcopt.run import checkpointing, directory
from hpcopt.run.data_parallel import DataParallelSession
from hpcopt.run.pipeline import PipelineSession
from tests.mpi import test_pipeline_run as pipeline_tests
from tests.mpi.test_resume import assert_same_run, config
from tests.runs import PIPELINE_TIME_COLUMNS, fresh_pipeline, fresh_train

pytestmark = pytest.mark.mpi

#: Each step sleeps this long, so that the run lasts several clock periods on any machine.
STEP_SECONDS = 0.004
MINUTES = 0.0015  # 90 ms
TRACE_EVERY = 3   # the test configs' rows: every checkpoint asked for falls on one


def slowed(monkeypatch, session_class) -> None:
    """Every step of ``session_class`` sleeps ``STEP_SECONDS`` first (it changes no number)."""
    step = session_class.step

    def slow(self):
        time.sleep(STEP_SECONDS)
        return step(self)

    monkeypatch.setattr(session_class, "step", slow)


def checkpoint_ticks(comm, out) -> list[int]:
    """The ticks of the run directory's checkpoints, as rank 0 lists them."""
    ticks = [int(ckpt_io.NAME_PATTERN.match(p.name).group(1)) for p in directory.checkpoints(out)] \
        if comm.rank == 0 else None
    return comm.mpi.bcast(ticks)


def assert_checkpointed_by_the_clock(ticks: list[int], steps: int) -> None:
    """Several checkpoints before the final one, each at a trace row."""
    assert len(ticks) >= 3 and ticks[-1] == steps, ticks
    assert all(t % TRACE_EVERY == 0 for t in ticks[:-1]), ticks


def test_data_parallel_checkpoints_by_wall_time_change_nothing_and_resume_bitwise(
        comm, shared_dir, monkeypatch):
    steps = 90
    plain, timed = shared_dir / "plain", shared_dir / "timed"
    _, want = fresh_train(config(plain, steps=steps))
    slowed(monkeypatch, DataParallelSession)
    _, got = fresh_train(config(timed, steps=steps, checkpoint_minutes=MINUTES, keep_checkpoints=1000))
    monkeypatch.undo()
    ticks = checkpoint_ticks(comm, timed)
    assert_checkpointed_by_the_clock(ticks, steps)
    assert_same_run(want, got, plain, timed, comm.rank, ignored_labels=(checkpointing.LABEL,))
    middle = directory.checkpoint_path(timed, ticks[len(ticks) // 2 - 1])
    _, resumed = fresh_train(config(timed, steps=steps, checkpoint_minutes=0), resume=middle)  # may change
    assert_same_run(want, resumed, plain, timed, comm.rank, ignored_labels=(checkpointing.LABEL,))


def test_pipeline_checkpoints_by_wall_time_change_nothing_and_resume_bitwise(
        comm, shared_dir, monkeypatch):
    steps = 75

    def settings(out, **more):
        return pipeline_tests.config(out, steps=steps, samples=3, smoothing=0.05, **more)

    def assert_same(want, got) -> None:
        for name in ("x", "prev", "z", "anchor", "grad_sum"):
            if getattr(want, name) is not None:
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        assert (got.step, got.alpha) == (want.step, want.alpha)
        comm.mpi.Barrier()
        if comm.rank != 0:
            return
        a, b = read_trace(plain / "trace.h5"), read_trace(timed / "trace.h5")
        assert a.rows == b.rows == steps // TRACE_EVERY
        for name, column in a.columns.items():
            if name not in PIPELINE_TIME_COLUMNS and not name.startswith(("busy_", "idle_")):
                np.testing.assert_array_equal(column, b.columns[name], err_msg=name)
        labels = set(a.comm) - {checkpointing.LABEL}
        assert labels == set(b.comm) - {checkpointing.LABEL}
        for label in labels:
            for field in ("calls", "bytes"):
                np.testing.assert_array_equal(a.comm[label][field], b.comm[label][field],
                                              err_msg=f"{label} {field}")

    plain, timed = shared_dir / "plain", shared_dir / "timed"
    _, want = fresh_pipeline(settings(plain))
    slowed(monkeypatch, PipelineSession)
    _, got = fresh_pipeline(settings(timed, checkpoint_minutes=MINUTES, keep_checkpoints=1000))
    monkeypatch.undo()
    ticks = checkpoint_ticks(comm, timed)
    assert_checkpointed_by_the_clock(ticks, steps)
    assert_same(want, got)
    middle = directory.checkpoint_path(timed, ticks[len(ticks) // 2 - 1])
    _, resumed = fresh_pipeline(settings(timed, checkpoint_minutes=MINUTES), resume=middle)
    assert_same(want, resumed)
