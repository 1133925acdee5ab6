"""``--on-rank-loss continue``: a rank killed (``kill -9``) mid-round at 4 ranks, the survivors
finish at 3 with the result of a 3-rank run started from the round they went back to; the
exit code and the trace's ``/rank_losses`` say so. Needs Open MPI's ULFM (``mpirun --with-ft
ulfm``); elsewhere the option is refused in one line (docs/failures.md)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpcopt.errors import EXIT_CONTINUED
from tests.faults.jobs import SMALL, run_job
from tests.faults.moments import MOMENTS, expected
from tests.faults.moments import code as moment_code
from tests.launcher import OPEN_MPI
from tests.timeouts import scaled

ULFM = OPEN_MPI and hasattr(MPI.Comm, "Shrink")
needs_ulfm = pytest.mark.skipif(not ULFM, reason="a rank's loss is survived only under Open MPI's "
                                "ULFM (mpirun --with-ft ulfm); this MPI refuses --on-rank-loss continue")
LOST, KILLED_AT, ROUND = 2, 14, 12  # rank 2 dies in step 14: the survivors go back to step 12
#: 4 ranks x 32 steps, a round every 4 steps and a checkpoint at each (the reference's start)
ARGS = ["train", *SMALL, "--steps", "32", "--checkpoint-every", "4"]

#: A 3-rank resume of the 4-rank run's checkpoint of the round, without the lost rank: its
#: per-rank rows dropped (a mid-round model averaged over the survivors), then carried over as
#: ``resume --ranks-changed`` carries a checkpoint (a streaming run's idle in_flight reset).
REFERENCE = """
import sys

import numpy as np
from hpcopt.cli import main
from hpcopt.run import data_parallel

lost, carry = {lost}, data_parallel.rescaled

def survivors(ckpt, size, rank, state, sampler, to_host, in_flight):
    keep = [r for r in range(ckpt.world_size) if r != lost]
    rows = {{name: values[keep] for name, values in ckpt.rows.items()}}
    if "x" in rows:
        ckpt.model = rows["x"].mean(axis=0, dtype=np.float64).astype(rows["x"].dtype)
    ckpt.rows, ckpt.world_size, ckpt.ranks = rows, len(keep), tuple(range(len(keep)))
    ckpt.counters = {{n: v[keep] for n, v in ckpt.counters.items()}}
    ckpt.scalars = {{n: v[keep] for n, v in ckpt.scalars.items()}}
    ckpt.sampler, ckpt.window = ckpt.sampler[keep], ckpt.window[keep]
    return carry(ckpt, size, rank, state, sampler, to_host, in_flight=in_flight)

data_parallel.rescaled = survivors
sys.exit(main({argv!r}))
"""

ALGORITHMS = {
    "prsgd": ["--algorithm", "prsgd"],
    "celgc": ["--algorithm", "celgc"],
    "diloco": ["--algorithm", "diloco"],
    "streaming_diloco": ["--algorithm", "diloco", "--fragments", "2"],
}


def _model(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f["model/flat"][()]


@needs_ulfm
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_a_killed_rank_is_survived_with_the_result_of_a_3_rank_run_from_the_round(
        tmp_path: Path, algorithm: str) -> None:
    run, reference = tmp_path / "run", tmp_path / "reference"
    job = run_job([*ARGS, *ALGORITHMS[algorithm], "--out", str(run), "--on-rank-loss", "continue",
                   "--debug-fail-at", f"{LOST}:{KILLED_AT}:kill"], ranks=4,
                  mpiexec_args=("--with-ft", "ulfm"))
    assert job.returncode == EXIT_CONTINUED, job.describe()
    assert f"rank {LOST} lost at step" in job.stdout and f"going on at 3 ranks from step {ROUND}" in job.stdout
    with h5py.File(run / "trace.h5", "r") as f:
        losses = {name: f["rank_losses"][name][()] for name in ("step", "rank", "recover_seconds", "round_step")}
        steps = f["rows"]["step"]
    assert losses["rank"].tolist() == [LOST] and losses["rank"].dtype == np.int64
    assert KILLED_AT <= losses["step"][0] <= KILLED_AT + 2 and losses["step"].dtype == np.int64
    assert 0 < losses["recover_seconds"][0] < 30 and losses["recover_seconds"].dtype == np.float64
    assert losses["round_step"].tolist() == [ROUND]  # the step of the round the survivors went on from
    assert steps.tolist() == list(range(4, 33, 4))  # the rows after the round were written once
    ckpt = run / "checkpoints" / f"step-{ROUND:09d}.h5"
    argv = ["resume", str(ckpt), "--ranks-changed", "--on-rank-loss", "abort", "--out", str(reference)]
    again = run_job([], ranks=3, python_code=REFERENCE.format(lost=LOST, argv=argv))
    assert again.returncode == 0, again.describe()
    last = f"checkpoints/step-{32:09d}.h5"
    np.testing.assert_array_equal(_model(run / last), _model(reference / last))


def test_continue_is_refused_in_one_line_without_ulfm(tmp_path: Path) -> None:
    """Under MPICH, or Open MPI launched without --with-ft ulfm: exit 2 before the first step."""
    job = run_job([*ARGS, "--out", str(tmp_path / "run"), "--on-rank-loss", "continue"], ranks=2)
    assert job.returncode == 2, job.describe()
    lines = job.hpcopt_lines()
    assert len(lines) == 1 and lines[0].startswith("hpcopt: error: --on-rank-loss continue: "), lines
    assert ("MPICH" in lines[0] or "mpirun --with-ft ulfm" in lines[0]), lines


@needs_ulfm
def test_a_scheduled_fault_is_survived_once_and_collect_counts_the_steps_since_the_round(
        tmp_path: Path) -> None:
    """``--fault`` with continue needs no checkpoint before it, fires once (the rebuilt run has no
    fault plan) and collect's steps_lost is ``step - round_step`` of ``/rank_losses``; the wall
    clock (the rows', the summary's, collect's ``wall_seconds``) runs from the job's start through
    the recovery, not from the rebuild; collect's note says at how many ranks it finished."""
    from hpcopt.study import collect
    from hpcopt.study.recovery import recovery

    run = tmp_path / "run"
    job = run_job([*ARGS, "--steps", "16", "--checkpoint-every", "0", "--out", str(run),
                   "--on-rank-loss", "continue", "--fault", f"{LOST}:6"], ranks=4,
                  mpiexec_args=("--with-ft", "ulfm"))
    assert job.returncode == EXIT_CONTINUED, job.describe()
    assert (job.stdout + job.stderr).count("--fault: killing rank") == 1, job.describe()
    with h5py.File(run / "trace.h5", "r") as f:
        step, round_step = int(f["rank_losses/step"][0]), int(f["rank_losses/round_step"][0])
        recover_seconds = float(f["rank_losses/recover_seconds"][0])
        steps, walls = f["rows"]["step"], f["rows"]["wall"]
        assert steps[-1] == 16  # the run finished, at 3 ranks
    assert round_step == 4 and step > round_step  # the round before the kill at step 6
    found = recovery(run, run / "trace.h5")
    assert found is not None and found.losses == 1 and found.steps_lost == step - round_step
    assert found.seconds is not None and 0 < found.seconds < 30
    [row] = collect.columns(collect.gather([run]), tmp_path)
    assert row["state"] == "finished" and row["note"] == f"finished at 3 of 4 ranks after losing rank {LOST}"
    at_round = walls[steps.tolist().index(round_step)]  # the last row before the loss
    after = walls[steps > round_step]  # written by the survivors' rebuilt run
    assert after.size and after[0] >= at_round + recover_seconds, (walls, recover_seconds)
    assert (np.diff(walls) >= 0).all() and row["wall_seconds"] >= walls[-1]
    assert row["wall_seconds"] < job.seconds  # the job's launch to exit holds it


SWEEP = """\
[job]
name = "c"
[train]
dataset = "digits"
hidden = [16]
steps = 16
interval = 4
trace_every = 4
progress = false
on_rank_loss = "continue"
[sweep]
ranks = [4]
fault = ["2:6"]
"""


@needs_ulfm
def test_sweep_local_runs_a_continuing_task_under_ulfm_and_counts_its_survivors_finished(
        tmp_path: Path) -> None:
    """A study's task with ``on_rank_loss = "continue"``: ``sweep --local`` launches it with
    ``--with-ft ulfm`` (task.py adds it to Open MPI's mpiexec), the survivors' exit 5 is a
    finished task (sweep exits 0) and collect's row is finished at 3 of 4 ranks."""
    import csv
    import subprocess
    import sys

    from tests.faults.test_study import environment, hpcopt
    from tests.timeouts import scaled

    (tmp_path / "study.toml").write_text(SWEEP)
    done = subprocess.run([sys.executable, "-m", "hpcopt", "sweep", "study.toml", "--out", ".", "--local"],
                          cwd=tmp_path, env=environment(), capture_output=True, text=True,
                          timeout=scaled(300))
    log = (tmp_path / "logs" / "task-0.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr + log
    assert "task 0 ended (exit 5: finished on the survivors of a lost rank)" in done.stdout, done.stdout
    assert "all 1 task(s) finished in" in done.stdout, done.stdout
    assert "mpiexec --with-ft ulfm -n 4 " in log and "going on at 3 ranks" in log, log
    hpcopt("collect", ".", cwd=tmp_path)
    with open(tmp_path / "study.csv", newline="") as handle:
        [row] = list(csv.DictReader(handle))
    assert row["state"] == "finished" and row["steps"] == "16", row
    assert row["note"] == f"finished at 3 of 4 ranks after losing rank {LOST}", row
    assert row["rank_losses"] == "1", row


#: Run ``hpcopt.cli.main(argv)`` after ``patch`` (code that changes hpcopt on some ranks).
PATCHED = """
import sys
import time

from mpi4py import MPI
from hpcopt.cli import main

{patch}
sys.exit(main({argv!r}))
"""
#: The job's rank 1 takes SLOW seconds longer to rebuild the run on the survivors.
SLOW = 3.0
SLOW_RECOVERY = f"""
from hpcopt.run import rank_loss

rebuilt = rank_loss._rebuilt

def slow(*args):
    if MPI.COMM_WORLD.Get_rank() == 1:
        time.sleep({SLOW})
    return rebuilt(*args)

rank_loss._rebuilt = slow
"""
#: The job's rank 3 hangs at the start of its step 26 (after the loss of rank 2 and its recovery).
HANG_AT_26 = """
from hpcopt.run import fault_schedule

wrap = fault_schedule.Schedule.wrap

def hanging(self, oracle, steps_done):
    inner = wrap(self, oracle, steps_done)

    def step(x, grad):
        while MPI.COMM_WORLD.Get_rank() == 3 and steps_done() + 1 == 26:
            time.sleep(60)
        return inner(x, grad)
    return step

fault_schedule.Schedule.wrap = hanging
"""


def _continued(run: Path, *options: str) -> list[str]:
    """The argv of a continued job of ARGS into ``run`` with rank 2 killed in step 14."""
    return [*ARGS, "--out", str(run), "--on-rank-loss", "continue",
            "--debug-fail-at", f"{LOST}:{KILLED_AT}:kill", *options]


def _losses(run: Path) -> dict[str, list]:
    with h5py.File(run / "trace.h5", "r") as f:
        return {name: f["rank_losses"][name][()].tolist() for name in ("step", "rank", "round_step")}


@needs_ulfm
def test_a_second_lost_rank_is_survived_with_the_result_of_a_2_rank_run_from_its_round(
        tmp_path: Path) -> None:
    """Rank 2 killed in step 14 (back to round 12 at 3 ranks), then the job's rank 3 by
    ``--fault 3:26`` (the rank as the job started: the survivors' rank 2; back to round 24 at 2
    ranks): both rows in ``/rank_losses``, and the final model bitwise that of a 2-rank resume
    of the 3-rank run's step-24 checkpoint without its last rank (the job's rank 3)."""
    run, reference = tmp_path / "run", tmp_path / "reference"
    job = run_job(_continued(run, "--fault", "3:26"), ranks=4, mpiexec_args=("--with-ft", "ulfm"))
    assert job.returncode == EXIT_CONTINUED, job.describe()
    assert "going on at 3 ranks from step 12" in job.stdout, job.describe()
    assert "rank 3 lost at step" in job.stdout and "going on at 2 ranks from step 24" in job.stdout, \
        job.describe()
    losses = _losses(run)
    assert losses["rank"] == [LOST, 3] and losses["round_step"] == [ROUND, 24], losses
    assert KILLED_AT <= losses["step"][0] <= KILLED_AT + 2 and 26 <= losses["step"][1] <= 28, losses
    with h5py.File(run / "trace.h5", "r") as f:
        assert f["rows"]["step"].tolist() == list(range(4, 33, 4))
    ckpt = run / "checkpoints" / f"step-{24:09d}.h5"
    argv = ["resume", str(ckpt), "--ranks-changed", "--on-rank-loss", "abort", "--fault", "",
            "--out", str(reference)]
    again = run_job([], ranks=2, python_code=REFERENCE.format(lost=2, argv=argv))
    assert again.returncode == 0, again.describe()
    last = f"checkpoints/step-{32:09d}.h5"
    np.testing.assert_array_equal(_model(run / last), _model(reference / last))


@needs_ulfm
def test_the_stall_watchdog_waits_out_a_recovery_and_the_timeline_keeps_the_job_ranks(
        tmp_path: Path) -> None:
    """``--stall-timeout 1`` while the survivors' recovery takes over SLOW seconds (rank 1 is
    slow to rebuild): no stall is reported, the job finishes (exit 5); ``--timeline``'s spans
    keep each rank's number as the job started: the lost rank's end before its loss, the job's
    rank 3 (the survivors' rank 2) goes on to the end."""
    from hpcopt.io.timeline import read_timeline

    run = tmp_path / "run"
    argv = _continued(run, "--stall-timeout", "1", "--timeline", "true")
    job = run_job([], ranks=4, python_code=PATCHED.format(patch=SLOW_RECOVERY, argv=argv),
                  mpiexec_args=("--with-ft", "ulfm"))
    assert job.returncode == EXIT_CONTINUED, job.describe()
    assert "hpcopt: stall" not in job.stdout + job.stderr, job.describe()  # (the path says "stall")
    with h5py.File(run / "trace.h5", "r") as f:
        assert f["rank_losses/recover_seconds"][0] > SLOW > 1
    timeline = read_timeline(run / "trace.h5")
    assert timeline is not None and timeline.ranks == 4 and timeline.dropped == [0] * 4
    spans = timeline.spans
    last_step = {rank: int(spans["step"][spans["rank"] == rank].max()) for rank in range(4)}
    assert last_step[LOST] <= KILLED_AT and all(last_step[r] == 32 for r in (0, 1, 3)), last_step


@needs_ulfm
def test_a_stall_after_a_loss_is_reported_with_the_job_ranks(tmp_path: Path) -> None:
    """The watchdog started again on the survivors still ends a real stall (exit 4): the job's
    rank 3 hangs after rank 2's loss, and the report names it rank 3 (not the survivors' 2)."""
    from hpcopt.run.watchdog import EXIT_CODE

    argv = _continued(tmp_path / "run", "--stall-timeout", "1")
    job = run_job([], ranks=4, python_code=PATCHED.format(patch=HANG_AT_26, argv=argv),
                  mpiexec_args=("--with-ft", "ulfm"))
    assert job.returncode == EXIT_CODE, job.describe()
    assert "going on at 3 ranks from step 12" in job.stdout, job.describe()
    report = job.stdout + job.stderr
    assert "not arrived: rank 3\n" in report and "  rank 3: busy outside communication" in report, \
        job.describe()
    assert f"  rank {LOST}: " not in report, job.describe()


@needs_ulfm
def test_averaging_auto_is_plain_mpi_under_continue(tmp_path: Path) -> None:
    """A model above the shared-memory crossover (128 KB): ``--averaging auto`` averages it in
    shared memory, and under ``--on-rank-loss continue`` by plain MPI (the trace's
    ``averaging``)."""
    big = [*ARGS, "--hidden", "512", "--steps", "8", "--averaging", "auto"]
    paths = {}
    for mode in ("abort", "continue"):
        run = paths[mode] = tmp_path / mode
        job = run_job([*big, "--out", str(run), "--on-rank-loss", mode], ranks=2,
                      mpiexec_args=("--with-ft", "ulfm"))
        assert job.returncode == 0, job.describe()
    averaging = {}
    for mode, run in paths.items():
        with h5py.File(run / "trace.h5", "r") as f:
            averaging[mode] = f.attrs["averaging"]
    assert averaging == {"abort": "shm", "continue": "mpi"}


#: Every step takes 10 ms longer (it changes no number): a few rows pass in one period of
#: ``--checkpoint-minutes 0.0005`` (30 ms).
SLOW_STEPS = """
from hpcopt.run import data_parallel

step = data_parallel.DataParallelSession.step

def slow(self):
    time.sleep(0.01)
    return step(self)

data_parallel.DataParallelSession.step = slow
"""


@needs_ulfm
def test_checkpoints_by_wall_time_go_on_after_a_lost_rank(tmp_path: Path) -> None:
    """``--checkpoint-minutes`` under continue: the survivors' rank 0 asks on (in the rows of
    the survivors' communicator), so checkpoints by wall time are written after the loss too,
    and the job finishes on the survivors."""
    from hpcopt.io import data_parallel_checkpoint as ckpt_io
    from hpcopt.run.directory import checkpoints

    run = tmp_path / "run"
    argv = _continued(run, "--checkpoint-every", "0", "--checkpoint-minutes", "0.0005",
                      "--keep-checkpoints", "100")
    job = run_job([], ranks=4, python_code=PATCHED.format(patch=SLOW_STEPS, argv=argv),
                  mpiexec_args=("--with-ft", "ulfm"))
    assert job.returncode == EXIT_CONTINUED, job.describe()
    assert f"going on at 3 ranks from step {ROUND}" in job.stdout, job.describe()
    ticks = [int(ckpt_io.NAME_PATTERN.match(p.name).group(1)) for p in checkpoints(run)]
    assert ticks[-1] == 32 and len([t for t in ticks if KILLED_AT + 2 < t < 32]) >= 2, ticks


#: The stall timeout of the moments' jobs: what ends a rank lost in a way MPI does not report.
STALL = 2
#: (moment, rank) the suite loses: rank 1 at every moment, rank 0 where the survivors would
#: otherwise go on (benchmarks/faults/rank_loss_moments.py loses every rank at every moment).
CASES = [(name, 1) for name in MOMENTS] + [("step", 0), ("checkpoint", 0), ("end", 0)]


@needs_ulfm
@pytest.mark.parametrize(("name", "rank"), CASES, ids=[f"{n}-rank{r}" for n, r in CASES])
def test_a_rank_lost_at_any_moment_is_survived_or_ends_every_survivor_in_one_line(
        tmp_path: Path, name: str, rank: int) -> None:
    """3 ranks, ``--stall-timeout 2``: rank ``rank`` lost at ``name`` (tests/faults/moments.py).
    Where the survivors can go on (a rank other than 0, in training up to the summary) they
    finish at 2 ranks (exit 5, the run's 32 steps in the trace); everywhere else (set-up, rank 0,
    after the summary, a loss MPI does not report) the job ends within seconds with one line,
    from the lowest survivor, and exit 6 (1 where the lost rank exited 1: mpirun reports the
    first non-zero status), and no traceback."""
    import signal

    from hpcopt.run.mpi_start import LINGER_SECONDS, MIN_SECONDS
    from tests.faults.jobs import Send

    moment, run = MOMENTS[name], tmp_path / "run"
    argv = ["train", *SMALL, "--steps", "32", "--out", str(run), "--on-rank-loss", "continue",
            "--stall-timeout", str(STALL)]
    if moment.call:
        job = run_job([], ranks=3, python_code=moment_code(moment, rank, argv),
                      mpiexec_args=("--with-ft", "ulfm"))
    else:  # while MPI starts: from outside, as the job's processes appear
        job = run_job(argv, ranks=3, send=Send(signal.SIGKILL, 0.3, rank, "exec"),
                      mpiexec_args=("--with-ft", "ulfm"))
    code = expected(moment, rank)
    assert job.returncode in ((code, 1) if moment.how == "exit" else (code,)), job.describe()
    assert "Traceback" not in job.stderr, job.describe()
    assert job.after_fault is not None and job.after_fault < scaled(2 * (MIN_SECONDS + LINGER_SECONDS)), \
        job.describe()
    lines = job.hpcopt_lines()
    if code == EXIT_CONTINUED:
        assert len(lines) == 1 and f"rank {rank} lost at step" in lines[0], job.describe()
        assert "going on at 2 ranks" in lines[0], job.describe()
        with h5py.File(run / "trace.h5", "r") as f:
            assert f["rows"]["step"][-1] == 32 and f["rank_losses"]["rank"][()].tolist() == [rank]
    else:
        assert len(lines) == 1 and lines[0].startswith("hpcopt: error: "), job.describe()
        assert "the survivors cannot go on" in lines[0] or "rank 0 holds the run directory" in lines[0], \
            job.describe()
        assert moment.how == "stop" or not moment.call or f"rank {rank} " in lines[0], job.describe()
    if rank == 0 and name == "step":  # the lowest survivor removed the lost rank 0's lock
        assert not (run / "hpcopt.lock").exists()
