"""SIGTERM, SIGUSR1 and SIGINT through real ``mpiexec`` jobs (MPICH's Hydra forwards all three
to every rank, Open MPI's mpirun only SIGUSR1 without killing the ranks; ``kill PID`` reaches
one): the ranks stop together at a checkpoint, or the job ends at once; either way exit 143 or
130, one line, and the whole job ends within seconds, whatever moment the signal comes (set-up,
training, a checkpoint's write). docs/failures.md."""

from __future__ import annotations

import random
import re
import signal

import pytest

from hpcopt.comm.mpi_support import launcher_stop_signal
from hpcopt.io import pipeline_checkpoint as pipe_ckpt
from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from hpcopt.run.signals import GRACE_SECONDS, exit_code
from tests.faults.jobs import INJECTED, Job, Send, assert_same_run, run_job
from tests.launcher import FORWARDS_TERM_AND_INT

JOB = ["train", "--dataset", "digits", "--hidden", "16", "--progress", "true",
       "--keep-checkpoints", "1000", "--steps", "10000000"]  # ended by the signal, never by steps
PIPELINE = ["train", "--algorithm", "pprs", "--problem", "l1_chain", "--samples", "3",
            "--smoothing", "0.05", "--progress", "true", "--steps", "10000000"]
#: Ctrl-C ends the whole job within this many seconds, checkpoint or not.
INTERRUPT_SECONDS = 5
#: SIGTERM waits for its row: these jobs' rows come every few milliseconds.
TERMINATE_SECONDS = 10
STOPPED = re.compile(r"hpcopt: (SIGTERM|SIGINT|SIGUSR1): stopped at (step|iteration) (\d+) "
                     r"after writing (\S+);")


def assert_signal_ended_the_job(job: Job, signum: int) -> re.Match | None:
    """Exit 143 or 130 within the signal's time, one line from hpcopt that names it, no
    traceback; the line's stop (None where the job ended without a checkpoint)."""
    name = signal.Signals(signum).name
    assert job.returncode == exit_code(signum), job.describe()
    lines = job.hpcopt_lines()
    assert len(lines) == 1 and name in lines[0], job.describe()
    assert "Traceback" not in job.stdout + job.stderr, job.describe()
    limit = INTERRUPT_SECONDS if signum == signal.SIGINT else TERMINATE_SECONDS
    assert job.after_fault is not None and job.after_fault < limit, (job.after_fault, job.describe())
    return STOPPED.match(lines[0])


def assert_stopped_at_a_checkpoint(job: Job, signum: int, every: int, out) -> int:
    """The job stopped with a checkpoint at a tick that ``every`` divides; that tick."""
    stop = assert_signal_ended_the_job(job, signum)
    assert stop is not None, job.describe()
    tick = int(stop.group(3))
    assert tick % every == 0 and stop.group(4).endswith(f"step-{tick:09d}.h5"), job.describe()
    assert read_checkpoint(out).tick == tick
    return tick


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGTERM, marks=FORWARDS_TERM_AND_INT),
                                    pytest.param(signal.SIGINT, marks=FORWARDS_TERM_AND_INT),
                                    signal.SIGUSR1], ids=["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_signal_to_mpiexec_stops_at_a_checkpoint_when_every_row_is_one(ranks, signum, tmp_path):
    """--checkpoint-every 8 with the default --trace-every 8: the issue's case (it ran to the
    end and exited 0)."""
    out = tmp_path / "run"
    job = run_job([*JOB, "--checkpoint-every", "8", "--out", str(out)], ranks,
                  send=Send(signum, 0.5))
    assert_stopped_at_a_checkpoint(job, signum, 8, out)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_one_rank_stops_every_rank_at_a_checkpoint(ranks, signum, tmp_path):
    """--checkpoint-every 1: rows are finished at once, and most of the time goes into
    writing checkpoints, so the signal mostly lands in one's write."""
    out = tmp_path / "run"
    job = run_job([*JOB, "--checkpoint-every", "1", "--trace-every", "4", "--out", str(out)],
                  ranks, send=Send(signum, 0.5, rank=ranks - 1))
    assert_stopped_at_a_checkpoint(job, signum, 4, out)


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=FORWARDS_TERM_AND_INT),
                                    signal.SIGUSR1], ids=["Ctrl-C", "SIGUSR1"])
def test_a_stop_from_the_launcher_resumes_bitwise(signum, tmp_path):
    out, reference = tmp_path / "run", tmp_path / "reference"
    flags = ["--checkpoint-every", "4", "--trace-every", "4"]
    job = run_job([*JOB, *flags, "--out", str(out)], send=Send(signum, 0.5))
    tick = assert_stopped_at_a_checkpoint(job, signum, 4, out)
    resumed = run_job(["resume", str(out), "--steps", str(tick + 6)])
    assert resumed.returncode == 0, resumed.describe()
    whole = run_job([*JOB, *flags, "--steps", str(tick + 6), "--out", str(reference)])
    assert whole.returncode == 0, whole.describe()
    assert_same_run(out, reference)


def test_ctrl_c_in_a_checkpoints_write_stops_at_the_next_row(tmp_path):
    """Rank 0 gets SIGINT in the middle of writing the checkpoint of step 16: the write ends,
    and every rank stops at the row after it (24), timed from the fault's announcement."""
    out = tmp_path / "run"
    job = run_job([*JOB, "--checkpoint-every", "8", "--debug-fail-at", "0:16:checkpoint-sigint",
                   "--out", str(out)])
    assert assert_stopped_at_a_checkpoint(job, signal.SIGINT, 8, out) == 24


@pytest.mark.parametrize("ranks,rank", [pytest.param(2, None, marks=FORWARDS_TERM_AND_INT),
                                        pytest.param(4, None, marks=FORWARDS_TERM_AND_INT), (4, 3)],
                         ids=["2 ranks", "4 ranks", "rank 3 of 4"])
def test_ctrl_c_without_a_row_in_reach_aborts_within_seconds(ranks, rank, tmp_path):
    """No trace row within the grace: the job ends without a new checkpoint (a rank other than
    0 waits its stagger too: the slowest case)."""
    job = run_job([*JOB, "--trace-every", "100000000", "--out", str(tmp_path / "run")], ranks,
                  send=Send(signal.SIGINT, 0.5, rank))
    assert assert_signal_ended_the_job(job, signal.SIGINT) is None
    assert f"no checkpoint agreed within {GRACE_SECONDS:g} s" in job.hpcopt_lines()[0]
    assert job.after_fault > GRACE_SECONDS


@pytest.mark.parametrize("signum,rank", [pytest.param(signal.SIGINT, None, marks=FORWARDS_TERM_AND_INT),
                                         (signal.SIGUSR1, None), (signal.SIGTERM, 1)],
                         ids=["SIGINT to mpiexec", "SIGUSR1 to mpiexec", "SIGTERM to rank 1"])
def test_a_signal_during_set_up_ends_the_job_at_once(signum, rank, tmp_path):
    """As soon as hpcopt handles signals, before MPI has started on every rank."""
    job = run_job([*JOB, "--out", str(tmp_path / "run")], send=Send(signum, 0.0, rank, "start"))
    assert assert_signal_ended_the_job(job, signum) is None
    assert f"on rank {rank or 0}: outside the training loop" in job.hpcopt_lines()[0]


@pytest.mark.parametrize("signum,rank", [(signal.SIGTERM, None), (signal.SIGINT, 1)],
                         ids=["SIGTERM to mpiexec", "SIGINT to stage 1"])
def test_a_pipeline_stops_at_a_checkpoint(signum, rank, tmp_path):
    out = tmp_path / "run"
    signum = launcher_stop_signal(signum) if rank is None else signum
    job = run_job([*PIPELINE, "--checkpoint-every", "2", "--trace-every", "2", "--out", str(out)],
                  send=Send(signum, 0.5, rank))
    stop = assert_signal_ended_the_job(job, signum)
    assert stop is not None and stop.group(2) == "iteration", job.describe()
    assert int(stop.group(3)) % 2 == 0 and pipe_ckpt.read(out, 2).tick == int(stop.group(3))


@pytest.mark.parametrize("seed", range(4))
def test_a_signal_at_a_random_moment_ends_the_job_with_one_line(seed, tmp_path):
    """Any moment from start-up on, to mpiexec or to one rank, at 2 and 4 ranks."""
    rng = random.Random(seed)
    ranks = (2, 4)[seed % 2]
    signum = (signal.SIGINT, signal.SIGTERM)[seed // 2]
    rank = rng.choice([None, rng.randrange(ranks)])
    signum = launcher_stop_signal(signum) if rank is None else signum
    send = Send(signum, rng.uniform(0.0, 3.0), rank, "start")
    flags = ["--checkpoint-every", str(rng.choice([0, 1, 4, 8])),
             "--trace-every", str(rng.choice([1, 4, 8]))]
    out = tmp_path / "run"
    job = run_job([*JOB, *flags, "--out", str(out)], ranks, send=send)
    stop = assert_signal_ended_the_job(job, signum)
    if stop is not None:
        assert read_checkpoint(out).tick == int(stop.group(3))


#: Put on the ranks' module path (as ``sitecustomize``, imported by Python's start-up, before
#: ``-m hpcopt``): rank ``RANK`` (MPICH's PMI_RANK, Open MPI's OMPI_COMM_WORLD_RANK) sends itself
#: ``SIGNUM`` just as it starts importing ``MODULE``.
SIGNAL_AT_IMPORT = """
import os, signal, sys

class SignalAtImport:
    def find_spec(self, name, path=None, target=None):
        rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
        if name == {module!r} and rank == "{rank}":
            sys.meta_path.remove(self)
            sys.stderr.write("{marker} {signum} at the import of " + name + "\\n")
            sys.stderr.flush()
            os.kill(os.getpid(), {signum})
        return None

sys.meta_path.insert(0, SignalAtImport())
"""


@pytest.mark.parametrize("module", ["hpcopt.run.signals", "numpy", "mpi4py.MPI"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_in_a_ranks_first_moments_ends_the_job_with_one_line(module, signum, tmp_path):
    """From hpcopt's first line on, before its imports (numpy, mpi4py with MPI_Init): once,
    SIGTERM there killed the rank (exit 15, no line) and SIGINT gave KeyboardInterrupt
    tracebacks (exit 1)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SIGNAL_AT_IMPORT.format(
        module=module, rank=1, signum=int(signum), marker=INJECTED))
    job = run_job([*JOB, "--out", str(tmp_path / "run")], path=(hook,))
    assert INJECTED in job.stderr, job.describe()
    assert assert_signal_ended_the_job(job, signum) is None
    assert "on rank 1: outside the training loop" in job.hpcopt_lines()[0]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_second_ctrl_c_as_the_job_ends_keeps_exit_130(rank, tmp_path):
    """A launcher that forwards every Ctrl-C (srun; ``kill -INT`` of a rank): the second comes
    as the ranks end, after the stop's line. Python's shutdown gives SIGINT its default action
    back, so it once ended the rank by SIGINT (exit 2 or 255 from mpiexec); MPICH's own
    ``mpiexec`` answers a second Ctrl-C to itself by killing every rank (255)."""
    job = run_job([*JOB, "--checkpoint-every", "4", "--trace-every", "4", "--out", str(tmp_path / "run")],
                  send=Send(signal.SIGINT, 0.5, rank, again_at="hpcopt: SIGINT: stopped"))
    assert_stopped_at_a_checkpoint(job, signal.SIGINT, 4, tmp_path / "run")
