"""Studies end to end with real ``mpiexec`` jobs: ``hpcopt sweep``, a stand-in ``qsub`` that runs
the arrays' tasks here (tests/schedulers.py), ``hpcopt collect`` and ``hpcopt report`` on an
eight-task study that is moved before it is gathered; and the states ``collect`` tells from tasks
stopped by SIGTERM, crashed, killed with their node (as it were: interrupted) and never started,
with the stopped task resumed by running it again, and left alone once finished; a task whose
launcher started single ranks in place of one world is wrong."""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcopt.comm.mpi_support import launcher_stop_signal
from hpcopt.io.trace import read_trace
from hpcopt.run.signals import exit_code
from hpcopt.study import layout
from hpcopt.study.collect import Found, Row, collect, state, task_record
from tests.faults.jobs import ROOT, _kill_tree, _tree
from tests.timeouts import scaled

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Bytes of one average of the digits MLP with --hidden 16: (64 x 16 + 16 + 16 x 10 + 10) float32.
AVERAGE_BYTES = 4 * (64 * 16 + 16 + 16 * 10 + 10)

EIGHT = """
[job]
scheduler = "pbs"
name = "e2e"
ranks_per_node = 2
throttle = 2
[train]
dataset = "digits"
hidden = [16]
steps = 12
eval_every = 6
trace_every = 3
progress = false
[sweep]
ranks = [1, 2]
interval = [1, 3]
seed = [0, 1]
"""

#: Four 2-rank tasks slowed down (every step averages, and every counted call sleeps 20 ms), so
#: that a test can act on them while they run: at least 3.2 s of sleep each.
SLOW = """
[job]
name = "s"
[train]
dataset = "digits"
hidden = [16]
steps = 160
interval = 1
trace_every = 4
checkpoint_every = 40
network = "alpha=0.02,bandwidth=1e9"
network_delay = true
[sweep]
ranks = [2]
seed = [0, 1, 2, 3]
"""


def environment() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT=str(int(scaled(120))),
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def hpcopt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "hpcopt", *args], cwd=cwd, env=environment(),
                          capture_output=True, text=True, timeout=scaled(300))
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def qsub(study: Path, script: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.schedulers", "qsub", script], cwd=study,
                          env=environment(), capture_output=True, text=True, timeout=scaled(600))
    assert done.returncode == 0 and done.stdout.strip() == "4242[].server", done.stdout + done.stderr


def test_an_eight_task_study_end_to_end(tmp_path):
    (tmp_path / "study.toml").write_text(EIGHT)
    written = hpcopt("sweep", "study.toml", "--out", "study", cwd=tmp_path).stdout
    assert "array-n1.sh (tasks 0-3, 1 rank(s)), array-n2.sh (tasks 4-7, 2 rank(s))" in written
    for script in ("array-n1.sh", "array-n2.sh"):
        qsub(tmp_path / "study", script)
    moved = tmp_path / "elsewhere" / "study"  # every path in a study is relative to it
    moved.parent.mkdir()
    shutil.move(tmp_path / "study", moved)
    hpcopt("collect", str(moved), cwd=tmp_path)
    with open(moved / "study.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8
    assert list(rows[0])[:6] == ["run", "state", "exit_code", "ranks", "interval", "seed"]  # what differs
    for row in rows:
        assert row["state"] == "finished" and row["exit_code"] == "0", row
        assert row["steps"] == "12" and int(row["rounds"]) == 12 // int(row["interval"])
        assert int(row["bytes_average"]) == int(row["rounds"]) * AVERAGE_BYTES
        assert 0 < float(row["eval_accuracy"]) <= 1 and float(row["train_loss"]) > 0
        assert row["checkpoint"] == f"{row['run']}/checkpoints/step-000000012.h5"
        assert (moved / row["checkpoint"]).is_file()
    assert [row["run"] for row in rows][5] == "runs/e2e-n2-I1-s1"
    table = (moved / "study.md").read_text()
    assert "8 runs: 8 finished." in table and table.count("\n| runs/e2e-") == 8
    report = hpcopt("report", str(moved), "--out", str(moved / "report"), cwd=tmp_path).stdout
    assert report.count("wrote ") == 6  # steps, rounds, bytes, wall, interval and report.md
    for name in ("interval.png", "wall.png"):
        assert (moved / "report" / name).read_bytes()[:8] == PNG_SIGNATURE
    assert (moved / "report" / "report.md").read_text().count("| ranks=") == 8


def start_task(study: Path, index: int) -> subprocess.Popen:
    """Task ``index`` as its array would run it, in a session of its own (a scheduler's job)."""
    log = open(layout.log_path(study, index), "wb")
    return subprocess.Popen([sys.executable, "-m", "hpcopt.study.task", str(index), "mpiexec", "-n", "2"],
                            cwd=study, env=environment(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_until_training(study: Path, index: int, task: subprocess.Popen) -> Row:
    """Once task ``index`` trains (its first checkpoint, at step 40 of 160, is written: every
    rank is in its loop, where SIGTERM only sets the stop flag, and 2.4 s of sleep are left),
    its row with the state from its record."""
    entry = layout.read_manifest(study)[index]
    log, deadline = layout.log_path(study, index), time.monotonic() + scaled(60)
    while not (study / entry.run / "checkpoints" / "step-000000040.h5").exists():
        assert task.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    row = Row(Found(study / entry.run, study, entry))
    row.state, row.note = state(row, task_record(row.found))
    return row


def test_collect_tells_running_stopped_failed_and_not_started_and_a_stopped_task_resumes(tmp_path):
    (tmp_path / "slow.toml").write_text(SLOW)
    hpcopt("sweep", "slow.toml", "--out", "study", cwd=tmp_path)
    study = tmp_path / "study"
    manifest = (study / "manifest.tsv").read_text().splitlines()
    manifest[2] += " --debug-fail-at 1:5"  # task 1 crashes on rank 1
    (study / "manifest.tsv").write_text("\n".join(manifest) + "\n")

    task = start_task(study, 0)
    running = wait_until_training(study, 0, task)
    assert running.state == "running" and running.note.startswith("on ")
    # what the scheduler does at the time limit (told to send SIGUSR1 under Open MPI)
    os.killpg(task.pid, launcher_stop_signal(signal.SIGTERM))
    assert task.wait(timeout=scaled(60)) == 143, layout.log_path(study, 0).read_text()

    assert start_task(study, 1).wait(timeout=scaled(60)) == 1

    task = start_task(study, 2)
    wait_until_training(study, 2, task)
    _kill_tree(task.pid)  # the task and its ranks die at once, with no chance to record anything
    task.wait()

    shutil.copytree(study / "runs" / "s-n2-s2", tmp_path / "loose")  # a run outside any study
    collect([study, tmp_path / "loose"], study)
    with open(study / "study.csv", newline="") as handle:
        rows = {row["run"]: row for row in csv.DictReader(handle)}
    stopped, crashed, killed, waiting = (rows[f"runs/s-n2-s{i}"] for i in range(4))
    assert stopped["state"] == "stopped" and stopped["note"] == "exit 143 (SIGTERM)"
    assert stopped["checkpoint"].startswith("runs/s-n2-s0/checkpoints/step-")
    assert 40 < int(stopped["steps"]) < 160 and float(stopped["modelled_comm_seconds"]) > 0
    assert crashed["state"] == "failed" and crashed["note"].startswith("exit 1: [rank 1] ")
    assert "injected failure on rank 1 at step 5" in crashed["note"]
    assert killed["state"] == "interrupted" and killed["exit_code"] == ""
    assert killed["note"].startswith("its task ended without recording its exit (killed, or its node died)")
    assert (stopped["exit_code"], crashed["exit_code"]) == ("143", "1")
    assert waiting["state"] == "not started" and waiting["steps"] == "" and waiting["seed"] == "3"
    loose = rows[str(tmp_path / "loose")]
    assert loose["state"] == "incomplete" and "no task record" in loose["note"]
    assert "Traceback" not in (study / "study.md").read_text()

    # run again (a requeue), the stopped task resumes from its checkpoint and finishes
    assert start_task(study, 0).wait(timeout=scaled(120)) == 0
    assert " resume runs/s-n2-s0" in layout.log_path(study, 0).read_text()
    trace = read_trace(study / "runs" / "s-n2-s0" / "trace.h5")
    assert trace.summary is not None and trace.summary["step"] == 160 and trace.attrs["resumed_at"] != "[]"
    collect([study], study)
    assert "| runs/s-n2-s0 | finished |" in (study / "study.md").read_text()
    # and once more (a resubmitted array), the finished task is left as it is
    before = (study / "runs" / "s-n2-s0" / "trace.h5").stat().st_mtime_ns
    assert start_task(study, 0).wait(timeout=scaled(60)) == 0
    assert "has finished; nothing to do" in layout.log_path(study, 0).read_text()
    assert (study / "runs" / "s-n2-s0" / "trace.h5").stat().st_mtime_ns == before


#: A study of one 2-rank task.
PAIR = """
[job]
name = "p"
[train]
dataset = "digits"
hidden = [16]
steps = 8
progress = false
[sweep]
ranks = [2]
"""
#: A launcher that starts its command twice, each copy a world of its own (as ``srun`` without
#: ``--mpi=pmi2`` or ``pmix`` does on a site whose MpiDefault is none), and exits with the higher
#: of their codes.
SINGLETONS = ["sh", "-c", '"$@" & first=$!; "$@"; second=$?; wait $first; first=$?; '
              'exit $((first > second ? first : second))', "singletons"]


def test_a_task_whose_launcher_started_single_ranks_is_wrong_not_finished(tmp_path):
    """The task's two ranks each start alone: one trains the 2-rank task's run on 1 rank to its
    end, the other finds the run directory taken; collect says wrong, and why."""
    (tmp_path / "pair.toml").write_text(PAIR)
    hpcopt("sweep", "pair.toml", "--out", "study", cwd=tmp_path)
    study = tmp_path / "study"
    log = layout.log_path(study, 0)
    with open(log, "wb") as output:
        task = subprocess.run([sys.executable, "-m", "hpcopt.study.task", "0", *SINGLETONS], cwd=study,
                              env=environment(), stdout=output, stderr=subprocess.STDOUT, timeout=scaled(120))
    assert task.returncode == 2, log.read_text()
    trace = read_trace(study / "runs" / "p-n2" / "trace.h5")
    assert trace.attrs["world_size"] == 1 and trace.summary is not None, log.read_text()
    hpcopt("collect", str(study), cwd=tmp_path)
    with open(study / "study.csv", newline="") as handle:
        [row] = list(csv.DictReader(handle))
    assert (row["state"], row["exit_code"], row["steps"]) == ("wrong", "2", "8"), row
    assert row["note"].startswith("trained on 1 rank(s), the task asks for 2: usually a launcher that "
                                  "started single-rank copies, not one world (srun without --mpi=pmi2 "
                                  "or --mpi=pmix); move the run directory away and run the task again; "
                                  "otherwise finished"), row


def alive(pids: set[int]) -> list[str]:
    """The processes of ``pids`` still running (not zombies), described."""
    left = []
    for pid in pids:
        try:
            stat = (Path("/proc") / str(pid) / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            left.append(stat)
    return left


@dataclass
class Interrupted:
    """``sweep --local -j 2`` of SLOW, signalled while its first two tasks trained."""

    returncode: int
    output: str
    seconds: float  # from the signal to sweep's exit
    left: list[str]  # the processes it started that were still running after it exited
    started: int  # how many processes it started (tasks, mpiexec, proxies, ranks)
    study: Path


def interrupt_local_sweep(work: Path, signum: int) -> Interrupted:
    """Run ``sweep --local -j 2`` of SLOW in ``work``, in a session of its own, send it
    ``signum`` (as a terminal's Ctrl-C reaches its group only) once tasks 0 and 1 have written
    their first checkpoint, and wait for it; every process it started that outlives it is
    listed and killed."""
    (work / "slow.toml").write_text(SLOW)
    sweep = subprocess.Popen([sys.executable, "-m", "hpcopt", "sweep", "slow.toml", "--out", "study",
                              "--local", "-j", "2"], cwd=work, env=environment(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    study, started = work / "study", set[int]()
    try:
        deadline = time.monotonic() + scaled(60)
        while not all((study / "runs" / f"s-n2-s{i}" / "checkpoints" / "step-000000040.h5").exists()
                      for i in (0, 1)):
            assert sweep.poll() is None and time.monotonic() < deadline, sweep.stdout.read()
            started |= set(_tree(sweep.pid))
            time.sleep(0.02)
        started |= set(_tree(sweep.pid))
        os.kill(sweep.pid, signum)
        sent = time.monotonic()
        output, _ = sweep.communicate(timeout=scaled(60))
        seconds = time.monotonic() - sent
    finally:
        _kill_tree(sweep.pid)
    left = alive(started - {sweep.pid})
    for stat in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(stat.split()[0]), signal.SIGKILL)
    return Interrupted(sweep.returncode, output, seconds, left, len(started), study)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_sweep_local_stops_launching_and_leaves_nothing_running(signum, tmp_path):
    """Ctrl-C (or SIGTERM) to ``sweep --local -j 2`` while two tasks train: the two stop at a
    checkpoint and record 128 + signum (143 under Open MPI, whose mpirun gets SIGUSR1), the other
    two never start, sweep exits 128 + signum, and no process it started (tasks, mpiexec, ranks)
    is left (it once exited at once, started a task after the signal and left five processes
    running)."""
    run = interrupt_local_sweep(tmp_path, signum)
    assert run.started > 6 and run.left == [], run.output
    assert run.returncode == 128 + signum, run.output
    assert f"stopped the study; 2 of 4 task(s) not started (exit code {128 + signum})" in run.output
    assert "task 2 started" not in run.output and not layout.log_path(run.study, 2).exists(), run.output
    for index in (0, 1):
        record = layout.read_record(layout.record_path(run.study, index)) or {}
        assert record.get("exit_code") == exit_code(launcher_stop_signal(signum)), \
            layout.log_path(run.study, index).read_text()
        assert (run.study / "runs" / f"s-n2-s{index}" / "checkpoints").is_dir()
