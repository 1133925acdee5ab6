"""SIGTERM, SIGUSR1 and SIGINT through real ``mpiexec`` jobs (MPICH's Hydra forwards all three
to every rank, Open MPI's mpirun only SIGUSR1 without killing the ranks; ``kill PID`` reaches
one): the ranks stop together at a checkpoint, or the job ends at once; either way exit 143 or
130, one line, and the whole job ends within seconds, whatever moment the signal comes (set-up,
training, a checkpoint's write). docs/failures.md."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from hpcopt.comm.mpi_support import launcher_stop_signal
from hpcopt.io import pipeline_checkpoint as pipe_ckpt
from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from hpcopt.io.trace import read_trace
from hpcopt.run.lock import FILE_NAME as LOCK
from hpcopt.run.signals import GRACE_SECONDS, exit_code
from tests.faults.jobs import HARD_TIMEOUT, INJECTED, ROOT, Job, Send, _kill_tree, assert_same_run, run_job
from tests.launcher import FORWARDS_TERM_AND_INT, OPEN_MPI

JOB = ["train", "--dataset", "digits", "--hidden", "16", "--progress", "true",
       "--keep-checkpoints", "1000", "--steps", "10000000"]  # ended by the signal, never by steps
PIPELINE = ["train", "--algorithm", "pprs", "--problem", "l1_chain", "--samples", "3",
            "--smoothing", "0.05", "--progress", "true", "--steps", "10000000"]
#: Ctrl-C ends the whole job within this many seconds, checkpoint or not.
INTERRUPT_SECONDS = 5
#: SIGTERM waits for its row: these jobs' rows come every few milliseconds.
TERMINATE_SECONDS = 10
#: Marks for what one launcher does and the other does not (docs/failures.md, "Launchers").
ONLY_OPEN_MPI = pytest.mark.skipif(not OPEN_MPI, reason="Open MPI's mpirun: the stop signal it "
                                   "forwards (SIGUSR1) and its return while ranks still exit")
ONLY_HYDRA = pytest.mark.skipif(OPEN_MPI, reason="MPICH's Hydra mpiexec: a second Ctrl-C to it "
                                "(Open MPI's mpirun kills the ranks at the first)")
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
#: ``SIGNUM`` just as it starts importing ``MODULE``, whose import then takes ``PAUSE`` seconds
#: more (a loaded machine's).
SIGNAL_AT_IMPORT = """
import os, signal, sys, time

class SignalAtImport:
    def find_spec(self, name, path=None, target=None):
        rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
        if name == {module!r} and rank == "{rank}":
            sys.meta_path.remove(self)
            sys.stderr.write("{marker} {signum} at the import of " + name + "\\n")
            sys.stderr.flush()
            os.kill(os.getpid(), {signum})
            time.sleep({pause})
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
        module=module, rank=1, signum=int(signum), marker=INJECTED, pause=0))
    job = run_job([*JOB, "--out", str(tmp_path / "run")], path=(hook,))
    assert INJECTED in job.stderr, job.describe()
    assert assert_signal_ended_the_job(job, signum) is None
    assert "on rank 1: outside the training loop" in job.hpcopt_lines()[0]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1],
                         ids=["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_signal_to_a_rank_slower_to_start_than_the_grace_ends_it_by_the_signal_named(signum, tmp_path):
    """A rank whose start-up outlasts ``GRACE_SECONDS`` after the signal (imports slowed by the
    load) cannot MPI_Abort: it ends by the signal its line's exit code names, so Open MPI's
    ``mpirun`` exits that code (MPICH's Hydra: that signal | 9). It once ended by SIGKILL after
    its line said 143 (137: a requeue-on-143 script dropped the run)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SIGNAL_AT_IMPORT.format(
        module="numpy", rank=0, signum=int(signum), marker=INJECTED, pause=GRACE_SECONDS + 3))
    job = run_job([*JOB, "--out", str(tmp_path / "run")], path=(hook,))
    died_by = exit_code(signum) - 128
    assert job.returncode == (128 + died_by if OPEN_MPI else died_by | signal.SIGKILL), job.describe()
    lines = job.hpcopt_lines()
    assert len(lines) == 1 and f"{signal.Signals(signum).name} on rank 0: outside the training loop" \
        in lines[0] and f"(exit code {exit_code(signum)})" in lines[0], job.describe()
    assert "Traceback" not in job.stdout + job.stderr, job.describe()
    assert job.after_fault is not None and job.after_fault < GRACE_SECONDS + TERMINATE_SECONDS, job.describe()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rank", [0, 1])
def test_a_second_ctrl_c_as_the_job_ends_keeps_exit_130(rank, tmp_path):
    """A launcher that forwards every Ctrl-C (srun; ``kill -INT`` of a rank): the second comes
    as the ranks end, after the stop's line. Python's shutdown gives SIGINT its default action
    back, so it once ended the rank by SIGINT (exit 2 or 255 from mpiexec); MPICH's own
    ``mpiexec`` answers a second Ctrl-C to itself by killing every rank (255)."""
    job = run_job([*JOB, "--checkpoint-every", "4", "--trace-every", "4", "--out", str(tmp_path / "run")],
                  send=Send(signal.SIGINT, 0.5, rank, again_at="hpcopt: SIGINT: stopped"))
    assert_stopped_at_a_checkpoint(job, signal.SIGINT, 4, tmp_path / "run")



@ONLY_HYDRA
def test_a_double_ctrl_c_to_mpiexec_leaves_a_trace_without_an_end_of_run_record(tmp_path):
    """Hydra forwards the first Ctrl-C and answers the second by killing the ranks itself: its
    exit code is then its own (255, now and then 0: the ranks' codes never reach it), so what
    says a run finished is the trace's end-of-run record, which the stopped run never writes;
    its newest checkpoint resumes."""
    out = tmp_path / "run"
    job = run_job([*JOB, "--checkpoint-every", "8", "--out", str(out)],
                  send=Send(signal.SIGINT, 0.5, again_at="[mpiexec@"))
    assert job.after_fault is not None and job.after_fault < INTERRUPT_SECONDS, job.describe()
    assert "Traceback" not in job.stdout + job.stderr, job.describe()
    assert read_trace(out / "trace.h5").summary is None, job.describe()
    tick = read_checkpoint(out).tick  # its lock, if the kill left it, is taken over
    resumed = run_job(["resume", str(out), "--steps", str(tick + 8)])
    assert resumed.returncode == 0 and read_trace(out / "trace.h5").summary is not None, resumed.describe()


#: Rank 0 sends itself SIGTERM once it holds the run directory's lock, before the training
#: loop: the job ends at once, and the lock must not outlive it.
SIGNAL_AFTER_CLAIM = """
import os, signal, sys, time
import hpcopt.run.runner as runner
claim = runner.claim

def claimed(*args, **kwargs):
    lock = claim(*args, **kwargs)
    if lock is not None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    return lock

runner.claim = claimed
from hpcopt.cli import main
sys.exit(main({args!r}))
"""


def test_a_job_ended_by_a_signal_after_taking_its_lock_leaves_no_lock(tmp_path):
    """The thread that ends the job releases the lock before the launcher can return: a requeue
    started at once finds the directory free (once, MPI_Abort left it held by a dying rank)."""
    out = tmp_path / "run"
    job = run_job([], python_code=SIGNAL_AFTER_CLAIM.format(args=[*JOB, "--out", str(out)]))
    assert job.returncode == exit_code(signal.SIGTERM), job.describe()
    lines = job.hpcopt_lines()
    assert len(lines) == 1 and "SIGTERM on rank 0: outside the training loop" in lines[0], job.describe()
    assert not (out / LOCK).exists(), job.describe()


@ONLY_OPEN_MPI
@pytest.mark.parametrize("after", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_sigusr1_to_mpirun_as_it_starts_stops_before_anything_is_written(after, tmp_path):
    """Until a rank's Python reaches ``python -m hpcopt``'s first line, SIGUSR1 kills it (mpirun
    exits 138; in mpirun's own first moments, mpirun itself dies by it): nothing was written,
    which the batch script of docs/failures.md requeues as a stop. From that line on, one line
    and exit 143."""
    out = tmp_path / "run"
    job = run_job([*JOB, "--checkpoint-every", "8", "--out", str(out)],
                  send=Send(signal.SIGUSR1, after, when="launch"))
    assert "Traceback" not in job.stdout + job.stderr, job.describe()
    if job.returncode in (128 + signal.SIGUSR1, -signal.SIGUSR1):
        assert not (out / LOCK).exists() and not list(out.glob("checkpoints/*.h5")), job.describe()
    else:
        assert_signal_ended_the_job(job, signal.SIGUSR1)


def _launch(args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(["mpiexec", "-n", "2", sys.executable, "-m", "hpcopt", *args],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))


@ONLY_OPEN_MPI
def test_a_requeue_started_as_soon_as_mpirun_returns_resumes(tmp_path):
    """mpirun may return while its ranks still exit: three jobs in a row, each stopped by SIGUSR1
    after its first new checkpoint and the next resumed the moment mpirun returns, each
    continue (the lock is released before a rank exits, and a holder still exiting on this host
    is waited for)."""
    out = tmp_path / "run"
    args = [*JOB, "--checkpoint-every", "8", "--out", str(out)]
    for attempt in range(3):
        newest = max(out.glob("checkpoints/*.h5"), default=None)
        log_path = tmp_path / f"job{attempt}.log"
        with open(log_path, "w") as log:
            job = _launch(args if attempt == 0 else ["resume", str(out)], log)
            try:
                deadline = time.monotonic() + HARD_TIMEOUT
                while max(out.glob("checkpoints/*.h5"), default=None) in (None, newest):
                    assert job.poll() is None and time.monotonic() < deadline, log_path.read_text()
                    time.sleep(0.02)
                job.send_signal(signal.SIGUSR1)
                code = job.wait(timeout=HARD_TIMEOUT)
            finally:
                if job.poll() is None:
                    _kill_tree(job.pid)
        assert code == exit_code(signal.SIGUSR1), log_path.read_text()
