"""What a study's Slurm and PBS scripts ask of the scheduler beyond the resources (the site's
account, partition, QoS, memory and any other directives; the stop signal's lead scaled to short
tasks), and how a task's runner behaves under a scheduler: it passes a stop signal it receives on
to its launcher (the first of each kind; SIGINT as SIGTERM to srun), stops before starting when
the signal came first, and requeues its Slurm job after a stop or a lost node, never after bad
input, NaN, a finished run or ``scancel``, at most ``[job] requeue`` times. Stand-in ``srun``,
``scontrol`` and ``squeue`` programs record what they got and tell the job's state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcopt.errors import HpcoptError
from hpcopt.study.spec import load_study, task_seconds, tasks
from hpcopt.study.sweep import LEAD, scripts, stop_lead
from tests.command_line import ROOT
from tests.timeouts import scaled

SWEEP = """
[job]
scheduler = "{scheduler}"
name = "t"
time = "{time}"
{extra}
[train]
dataset = "digits"
steps = 8
[sweep]
ranks = [2]
"""


def rendered(tmp_path: Path, scheduler: str = "slurm", time: str = "01:00:00", extra: str = "") -> str:
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(scheduler=scheduler, time=time, extra=extra))
    study = load_study(path)
    [script] = scripts(study, tasks(study))
    return script.text


def test_the_sites_account_partition_qos_memory_and_own_directives_reach_the_slurm_script(tmp_path):
    text = rendered(tmp_path, extra='account = "proj42"\npartition = "gpu"\nqos = "low"\nmemory = "16G"\n'
                    'directives = ["--exclusive", "--mail-type=END"]')
    for line in ("--account=proj42", "--partition=gpu", "--qos=low", "--mem=16G", "--exclusive",
                 "--mail-type=END"):
        assert f"#SBATCH {line}\n" in text
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert text.index(directives[-1]) < text.index("set -euo")  # before the first command
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_pbs_gets_account_queue_and_memory_and_refuses_a_qos(tmp_path):
    text = rendered(tmp_path, "pbs", extra='account = "proj42"\npartition = "short"\nmemory = "8gb"\n'
                    'directives = ["-m abe"]')
    assert "#PBS -A proj42\n" in text and "#PBS -q short\n" in text and "#PBS -m abe\n" in text
    assert ":mem=8gb\n" in text
    with pytest.raises(HpcoptError, match="qos is Slurm's"):
        rendered(tmp_path, "pbs", extra='qos = "low"')


@pytest.mark.parametrize("extra, message", [
    ('account = "a b"', "account must be a word"), ('memory = "16G;rm"', "memory must be a word"),
    ('directives = "--exclusive"', "directives must be a list"),
    ('directives = ["--x\\n#SBATCH --y"]', "each one line"),
    ('directives = ["exclusive"]', 'starting with "-"'),
    ("requeue = -1", "requeue must be an integer"),
])
def test_bad_job_keys_are_refused_in_one_line(tmp_path, extra, message):
    with pytest.raises(HpcoptError, match=message):
        rendered(tmp_path, extra=extra)


@pytest.mark.parametrize("time, seconds", [("01:00:00", 3600), ("2-00:00:00", 172800), ("05:00", 300),
                                           ("90", 5400), ("1-2", 93600), ("1-02:30", 95400),
                                           ("00:00:30", None), ("1h", None), ("x-1", None)])
def test_task_times_are_read_in_slurms_forms(time, seconds):
    if seconds is None:
        with pytest.raises(HpcoptError, match="time"):
            task_seconds(time)
    else:
        assert task_seconds(time) == seconds


def test_a_short_tasks_stop_signal_comes_a_quarter_of_its_time_early_not_two_minutes(tmp_path):
    assert stop_lead(3600) == LEAD == 120
    assert stop_lead(120) == 30  # TERM@120 would stop a 2-minute task almost at once
    assert "#SBATCH --signal=TERM@30\n" in rendered(tmp_path, time="00:02:00")
    assert "#SBATCH --open-mode=append\n" in rendered(tmp_path)  # a requeue keeps the first attempt's log


# -- the task runner under a scheduler -----------------------------------------------------------

STAND_IN = """#!/bin/bash
# records the signals it gets and its arguments in $RECORD, then waits to be stopped
for s in TERM INT USR1; do trap "echo got $s >> \\"\\$RECORD\\"; exit {code}" $s; done
echo "started $$ $*" >> "$RECORD"
sleep 60 > /dev/null 2>&1 & wait
"""


def make_study(tmp_path: Path) -> Path:
    """A one-task study (2 ranks) written by hpcopt sweep."""
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(scheduler="slurm", time="01:00:00", extra=""))
    study = tmp_path / "study"
    subprocess.run([sys.executable, "-m", "hpcopt", "sweep", str(path), "--out", str(study)], check=True,
                   capture_output=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return study


def stand_ins(tmp_path: Path, code: int) -> tuple[Path, Path]:
    """A folder with a stand-in srun (exits ``code`` when signalled) and scontrol, and the record."""
    bin_dir, record = tmp_path / "bin", tmp_path / "record.txt"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(STAND_IN.format(code=code))
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "scontrol $*" >> "$RECORD"\n')
    (bin_dir / "squeue").write_text('#!/bin/bash\necho "${JOB_STATE:-RUNNING}"\n')
    for name in ("srun", "scontrol", "squeue"):
        (bin_dir / name).chmod(0o755)
    return bin_dir, record


def start_task(study: Path, bin_dir: Path, record: Path, restarts: int = 0,
               requeue: int = 2, state: str = "RUNNING", hook: Path | None = None) -> subprocess.Popen:
    """The task's runner under the stand-ins (``hook``: a folder put on its module path too)."""
    path = os.pathsep.join(map(str, (ROOT, *([hook] if hook else []))))
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", RECORD=str(record),
               JOB_STATE=state, PYTHONPATH=path, SLURM_ARRAY_JOB_ID="77", SLURM_ARRAY_TASK_ID="0",
               SLURM_JOB_ID="78", SLURM_RESTART_COUNT=str(restarts))
    return subprocess.Popen([sys.executable, "-m", "hpcopt.study.task", "0", "--requeue", str(requeue),
                             str(bin_dir / "srun")], cwd=study, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for(record: Path, text: str) -> None:
    deadline = time.monotonic() + scaled(30)
    while time.monotonic() < deadline:
        if record.is_file() and text in record.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {record.read_text() if record.is_file() else 'nothing'}")


@pytest.mark.parametrize("sent, passed", [(signal.SIGUSR1, "USR1"), (signal.SIGTERM, "TERM"),
                                          (signal.SIGINT, "TERM")])
def test_a_stop_signal_to_the_batch_shell_reaches_srun_and_a_stop_at_a_checkpoint_requeues(
        tmp_path, sent, passed):
    """``scancel --signal=USR1 --batch`` signals only the batch shell, which the task's runner is:
    it passes the signal on (srun forwards it to every rank), and once the run stopped at a
    checkpoint (143) it requeues its array task with scontrol."""
    study = make_study(tmp_path)
    bin_dir, record = stand_ins(tmp_path, code=143)
    task = start_task(study, bin_dir, record)
    wait_for(record, "started")
    task.send_signal(sent)
    out, _ = task.communicate(timeout=scaled(30))
    assert task.returncode == 143, out
    lines = record.read_text().splitlines()
    assert lines[1:] == [f"got {passed}", "scontrol requeue 77_0"], lines
    assert "attempt 1 (Slurm job 77_0)" in out
    assert "exit 143 (stopped at a checkpoint); requeueing Slurm job 77_0 (requeue 1 of at most 2)" in out


@pytest.mark.parametrize("code, requeued", [(137, True), (1, True), (2, False), (3, False)])
def test_a_lost_node_requeues_but_bad_input_nan_or_a_finished_run_never_does(tmp_path, code, requeued):
    """Under Open MPI the survivors of a killed node end at once (srun: exit 14, before Slurm
    declares the node down): that run is resumable, so it requeues; 2 and 3 would fail again."""
    study = make_study(tmp_path)
    bin_dir, record = stand_ins(tmp_path, code=code)
    task = start_task(study, bin_dir, record)
    wait_for(record, "started")
    task.send_signal(signal.SIGTERM)
    out, _ = task.communicate(timeout=scaled(30))
    assert task.returncode == code, out
    assert ("scontrol requeue 77_0" in record.read_text()) == requeued, out


@pytest.mark.parametrize("restarts, state, message", [
    (2, "RUNNING", "not requeued: requeued 2 time(s) already"),  # its budget spent
    # scancel JOB: the batch shell gets SIGTERM and the job is COMPLETING; not to be undone
    (0, "COMPLETING", "not requeued: the job is COMPLETING"),
])
def test_a_spent_budget_or_a_cancelled_job_is_not_requeued(tmp_path, restarts, state, message):
    study = make_study(tmp_path)
    bin_dir, record = stand_ins(tmp_path, code=143)
    task = start_task(study, bin_dir, record, restarts=restarts, state=state)
    wait_for(record, "started")
    task.send_signal(signal.SIGTERM)
    out, _ = task.communicate(timeout=scaled(30))
    assert task.returncode == 143 and "scontrol" not in record.read_text() and message in out, out
    assert f"attempt {restarts + 1} (Slurm job 77_0)" in out


def test_a_signal_before_the_launcher_starts_stops_the_task_before_it_starts(tmp_path):
    from hpcopt.study import task as task_module

    study = make_study(tmp_path)
    bin_dir, record = stand_ins(tmp_path, code=143)
    forward = task_module._Forward([str(bin_dir / "srun")])
    forward.receive(signal.SIGTERM)
    entry = task_module.read_manifest(study)[0]
    assert task_module._carry_on(study, entry, [str(bin_dir / "srun")], forward) == 143
    assert not record.exists()  # the launcher never started


#: A ``sitecustomize`` by which a process sends itself SIGUSR1 as it starts importing the module
#: the task's runner reads the study with.
SIGUSR1_AT_IMPORT = """
import os, signal, sys

class SignalAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == "hpcopt.study.layout":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGUSR1)
        return None

sys.meta_path.insert(0, SignalAtImport())
"""


def test_a_signal_while_the_task_runner_imports_stops_the_task_before_it_starts(tmp_path):
    """``python -m hpcopt.study.task`` notes the stop signals from its first line: a batch
    shell's SIGUSR1 (``scancel --signal=USR1 --batch``) while it imports once killed it (no
    requeue, no record of its end)."""
    study = make_study(tmp_path)
    bin_dir, record = stand_ins(tmp_path, code=143)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SIGUSR1_AT_IMPORT)
    task = start_task(study, bin_dir, record, hook=hook)
    out, _ = task.communicate(timeout=scaled(30))
    assert task.returncode == 143, out
    assert "task 0: SIGUSR1 before the run started; stopped, nothing lost" in out
    assert record.read_text().splitlines() == ["scontrol requeue 77_0"], out  # srun never started
    assert json.loads((study / "logs/task-0.json").read_text())["exit_code"] == 143


@pytest.mark.parametrize("sent, code, stopped", [
    (signal.SIGUSR1, 138, 143),  # Open MPI's mpirun: a rank (or mpirun itself) died of SIGUSR1
    (signal.SIGTERM, 15, 143),  # MPICH's Hydra: a rank died of SIGTERM (15 | its SIGKILL of the rest)
    (signal.SIGINT, 15, 130),  # srun gets SIGTERM for SIGINT
])
def test_a_stop_that_killed_a_process_before_hpcopt_started_is_a_stop_before_the_start(
        tmp_path, sent, code, stopped):
    """A stop signal passed on to the launcher in a rank's first moments, before its
    ``python -m hpcopt`` takes it over, kills that rank (or the launcher): the launcher's own
    code says so, and the task is stopped before it started, as 143 or 130, and requeued as a
    stop (it once counted as failed with the launcher's code)."""
    study = make_study(tmp_path)
    bin_dir, record = stand_ins(tmp_path, code=code)
    task = start_task(study, bin_dir, record)
    wait_for(record, "started")
    task.send_signal(sent)
    out, _ = task.communicate(timeout=scaled(30))
    assert task.returncode == stopped, out
    assert f"task 0: exit {code}\ntask 0: {signal.Signals(sent).name} killed a process of the run before " \
        f"hpcopt started; stopped, nothing lost (exit {stopped})" in out
    assert "scontrol requeue 77_0" in record.read_text(), out
    assert json.loads((study / "logs/task-0.json").read_text())["exit_code"] == stopped


@pytest.mark.parametrize("args, added", [
    ((), ["--stall-timeout", "300", "--checkpoint-minutes", "10"]),
    (("--checkpoint-every", "100"), ["--stall-timeout", "300"]),  # it checkpoints already
    (("--stall-timeout", "0", "--checkpoint-minutes", "30"), []),  # the study's own choices win
])
def test_a_study_task_checkpoints_every_10_minutes_and_ends_a_stall_unless_told_otherwise(args, added):
    from hpcopt.study.task import task_defaults

    assert task_defaults(args) == added


def test_a_launcher_saying_0_for_a_run_without_its_end_of_run_record_is_not_finished(tmp_path):
    """MPICH's Hydra can exit 0 after a double Ctrl-C with the run unfinished: the task exits 1
    (and requeues) unless the run's trace holds its end-of-run record."""
    study = make_study(tmp_path)
    bin_dir, record = stand_ins(tmp_path, code=0)
    task = start_task(study, bin_dir, record)
    wait_for(record, "started")
    task.send_signal(signal.SIGTERM)
    out, _ = task.communicate(timeout=scaled(60))
    assert task.returncode == 1 and "the run has no end-of-run record" in out, out
    assert "scontrol requeue 77_0" in record.read_text()


def test_a_step_ended_under_a_completing_job_without_a_sigterm_here_is_requeued(tmp_path):
    """A node failure: Slurm cancels the step (not this batch shell) and the job shows COMPLETING;
    under Open MPI the survivors exit at once, before Slurm would requeue the job itself."""
    study = make_study(tmp_path)
    bin_dir, record = stand_ins(tmp_path, code=14)
    task = start_task(study, bin_dir, record, state="COMPLETING")
    wait_for(record, "started")
    launcher = int(record.read_text().split()[1])
    os.kill(launcher, signal.SIGTERM)  # to the step, not to the task's runner
    out, _ = task.communicate(timeout=scaled(30))
    assert task.returncode == 14 and "scontrol requeue 77_0" in record.read_text(), out
