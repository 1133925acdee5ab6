"""A study's task that lost a rank under ``--on-rank-loss continue``: exit 5 (its survivors
finished) counts as finished in ``sweep --local`` and ``collect`` where its trace holds the
end-of-run record, with a note saying at how many ranks; exit 6 (they could not go on) stays
failed, saying why; neither 0 nor 5 counts without that record; a task that continues runs under
Open MPI's ``--with-ft ulfm`` (hpcopt.study.outcome, local, collect, task)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcopt.config import build_config
from hpcopt.errors import EXIT_CONTINUED, EXIT_NOT_CONTINUED
from hpcopt.study import collect, layout, local
from hpcopt.study.outcome import NO_END_RECORD, ended
from hpcopt.study.task import command, fault_tolerant
from tests.runs import fresh_train

SURVIVED = "finished on the survivors of a lost rank"
NOT_CONTINUED = "a rank was lost and the survivors could not go on"
LOST_LINE = ("hpcopt: error: rank 2 lost at step 14 (ERR_PROC_FAILED): rank 0 holds the run "
             "directory and writes its trace and checkpoints, so the job ends")


def test_exit_codes_read_as_finished_stopped_or_failed():
    def has_record() -> str:
        return ""

    def never() -> str:
        raise AssertionError("the trace is asked about only where the code says finished")

    assert ended(0, has_record) == ("finished", "")
    assert ended(EXIT_CONTINUED, has_record) == ("finished", f"exit 5: {SURVIVED}")
    assert ended(EXIT_NOT_CONTINUED, never) == ("failed", f"exit 6: {NOT_CONTINUED}")
    assert ended(143, never) == ("stopped", "exit 143 (SIGTERM)")
    assert ended(130, never) == ("stopped", "exit 130 (SIGINT)")
    assert ended(2, never) == ("failed", "exit 2") and ended(137, never) == ("failed", "exit 137")


def test_an_exit_code_that_says_finished_counts_only_with_the_end_of_run_record():
    """MPICH's Hydra can exit 0 after a double Ctrl-C with the run unfinished."""
    def lacks() -> str:
        return NO_END_RECORD

    assert ended(0, lacks) == ("failed", "exit 0, but its trace has no end-of-run record")
    assert ended(EXIT_CONTINUED, lacks) == ("failed", f"exit 5: {SURVIVED}, but {NO_END_RECORD}")


def make_study(tmp_path: Path, options: list[str]) -> Path:
    """A study directory whose task i has the train options ``options[i]`` (4 ranks each)."""
    study = tmp_path / "study"
    (study / layout.LOGS).mkdir(parents=True)
    lines = ["\t".join(layout.COLUMNS)] + [f"{i}\truns/t{i}\t4\t{line}" for i, line in enumerate(options)]
    (study / layout.MANIFEST).write_text("\n".join(lines) + "\n")
    return study


@pytest.mark.parametrize("codes, returned", [((0, EXIT_CONTINUED), 0),
                                             ((EXIT_CONTINUED, EXIT_NOT_CONTINUED), 1)])
def test_sweep_local_counts_a_task_its_survivors_finished_as_finished(run, tmp_path, monkeypatch, capsys,
                                                                       codes, returned):
    """Fake tasks that exit with the codes given, their runs finished: 5 is finished, 6 is listed
    as not finished."""
    study = make_study(tmp_path, ["--seed 0", "--seed 1"])
    for index in (0, 1):
        shutil.copytree(run, study / "runs" / f"t{index}")
    monkeypatch.setattr(local, "task_command",
                        lambda entry: [sys.executable, "-c", f"raise SystemExit({codes[entry.index]})"])
    assert local.run_local(study, layout.read_manifest(study), jobs=2) == returned
    out = capsys.readouterr().out
    assert f"ended (exit 5: {SURVIVED}) after" in out, out
    if returned == 0:
        assert "task 0 ended (exit 0) after" in out and "all 2 task(s) finished in" in out, out
    else:
        assert (f"1 of 2 task(s) did not finish: task 1 (exit 6: {NOT_CONTINUED}, logs/task-1.log)"
                in out), out


def test_sweep_local_never_counts_a_run_without_its_end_of_run_record_as_finished(run, tmp_path, monkeypatch,
                                                                                  capsys):
    """Fake tasks that exit 0 (as MPICH's Hydra can after a double Ctrl-C) and 5, one run's trace
    without its end-of-run record, the other with no trace at all: neither finished."""
    import h5py

    study = make_study(tmp_path, ["--seed 0", "--seed 1"])
    shutil.copytree(run, study / "runs" / "t0")
    with h5py.File(study / "runs" / "t0" / "trace.h5", "r+") as f:
        del f["summary"]
    codes = (0, EXIT_CONTINUED)
    monkeypatch.setattr(local, "task_command",
                        lambda entry: [sys.executable, "-c", f"raise SystemExit({codes[entry.index]})"])
    assert local.run_local(study, layout.read_manifest(study), jobs=1) == 1
    out = capsys.readouterr().out
    unfinished = ("task 0 (exit 0, but its trace has no end-of-run record, logs/task-0.log); task 1 (exit 5: "
                  f"{SURVIVED}, but its trace has no end-of-run record, logs/task-1.log)")
    assert "task 0 ended (exit 0, but its trace has no end-of-run record) after" in out, out
    assert f"2 of 2 task(s) did not finish: {unfinished}" in out, out


def test_collect_states_of_tasks_that_exited_5_and_6_without_a_trace(tmp_path):
    study = make_study(tmp_path, ["--dataset digits --seed 0", "--dataset digits --seed 1"])
    for index, code, log in ((0, EXIT_CONTINUED, ""), (1, EXIT_NOT_CONTINUED, f"output\n{LOST_LINE}\n")):
        (study / "runs" / f"t{index}" / "checkpoints").mkdir(parents=True)
        task = layout.TaskRecord(study, layout.read_manifest(study)[index])
        task.start()
        layout.log_path(study, index).write_text(log)
        task.end(code)
    rows = collect.gather([study])
    assert (rows[0].state, rows[0].note) == ("failed", f"exit 5: {SURVIVED}, but no readable trace")
    assert (rows[1].state, rows[1].note) == ("failed", f"exit 6: {NOT_CONTINUED}: {LOST_LINE}")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished 1-rank run."""
    out = tmp_path_factory.mktemp("runs") / "r"
    fresh_train(build_config(None, {"dataset": "digits", "hidden": "16", "steps": "8",
                                    "checkpoint_every": "4", "progress": "false", "out": str(out)}))
    return out


def continued(run: Path, to: Path, lost: list[int], world_size: int, resumed_at: str = "[]") -> Path:
    """A copy of ``run`` as the survivors of ``lost`` of ``world_size`` ranks leave it."""
    shutil.copytree(run, to)
    with h5py.File(to / "trace.h5", "a") as f:
        f.attrs["world_size"], f.attrs["resumed_at"] = world_size, resumed_at
        group = f.create_group("rank_losses")
        count = len(lost)
        for name, values in (("step", np.full(count, 14)), ("rank", np.array(lost)),
                             ("recover_seconds", np.full(count, 0.5)), ("round_step", np.full(count, 12))):
            kind = np.float64 if name == "recover_seconds" else np.int64
            group.create_dataset(name, data=values.astype(kind))
    return to


def test_collect_notes_at_how_many_ranks_the_survivors_finished(run, tmp_path):
    study = make_study(tmp_path, [f"--dataset digits --seed {seed}" for seed in range(3)])
    continued(run, study / "runs" / "t0", [2], 4)
    continued(run, study / "runs" / "t1", [1, 3], 4, resumed_at="[8]")  # a resume may change the count
    shutil.copytree(run, study / "runs" / "t2")
    with h5py.File(study / "runs" / "t2" / "trace.h5", "a") as f:
        f.attrs["world_size"] = 4  # as its task asks (else collect calls it wrong)
    task = layout.TaskRecord(study, layout.read_manifest(study)[0])
    task.start()
    task.end(EXIT_CONTINUED)
    rows = collect.columns(collect.gather([study]), study)
    assert [row["state"] for row in rows] == ["finished"] * 3
    assert rows[0]["note"] == "finished at 3 of 4 ranks after losing rank 2"
    assert rows[1]["note"] == "finished after losing ranks 1, 3"
    assert rows[2]["note"] == "" and rows[2]["rank_losses"] == 0
    assert [row["rank_losses"] for row in rows[:2]] == [1, 2]


@pytest.mark.parametrize("open_mpi", [True, False], ids=["Open MPI", "MPICH"])
def test_a_task_that_continues_gets_open_mpis_ulfm_launcher(tmp_path, monkeypatch, open_mpi):
    from hpcopt.comm import mpi_support

    monkeypatch.setattr(mpi_support, "open_mpi", lambda: open_mpi)
    go_on = layout.Entry(0, Path("runs/t0"), 4, ("--on-rank-loss", "continue", "--lr", "0.1"))
    stop = layout.Entry(0, Path("runs/t0"), 4, ("--on-rank-loss", "abort"))
    plain = layout.Entry(0, Path("runs/t0"), 4, ("--lr", "0.1"))
    ulfm = ["mpiexec", "--with-ft", "ulfm", "-n", "4"]
    assert fault_tolerant(go_on, ["mpiexec", "-n", "4"]) == (ulfm if open_mpi else ["mpiexec", "-n", "4"])
    assert fault_tolerant(go_on, ["/opt/ompi/bin/mpirun", "-n", "4"])[1:3] == (
        ["--with-ft", "ulfm"] if open_mpi else ["-n", "4"])
    for given in (ulfm, ["mpirun", "--with-ft=ulfm", "-n", "4"], ["srun", "--gpus-per-task=1"]):
        assert fault_tolerant(go_on, given) == given  # given already, or no Open MPI launcher
    for entry in (stop, plain):
        assert fault_tolerant(entry, ["mpiexec", "-n", "4"]) == ["mpiexec", "-n", "4"]
    argv = command(tmp_path, go_on, ["mpiexec", "-n", "4"])  # a first start, as the task runs it
    expected = ulfm if open_mpi else ["mpiexec", "-n", "4"]
    assert argv is not None and argv[:len(expected) + 1] == [*expected, sys.executable]
    assert argv[-2:] == ["--out", "runs/t0"]
