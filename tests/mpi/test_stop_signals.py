"""SIGTERM and SIGINT stop the real sessions within two trace rows, at the same tick on every
rank, with a checkpoint at that tick; resuming from it ends bitwise where the uninterrupted run
ends. In this one job (at 2 and 3 ranks: an even and an odd world, where the last rank is not
rank 0 and a launcher's signal lands in neighbouring steps; one rank adds nothing, four add
only run time) the ranks signal themselves at chosen steps
(``hpcopt.run.faults``), under the command line's ``JobSignals`` (with a grace long enough never
to abort here): every rank (at neighbouring steps, as a launcher's signal lands), the last rank
only, or rank 0 in the middle of writing a checkpoint, for checkpoint_every and trace_every
equal, dividing one another either way, and no checkpoints along the way. The loop itself over
the whole grid (checkpoint_every, trace_every, eval_every, every step a signal can land in):
tests/unit/test_stop_loop.py."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from itertools import product

import numpy as np
import pytest

from hpcopt.config import build_config
from hpcopt.io import pipeline_checkpoint as pipe_ckpt
from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from hpcopt.io.trace import read_trace
from hpcopt.run.faults import FaultPlan
from hpcopt.run.signals import JobSignals
from tests.runs import PIPELINE_TIME_COLUMNS, assert_same_state, fresh_pipeline, fresh_train

pytestmark = pytest.mark.mpi

CHECKPOINT_EVERY = (0, 1, 4, 8)
TRACE_EVERY = (1, 2, 8)
#: Who is signalled: every rank, the last rank only, or rank 0 while it writes a checkpoint.
TARGETS = ("every rank", "last rank", "in a checkpoint")
#: SIGUSR1 stops as SIGTERM does (hpcopt.run.signals): tests/faults/test_signals.py sends it.
SIGNALS = (signal.SIGTERM, signal.SIGINT)

DATA_PARALLEL = dict(dataset="digits", hidden="8", batch_size="8", dtype="float64", lr="0.1",
                     interval="4", momentum="0.9", seed="3")
PIPELINE = dict(algorithm="pprs", problem="l1_chain", lr="0.02", momentum="0.8", samples="3",
                smoothing="0.05", dtype="float64", seed="5")


@dataclass(frozen=True)
class Case:
    """One combination: the signal, the steps it lands in (rank -> step; for a checkpoint: the
    checkpoint's tick on rank 0), the row that carries it first, and where every rank stops."""

    ce: int
    te: int
    target: str
    signum: int
    steps: dict[int, int]
    row: int
    stop: int

    def fault(self, rank: int) -> FaultPlan | None:
        if rank not in self.steps:
            return None
        kind = signal.Signals(self.signum).name.lower()
        if self.target == "in a checkpoint":
            kind = f"checkpoint-{kind}"
        return FaultPlan(rank, self.steps[rank], kind)


def cases(size: int, pipeline: bool) -> list[Case]:
    """Every (checkpoint_every, trace_every) pair, each with one of the targets in turn (rank 0
    in a checkpoint where there are checkpoints along the way), SIGTERM and SIGINT in turn, and
    the signal at another position within the first window."""
    found = []
    for number, (ce, te) in enumerate(product(CHECKPOINT_EVERY, TRACE_EVERY)):
        signum = signal.SIGINT if number // len(TARGETS) % 2 else signal.SIGTERM
        target = TARGETS[number % len(TARGETS) if ce else number % 2]
        step = 1 + 3 * ce % te
        if target == "in a checkpoint":
            tick = -(-step // ce) * ce  # the first checkpoint tick from that step on
            steps, row = {0: tick}, tick // te * te + te  # the row of that tick went out before
        else:  # a launcher's signal lands in neighbouring steps
            steps = ({r: step + r % 2 for r in range(size)} if target == "every rank" else
                     {size - 1: step})
            row = -(-step // te) * te
        found.append(Case(ce, te, target, signum, steps, row, stop_tick(row, ce, te, pipeline)))
    return found


def stop_tick(row: int, ce: int, te: int, pipeline: bool) -> int:
    """Where every rank stops when the flag goes out with the row of tick ``row``: a
    pipeline's row is finished at once, a data-parallel row at the next row tick, or at once at
    a checkpoint tick (a checkpoint finishes the rows in flight)."""
    tick = row
    while not (pipeline or (ce and tick % ce == 0)) and not (tick > row and tick % te == 0):
        tick += 1
    return tick


def config(base: dict, out, **overrides):
    values = {**base, "progress": "false", "out": str(out), **overrides}
    return build_config(None, {k: str(v) for k, v in values.items()})


def assert_same_trace(run_dir, reference, measured=("wall",)):
    a, b = read_trace(run_dir / "trace.h5"), read_trace(reference / "trace.h5")
    assert a.rows == b.rows > 0
    for name, column in b.columns.items():
        if not name.startswith(measured):
            np.testing.assert_array_equal(a.columns[name], column, err_msg=name)


@pytest.mark.sizes(2, 3)
@pytest.mark.parametrize("pipeline", [False, True], ids=["data-parallel", "pipeline"])
def test_every_signal_stops_within_two_rows_with_a_checkpoint_and_resumes_bitwise(
        comm, shared_dir, pipeline, monkeypatch):
    # 170 runs: without the child process that vets each checkpoint before a resume, and
    # without fsync (neither is what this test is about: tests/faults test both)
    monkeypatch.setattr("hpcopt.run.vetting.vet_checkpoint", lambda path: None)
    monkeypatch.setattr("hpcopt.io.safe_files._fsync", lambda path: None)
    train, base = (fresh_pipeline, PIPELINE) if pipeline else (fresh_train, DATA_PARALLEL)
    read = (lambda path: pipe_ckpt.read(path, comm.size)) if pipeline else read_checkpoint
    measured = (*PIPELINE_TIME_COLUMNS, "busy_", "idle_") if pipeline else ("wall",)
    grid = cases(comm.size, pipeline)
    assert {(c.target, c.signum) for c in grid} == set(product(TARGETS, SIGNALS))
    total = {te: max(c.stop for c in grid if c.te == te) + 2 for te in TRACE_EVERY}
    references = {}  # the uninterrupted runs
    for te in TRACE_EVERY:
        out = shared_dir / f"reference-{te}"
        references[te] = out, train(config(base, out, steps=total[te], trace_every=te))[1]
    with JobSignals(grace=600):
        for number, case in enumerate(grid):
            name = f"ce {case.ce}, te {case.te}, {case.target}, {signal.Signals(case.signum).name}"
            assert case.stop <= case.row + case.te, name  # within two rows of the signal
            out = shared_dir / f"run-{number}"
            summary, _ = train(config(base, out, steps=total[case.te], trace_every=case.te,
                                      checkpoint_every=case.ce, keep_checkpoints=100),
                               faults=case.fault(comm.rank))
            assert summary.stopped, name
            assert (summary.steps, summary.stop_signal) == \
                (case.stop, signal.Signals(case.signum).name), name
            assert comm.mpi.allgather((summary.steps, summary.checkpoint)) == \
                [(case.stop, summary.checkpoint)] * comm.size, name  # every rank stopped there
            assert summary.checkpoint.endswith(f"step-{case.stop:09d}.h5"), name
            if comm.rank == 0:
                assert read(out).tick == case.stop, name  # the newest checkpoint is the stop's
            # resumed with checkpoint_every 0 only to keep this test short: where it resumes
            # from is what matters
            _, resumed = train(config(base, out, steps=total[case.te], trace_every=case.te,
                                      checkpoint_every=0), resume=out)
            reference_dir, reference_state = references[case.te]
            assert_same_state(resumed, reference_state)
            if comm.rank == 0:
                assert_same_trace(out, reference_dir, measured)
