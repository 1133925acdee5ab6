"""Faults and stragglers as a study's axes, run for real: a sweep with ``--fault`` loses its
rank, a second ``sweep --local`` (a requeue) resumes it past the fault to the fault-free run's
numbers, ``collect`` reports the steps redone and the seconds to recover; a straggler changes
no number; a task requeued onto fewer ranks resumes with ``--ranks-changed`` and finishes."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hpcopt.io.trace import read_trace
from hpcopt.run.fault_schedule import read_record
from hpcopt.study import layout
from tests.faults.test_study import environment, hpcopt
from tests.timeouts import scaled

STUDY = """\
[job]
name = "f"
[train]
dataset = "digits"
hidden = [16]
steps = 32
interval = 4
trace_every = 4
checkpoint_every = 8
progress = false
[[sweep]]
ranks = [2]
fault = ["", "1:13"]
[[sweep]]
ranks = [2]
straggler = ["1:0.5"]
"""


def sweep_local(study: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcopt", "sweep", "study.toml", "--out", ".", "--local",
                           "-j", "1"], cwd=study, env=environment(), capture_output=True, text=True,
                          timeout=scaled(600))


def test_a_fault_replays_once_resumes_to_the_fault_free_numbers_and_collect_counts_it(tmp_path):
    (tmp_path / "study.toml").write_text(STUDY)
    started = time.time()
    first = sweep_local(tmp_path)
    assert first.returncode == 1 and "1 of 3 task(s) did not finish: task 1" in first.stdout, first.stdout
    log = (tmp_path / "logs/task-1.log").read_text()
    assert "hpcopt: --fault: killing rank 1 (SIGKILL) at its step 13" in log
    requeued = time.time()
    again = sweep_local(tmp_path)  # the requeue: finished runs are left alone, the killed one resumes
    ended = time.time()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resume runs/f-n2-fault1_13" in (tmp_path / "logs/task-1.log").read_text()
    hpcopt("collect", ".", cwd=tmp_path)
    with open(tmp_path / "study.csv", newline="") as handle:
        rows = {row["run"]: row for row in csv.DictReader(handle)}
    faulty = rows["runs/f-n2-fault1_13"]
    assert faulty["state"] == "finished" and faulty["rank_losses"] == "1"
    assert faulty["steps_lost"] == str(13 - 1 - 8)  # redone since the checkpoint at step 8
    # From the kill, in the first sweep, to the resumed job's first step, in the second: bounded
    # by this test's own clock, not by a guess at the machine's speed (the first sweep runs the
    # straggler's task after the kill, which takes what the load makes it take).
    killed_at = read_record(tmp_path / "runs/f-n2-fault1_13").killed_at  # type: ignore[union-attr]
    assert started <= killed_at <= requeued
    assert requeued - killed_at <= float(faulty["recovery_seconds"]) <= ended - killed_at
    assert rows["runs/f-n2-fault"]["rank_losses"] == "0"
    traces = {name: read_trace(tmp_path / name / "trace.h5") for name in rows}
    plain = traces["runs/f-n2-fault"]
    for name in ("runs/f-n2-fault1_13", "runs/f-n2-straggler1_0.5"):
        for column in ("loss_mean", "loss_max", "grad_norm"):
            assert np.array_equal(traces[name].columns[column], plain.columns[column]), (name, column)
        assert traces[name].summary["eval_loss"] == plain.summary["eval_loss"]
    assert "fault = \"1:13\"" in traces["runs/f-n2-fault1_13"].attrs["config"]


def test_a_task_requeued_onto_fewer_ranks_resumes_with_ranks_changed(tmp_path):
    (tmp_path / "study.toml").write_text(STUDY.replace('fault = ["", "1:13"]', 'fault = ["1:13"]')
                                         .split("[[sweep]]\nranks = [2]\nstraggler")[0])
    assert sweep_local(tmp_path).returncode == 1  # killed at step 13, checkpoint at step 8
    [entry] = layout.read_manifest(tmp_path)
    done = subprocess.run([sys.executable, "-m", "hpcopt.study.task", "0", "mpiexec", "-n", "1"],
                          cwd=tmp_path, env=environment(), capture_output=True, text=True,
                          timeout=scaled(300))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resume {entry.run.as_posix()} --ranks-changed" in done.stdout
    assert "carrying a checkpoint of 2 rank(s) over to 1" in done.stdout
    trace = read_trace(tmp_path / entry.run / "trace.h5")
    assert trace.summary is not None and trace.summary["step"] == 32


def test_a_stop_signal_ends_a_stragglers_sleep_and_the_run_stops_at_a_checkpoint(tmp_path):
    """The slowest straggler (0.01x) with batches of 512 on the default MLP sleeps seconds per
    step, so a row of 8 steps lies far beyond the stop's time limit (42 s without the sleep's end
    at a stop, 0.7 s with it): SIGUSR1, which every launcher forwards, ends its sleep, and the job
    stops at the next row's checkpoint. Its sleep once ignored stop signals (a factor of 1e-9
    made a job that SIGTERM could not end)."""
    from tests.faults.jobs import Send, run_job
    from tests.faults.test_signals import JOB, assert_stopped_at_a_checkpoint

    out = tmp_path / "run"
    job = run_job([*JOB, "--dataset", "mnist5k", "--hidden", "512,256", "--batch-size", "512",
                   "--straggler", "1:0.01", "--checkpoint-every", "8", "--out", str(out)],
                  send=Send(signal.SIGUSR1, 0.5))
    assert_stopped_at_a_checkpoint(job, signal.SIGUSR1, 8, out)
