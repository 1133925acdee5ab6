"""A study's own files are read and written only as regular files (hpcopt.study.layout): a
symbolic link planted at ``manifest.tsv``, at ``logs/`` or at a task's record or log is refused
in one line, exit 2, by ``sweep``, ``sweep --local``, the task runner and ``collect``, and
nothing is written where the link leads; a study reached through a link of the user's own
still works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcopt.errors import HpcoptError
from hpcopt.study import layout, local
from hpcopt.study.collect import collect
from tests.command_line import ROOT, assert_one_line_error
from tests.timeouts import scaled
from tests.unit.test_collect import make_study

SWEEP = ('[job]\nscheduler = "slurm"\n[train]\ndataset = "digits"\nsteps = 4\n'
         '[sweep]\nranks = [1]\ninterval = [1, 2]\n')


def hpcopt(*args: str, cwd: Path = ROOT, module: str = "hpcopt") -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` (one process, no launcher), as a user runs it."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=scaled(120))


def elsewhere(tmp_path: Path) -> Path:
    """An empty folder outside the study, where a planted link leads."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def plant_manifest_link(study: Path, tmp_path: Path) -> Path:
    """The study's own manifest moved outside and a link to it planted at its name; the target."""
    target = tmp_path / "foreign-manifest.tsv"
    (study / layout.MANIFEST).rename(target)
    (study / layout.MANIFEST).symlink_to(target)
    return target


def plant_logs_link(study: Path, tmp_path: Path) -> Path:
    """A link planted at ``logs/`` leading to an empty folder outside the study; that folder."""
    target = elsewhere(tmp_path)
    (study / layout.LOGS).rmdir()
    (study / layout.LOGS).symlink_to(target, target_is_directory=True)
    return target


def test_the_manifest_is_read_only_as_a_regular_file_of_the_study(tmp_path):
    study = make_study(tmp_path, {}, 2)
    text = (study / layout.MANIFEST).read_text()
    plant_manifest_link(study, tmp_path)
    with pytest.raises(HpcoptError, match=f"^{study / layout.MANIFEST} is a symbolic link, not a regular "
                                          "file \\(expected a study manifest\\)$"):
        layout.read_manifest(study)
    (study / layout.MANIFEST).unlink()
    os.mkfifo(study / layout.MANIFEST)
    with pytest.raises(HpcoptError, match="is a FIFO, not a regular file"):  # never waited on
        layout.read_manifest(study)
    (study / layout.MANIFEST).unlink()
    with open(study / layout.MANIFEST, "wb") as handle:
        handle.write(text.encode())
        handle.truncate(layout.MAX_MANIFEST_BYTES + 1)  # sparse: nothing on disk
    with pytest.raises(HpcoptError, match="holds more than 67.11 MB, more than a study manifest holds"):
        layout.read_manifest(study)


def test_a_study_reached_through_the_users_own_link_works(tmp_path):
    """Only links inside the study are refused: the study directory itself may be one."""
    real = make_study(tmp_path, {}, 1)
    study = tmp_path / "linked-study"
    study.symlink_to(real, target_is_directory=True)
    [entry] = layout.read_manifest(study)
    task = layout.TaskRecord(study, entry)
    task.start()
    task.end(1)
    layout.log_path(study, 0).write_text("hpcopt: error: something\n")
    assert layout.read_record(layout.record_path(study, 0))["exit_code"] == 1
    written = collect([study], study)
    assert "exit 1: hpcopt: error: something" in (study / "study.md").read_text()
    assert all(path.parent == study for path in written)


def test_sweep_refuses_a_link_at_the_manifest_or_at_logs_and_writes_nothing_there(tmp_path):
    spec = tmp_path / "sweep.toml"
    spec.write_text(SWEEP)
    out = tmp_path / "study"
    assert hpcopt("sweep", str(spec), "--out", str(out)).returncode == 0
    manifest = (out / layout.MANIFEST).read_text()
    target = plant_manifest_link(out, tmp_path)
    assert_one_line_error(hpcopt("sweep", str(spec), "--out", str(out)),
                          f"{out / layout.MANIFEST} is a symbolic link, not a regular file")
    assert target.read_text() == manifest and (out / layout.MANIFEST).is_symlink()
    (out / layout.MANIFEST).unlink()
    target.rename(out / layout.MANIFEST)
    foreign = plant_logs_link(out, tmp_path)
    assert_one_line_error(hpcopt("sweep", str(spec), "--out", str(out), "--local"),
                          f"{out / layout.LOGS} is a symbolic link, not a folder")
    assert list(foreign.iterdir()) == []


@pytest.mark.parametrize("planted", ["logs link", "log link", "log fifo"])
def test_sweep_local_refuses_a_planted_log_before_any_task_starts(tmp_path, planted, monkeypatch):
    study = make_study(tmp_path, {}, 2)
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    if planted == "logs link":
        foreign = plant_logs_link(study, tmp_path)
        words = f"{study / layout.LOGS} is a symbolic link, not a folder"
    elif planted == "log link":
        layout.log_path(study, 1).symlink_to(target)
        words = f"{layout.log_path(study, 1)} is a symbolic link, not a regular file"
    else:
        os.mkfifo(layout.log_path(study, 1))
        words = f"{layout.log_path(study, 1)} is a FIFO, not a regular file"
    monkeypatch.setattr(local, "_start", lambda *args: pytest.fail("a task was started"))
    with pytest.raises(HpcoptError, match=words):
        local.run_local(study, layout.read_manifest(study), 2)
    assert target.read_text() == "keep me\n"
    if planted == "logs link":
        assert list(foreign.iterdir()) == []


def test_a_log_planted_while_the_study_runs_fails_only_its_task(tmp_path, monkeypatch, capsys):
    """Planted after the check: that task is not started and counts as failed (exit 1)."""
    study = make_study(tmp_path, {}, 1)
    monkeypatch.setattr(local, "_check_logs", lambda *args: None)  # the plant comes after it
    os.mkfifo(layout.log_path(study, 0))
    assert local.run_local(study, layout.read_manifest(study), 1) == 1
    said = capsys.readouterr().out
    log = layout.log_path(study, 0)
    assert f"1 of 1 task(s) did not finish: task 0 (not started: {log} is a FIFO" in said


@pytest.mark.parametrize("planted", ["manifest link", "logs link", "record link"])
def test_the_task_runner_refuses_a_planted_link_and_writes_nothing_through_it(tmp_path, planted):
    study = make_study(tmp_path, {}, 1)
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    foreign = None
    if planted == "manifest link":
        plant_manifest_link(study, tmp_path)
        words = f"{study / layout.MANIFEST} is a symbolic link, not a regular file"
    elif planted == "logs link":
        foreign = plant_logs_link(study, tmp_path)
        words = f"{study / layout.LOGS} is a symbolic link, not a folder"
    else:
        layout.record_path(study, 0).symlink_to(target)
        words = f"{layout.record_path(study, 0)} is a symbolic link, not a regular file"
    result = hpcopt("0", "true", cwd=study, module="hpcopt.study.task")  # "true": no run is launched
    assert_one_line_error(result, words)
    assert target.read_text() == "keep me\n" and not (study / "runs").exists()
    if foreign is not None:
        assert list(foreign.iterdir()) == []


@pytest.mark.parametrize("planted", ["manifest link", "logs link", "record link", "log link"])
def test_collect_refuses_a_planted_link_in_a_study(tmp_path, planted):
    study = make_study(tmp_path, {}, 1)
    task = layout.TaskRecord(study, layout.read_manifest(study)[0])
    task.start()
    task.end(1)  # a failed task: its log is read for the note
    record, log = layout.record_path(study, 0), layout.log_path(study, 0)
    if planted == "manifest link":
        plant_manifest_link(study, tmp_path)
        words = f"{study / layout.MANIFEST} is a symbolic link"
    elif planted == "logs link":
        moved = tmp_path / "moved-logs"
        (study / layout.LOGS).rename(moved)
        (study / layout.LOGS).symlink_to(moved, target_is_directory=True)
        words = f"{study / layout.LOGS} is a symbolic link, not a folder"
    else:
        planted_at = record if planted == "record link" else log
        moved = tmp_path / "moved"
        if planted_at.exists():
            planted_at.rename(moved)
        else:
            moved.write_text("hpcopt: error: x\n")
        planted_at.symlink_to(moved)
        words = f"{planted_at} is a symbolic link, not a regular file"
    result = hpcopt("collect", str(study))
    assert_one_line_error(result, words)
    assert not (study / "study.csv").exists()
