"""Every failure ends the job quickly, with a non-zero exit code, and never costs the last good
checkpoint: after each fault the run resumes from its newest checkpoint and ends bitwise where
an uninterrupted run ends (real ``mpiexec`` jobs on 2 ranks; docs/results/reliability.md)."""

from __future__ import annotations

import shutil
import signal

import numpy as np
import pytest

from hpcopt.comm.mpi_support import launcher_stop_signal
from hpcopt.io.data_parallel_checkpoint import find_checkpoint, read_checkpoint
from tests.command_line import assert_one_line_error
from tests.faults.jobs import (
    INJECTED,
    SMALL,
    STEPS,
    Send,
    assert_fault_ended_the_job,
    assert_same_run,
    run_job,
)

#: fault -> (flags, exit code (None: any non-zero), what stderr says, seconds from the fault to
#: the end of the job at most, newest checkpoint left behind)
FAULTS = {
    "raise": (["--debug-fail-at", "1:20"], 1,
              "[rank 1] RuntimeError: --debug-fail-at: injected failure on rank 1 at step 20", 5, 16),
    "kill-9": (["--debug-fail-at", "1:20:kill"], None, "signal 9", 5, None),
    "kill-in-checkpoint": (["--debug-fail-at", "0:16:checkpoint"], None, "signal 9", 5, 8),
    "nan": (["--debug-fail-at", "1:20:nan"], 3,
            "hpcopt: error: non-finite loss in the trace row at step 24", 5, 16),
    "hang": (["--debug-fail-at", "1:10:hang", "--stall-timeout", "2"], 4,
             "not arrived: rank 1", 2 + 4, 8),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run every resumed one must match."""
    out = tmp_path_factory.mktemp("reference") / "run"
    job = run_job(["train", *SMALL, "--steps", str(STEPS), "--out", str(out)])
    assert job.returncode == 0, job.describe()
    return out


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_ends_the_job_fast_and_the_run_resumes_bitwise(fault, reference, tmp_path):
    flags, code, message, seconds, newest = FAULTS[fault]
    out = tmp_path / "run"
    job = run_job(["train", *SMALL, "--steps", str(STEPS), "--out", str(out), *flags])
    assert_fault_ended_the_job(job, code, message, seconds)
    ckpt = read_checkpoint(out)  # the newest complete checkpoint loads
    assert ckpt.tick < STEPS and (newest is None or ckpt.tick == newest), ckpt.path
    if fault == "kill-in-checkpoint":  # the interrupted write left only its temporary file
        assert (out / "checkpoints" / "step-000000016.h5.tmp").exists()
    resumed = run_job(["resume", str(out)])
    assert resumed.returncode == 0, resumed.describe()
    assert_same_run(out, reference)


def test_nan_with_skip_drops_the_step_and_finishes(tmp_path):
    out = tmp_path / "run"
    job = run_job(["train", *SMALL, "--steps", str(STEPS), "--out", str(out),
                   "--on-nonfinite", "skip", "--debug-fail-at", "1:20:nan", "--progress", "true"])
    assert job.returncode == 0, job.describe()
    assert "1 step(s) with a non-finite loss or gradient were skipped" in job.stdout
    ckpt = read_checkpoint(out)
    assert ckpt.tick == STEPS and np.isfinite(ckpt.model).all()


def test_sigterm_to_the_launcher_checkpoints_and_resumes_bitwise(tmp_path):
    """SIGTERM, or under Open MPI SIGUSR1 (its mpirun kills the ranks for SIGTERM)."""
    out, reference = tmp_path / "run", tmp_path / "reference"
    signum = launcher_stop_signal(signal.SIGTERM)
    job = run_job(["train", *SMALL, "--steps", "100000", "--out", str(out), "--progress", "true"],
                  send=Send(signum, 0.5))
    assert job.returncode == 143, job.describe()  # stopped (128 + SIGTERM), not finished
    assert f"hpcopt: {signal.Signals(signum).name}: stopped at step" in job.stdout
    assert job.after_fault is not None and job.after_fault < 5, job.after_fault
    tick = read_checkpoint(out).tick
    assert 0 < tick < 100000 and tick % 4 == 0  # at a trace row
    resumed = run_job(["resume", str(out), "--steps", str(tick + 8)])
    assert resumed.returncode == 0, resumed.describe()
    uninterrupted = run_job(["train", *SMALL, "--steps", str(tick + 8), "--out", str(reference)])
    assert uninterrupted.returncode == 0, uninterrupted.describe()
    assert_same_run(out, reference)


def test_corrupted_checkpoint_is_one_line_and_the_previous_one_resumes_bitwise(reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    newest = find_checkpoint(out)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    job = run_job(["resume", str(out), "--steps", "40"])
    assert_one_line_error(job, newest.name, "damaged or truncated")
    previous = out / "checkpoints" / "step-000000024.h5"
    resumed = run_job(["resume", str(previous)])
    assert resumed.returncode == 0, resumed.describe()
    assert_same_run(out, reference)


#: Three bytes that make HDF5 2.0 crash (SIGSEGV) reading the small checkpoint's attributes:
#: found by benchmarks/faults/checkpoint_fuzz.py (seed 2), which edits the same checkpoint.
CRASHING_EDIT = [(1393, 119), (49031, 246), (13271, 24)]


def test_a_checkpoint_that_crashes_hdf5_ends_the_job_with_one_line(tmp_path):
    """Rank 0 reads the file whole in a child process before any rank opens it
    (hpcopt.io.vet): where HDF5 crashes on it, the job still ends with exit 2 and one line."""
    from tests.checkpoints import small_checkpoint

    bad = small_checkpoint(tmp_path / "run")
    data = bytearray(bad.read_bytes())
    for offset, value in CRASHING_EDIT:
        data[offset] = value
    bad.write_bytes(bytes(data))
    crashes = run_job([], ranks=1, python_code=(
        "import sys; from hpcopt.io.data_parallel_checkpoint import read_checkpoint\n"
        f"try: read_checkpoint({str(bad)!r})\nexcept Exception: sys.exit(0)"))
    job = run_job(["resume", str(bad), "--steps", "12"])
    if crashes.returncode == 0:  # this HDF5 (or layout) refuses the edit cleanly: still one line
        assert_one_line_error(job, bad.name, "damaged checkpoint")
    else:
        assert_one_line_error(job, bad.name, "the process that checked it crashed reading it (SIG")


#: Rank 1's step 20 fails as an MPI call fails on a rank whose peer has died (kill -9, a lost
#: node) when MPI notices before the launcher ends the rank: an error stack of dozens of lines.
MPI_FAILURE = """
import sys
from mpi4py import MPI
import hpcopt.run.faults as faults

def fail(self, rank, step, grad):
    if (rank, step) == (self.rank, self.step):
        raise MPI.Exception(MPI.ERR_OTHER)
    return False

faults.FaultPlan.before_gradient = fail
from hpcopt.cli import main
sys.exit(main(["train", *{args!r}, "--debug-fail-at", "1:20", "--out", {out!r}]))
"""


def test_an_mpi_call_failing_after_a_peer_died_is_one_line(tmp_path):
    """Once a 35-line traceback with MPI's error stack (2 of 21 kill -9s)."""
    job = run_job([], python_code=MPI_FAILURE.format(args=[*SMALL, "--steps", str(STEPS)],
                                                     out=str(tmp_path / "run")))
    assert job.returncode == 1 and "Traceback" not in job.stderr, job.describe()
    [line] = job.hpcopt_lines()
    from mpi4py import MPI

    assert line.startswith("hpcopt: MPI failed on rank 1: "), job.describe()
    assert f"error class {MPI.ERR_OTHER})" in line, job.describe()  # 15 in MPICH, 16 in Open MPI
    assert line.endswith("another rank has most likely died; ending the job"), job.describe()


#: ``python -c``: training under --stall-timeout 2, where rank 1 stops as the loop's watchdog
#: starts (its start is collective), as a rank stopped or lost at that moment would.
LATE_WATCHDOG = """
import os, sys, time
import hpcopt.run.watchdog as watchdog

start = watchdog.Watchdog.__init__

def late(self, *args, **kwargs):
    if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) == "1":
        sys.stderr.write("{marker}: rank 1 stops as the watchdog starts\\n")
        sys.stderr.flush()
        time.sleep(120)
    start(self, *args, **kwargs)

watchdog.Watchdog.__init__ = late
from hpcopt.cli import main
sys.exit(main(["train", *{args!r}, "--stall-timeout", "2", "--out", {out!r}]))
"""


def test_a_rank_that_never_joins_the_watchdogs_start_ends_the_job_within_the_stall_timeout(tmp_path):
    """The watchdog's own start is collective, and nothing watched it: rank 0 waited there for
    ever for a rank stopped as training began (seen with SIGSTOP under MPICH)."""
    job = run_job([], python_code=LATE_WATCHDOG.format(marker=INJECTED, args=[*SMALL, "--steps", str(STEPS)],
                                                       out=str(tmp_path / "run")))
    assert job.returncode == 4 and "Traceback" not in job.stderr, job.describe()
    [line] = job.hpcopt_lines()
    assert line.startswith("hpcopt: stall: rank 0 has waited 2 s (--stall-timeout) for the other ranks to "
                           "start the stall watchdog"), job.describe()
    assert job.after_fault is not None and job.after_fault < 2 + 4, job.describe()
