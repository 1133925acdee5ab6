"""What anyone who can write in a run or study directory can plant where hpcopt expects its own
files (hpcopt.io.safe_files): a FIFO, a device or a huge file is refused in one line without
blocking or reading it whole, a sparse trace declares no more than its blocks hold, and
``collect``, ``export``, ``report`` and ``sweep`` replace a planted link instead of writing
through it or out of ``--out``."""

from __future__ import annotations

import csv
import os
import socket
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.io.trace import read_trace
from hpcopt.run.lock import FILE_NAME, RunLock, check_free
from hpcopt.study import layout
from hpcopt.study.collect import collect
from hpcopt.study.export import export
from tests import crafted
from tests.memory import peak_allocation
from tests.runs import fresh_train
from tests.timeouts import scaled
from tests.unit.test_collect import make_study

MB = 1 << 20
#: A FIFO's open blocks for ever; every refusal here takes well under this.
PROMPT = 10.0


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished 1-rank run (its trace and checkpoints)."""
    out = tmp_path_factory.mktemp("planted") / "run-a"
    fresh_train(build_config(None, {"dataset": "digits", "hidden": "16", "steps": "8", "progress": "false",
                                    "out": str(out)}))
    return out


def refused_promptly(call, *fragments: str) -> str:
    """``call``'s HpcoptError message, one line holding ``fragments``, raised within PROMPT s."""
    start = time.monotonic()
    with pytest.raises(HpcoptError) as error:
        call()
    message = str(error.value)
    assert time.monotonic() - start < PROMPT, message
    assert "\n" not in message and all(f in message for f in fragments), message
    return message


def finished_promptly(call, limit: float = PROMPT):
    """``call``'s result, in a thread that must end within ``limit`` s (a write into a FIFO
    would block it for good: the test fails instead of hanging)."""
    result: list = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(limit)
    assert not worker.is_alive() and result, "still blocked, or it raised (see the thread's traceback)"
    return result[0]


# -- FIFOs and devices where a file is expected (items 1 and 5) ---------------------------------

def test_a_fifo_lock_is_refused_without_waiting_on_it(tmp_path):
    os.mkfifo(tmp_path / FILE_NAME)
    for call in (lambda: RunLock.acquire(tmp_path, "run"), lambda: check_free(tmp_path)):
        refused_promptly(call, f"{tmp_path / FILE_NAME} is a FIFO, not a regular file")
    assert (tmp_path / FILE_NAME).exists()  # not the lock of a job: left alone


def study_with_record(tmp_path: Path) -> Path:
    """A one-task study whose task has started (its record written, then released)."""
    study = make_study(tmp_path, {}, 1)
    task = layout.TaskRecord(study, layout.read_manifest(study)[0])
    task.start()
    task.end(0)
    return study


@pytest.mark.parametrize("planted", ["fifo record", "fifo log", "socket record", "socket log",
                                     "/dev/zero record", "huge record"])
def test_collect_refuses_a_record_or_log_that_is_no_file_of_a_task(tmp_path, planted):
    """``ln -sf /dev/zero STUDY/logs/task-0.json`` once cost a MemoryError traceback, and a FIFO
    there hung ``collect``: each is one line, read without blocking and never whole (a link is
    refused as a link, whatever it leads to); a socket, once "No such device or address", is
    named as one."""
    study = study_with_record(tmp_path)
    record, log = layout.record_path(study, 0), layout.log_path(study, 0)
    record.write_text('{"index": 0, "exit_code": 1}')  # a failed task: its log is read for the note
    if planted == "fifo record":
        record.unlink()
        os.mkfifo(record)
        words = [f"{record} is a FIFO, not a regular file"]
    elif planted == "fifo log":
        os.mkfifo(log)
        words = [f"{log} is a FIFO, not a regular file"]
    elif planted.startswith("socket"):
        planted_at = record if planted == "socket record" else log
        planted_at.unlink(missing_ok=True)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(planted_at))
        words = [f"{planted_at} is a socket, not a regular file"]
    elif planted == "/dev/zero record":
        record.unlink()
        record.symlink_to("/dev/zero")
        words = [f"{record} is a symbolic link, not a regular file"]
    else:
        with open(record, "ab") as handle:
            handle.truncate(1 << 30)  # 1 GiB, sparse: nothing on disk
        words = [f"{record} holds more than", "more than a task record holds"]
    _, peak = peak_allocation(lambda: refused_promptly(lambda: collect([study], study), *words))
    assert peak < MB, peak
    assert not (study / "study.csv").exists()


def test_a_task_refuses_a_fifo_record_without_blocking(tmp_path):
    study = make_study(tmp_path, {}, 1)
    os.mkfifo(layout.record_path(study, 0))
    task = layout.TaskRecord(study, layout.read_manifest(study)[0])
    refused_promptly(task.start, "is a FIFO, not a regular file")


def test_the_preflight_probe_never_opens_a_file_planted_at_its_name(tmp_path):
    """The probe once had a name anyone could plant a FIFO at (``.preflight-PID``): opening it to
    write waited for a reader. A reader that comes after 5 s turns such a wait into a failure."""
    from types import SimpleNamespace

    from hpcopt.run.preflight import check_output

    (tmp_path / "checkpoints").mkdir()
    fifo = tmp_path / "checkpoints" / f".preflight-{os.getpid()}"
    os.mkfifo(fifo)
    stop = threading.Event()

    def reader() -> None:
        if not stop.wait(5.0):
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=reader)
    thread.start()
    start = time.monotonic()
    try:
        check_output(tmp_path, 1, SimpleNamespace(rank=0))
    finally:
        stop.set()
        thread.join()
    assert time.monotonic() - start < 5.0 and fifo.exists()
    assert sorted(p.name for p in fifo.parent.iterdir()) == [fifo.name]  # the probe removed


# -- sparse files and the declared-size bound (item 2) -------------------------------------------

def test_a_sparse_trace_declares_no_more_than_its_blocks_hold(run, tmp_path):
    """A trace whose /rows declares hundreds of MB in a sparse file as long (a few kB on disk)
    passes a bound on the file's length; its blocks bound it (with the room a compressing file
    system needs: structure.ALLOCATED_*), before anything is allocated."""
    bad = tmp_path / "trace.h5"
    bad.write_bytes((run / "trace.h5").read_bytes())
    crafted.huge_trace(bad, 1 << 23)  # 2.2 GB of rows and counters
    os.truncate(bad, (1 << 23) * 160)  # 1.3 GB: within the bound on its length (4x)
    assert bad.stat().st_blocks * 512 < MB  # sparse: what it declares is not on disk
    message, peak = peak_allocation(lambda: refused_promptly(lambda: read_trace(bad)))
    assert "of data but the file holds" in message and str(bad) in message, message
    assert peak < 2 * MB, peak


def test_reading_a_trace_holds_its_rows_once(run, tmp_path):
    """A trace of 300,000 rows is read a block at a time into its columns: the peak is the
    columns, not the table and the columns."""
    path = tmp_path / "trace.h5"
    path.write_bytes((run / "trace.h5").read_bytes())
    rows = 300_000
    with h5py.File(path, "r+") as f:
        table = f["rows"]
        values = np.zeros(rows, dtype=table.dtype)
        values["step"] = np.arange(rows)
        table.resize((rows,))
        table[:] = values
        counters = 0
        for name in f["comm"]:
            dataset = f[f"comm/{name}"]
            dataset.resize(rows, axis=0)
            dataset[:] = np.ones(dataset.shape, dataset.dtype)
            counters += dataset.size * dataset.dtype.itemsize
    trace, peak = peak_allocation(lambda: read_trace(path))
    assert trace.rows == rows and trace.columns["step"].tolist() == list(range(rows))
    assert peak < values.nbytes + counters + 4 * MB, (peak, values.nbytes, counters)


# -- outputs never through a link, never out of --out (item 4) -----------------------------------

def plant_links(tmp_path: Path, folder: str, *names: str) -> tuple[Path, Path]:
    """(``tmp_path/precious``, holding "keep me", and the new folder ``tmp_path/folder`` with a
    link to it at each of ``names``)."""
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    out = tmp_path / folder
    out.mkdir()
    for name in names:
        (out / name).symlink_to(precious)
    return precious, out


def test_collect_replaces_a_planted_link_instead_of_writing_through_it(run, tmp_path):
    precious, out = plant_links(tmp_path, "out", "study.csv", "study.md")
    written = collect([run], out)
    assert precious.read_text() == "keep me\n"
    for path in written:
        assert not path.is_symlink() and path.is_file()
    with open(out / "study.csv", newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 1
    assert sorted(p.name for p in out.iterdir()) == ["study.csv", "study.md"]  # no temporary left


def test_export_never_writes_out_of_its_out_nor_through_a_link(run, tmp_path, monkeypatch):
    """``export .. --out xo`` once wrote ``xo/../rows.csv``; a link planted at a file's name or
    at a run's folder in ``--out`` is replaced or refused, never followed."""
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    monkeypatch.chdir(run / "checkpoints")
    out = tmp_path / "xo"
    written = export([".."], "csv", out)  # the run directory, named by ".."
    assert sorted(written) == [out / "run-a" / "comm.csv", out / "run-a" / "rows.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious", "xo"]  # nothing beside --out
    (out / "run-a" / "rows.csv").unlink()
    (out / "run-a" / "rows.csv").symlink_to(precious)
    export([str(run)], "csv", out)
    assert precious.read_text() == "keep me\n" and not (out / "run-a" / "rows.csv").is_symlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = tmp_path / "xo2"
    planted.mkdir()
    (planted / "run-a").symlink_to(elsewhere)
    refused_promptly(lambda: export([str(run)], "csv", planted), f"{planted / 'run-a'} is a symbolic link")
    assert list(elsewhere.iterdir()) == []


def test_report_replaces_planted_links_and_fifos_instead_of_writing_through_them(run, tmp_path):
    """``hpcopt report --out DIR`` wrote its PNGs and report.md through a link planted at their
    names (and a FIFO there blocked it for good)."""
    pytest.importorskip("matplotlib")
    from hpcopt.report import write_report

    precious, out = plant_links(tmp_path, "report", "steps.png", "report.md")
    os.mkfifo(out / "wall.png")
    written = finished_promptly(lambda: write_report([run], out), scaled(120))  # four plots
    assert precious.read_text() == "keep me\n"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)  # no temporary left
    for path in written:
        assert not path.is_symlink() and path.is_file(), path
    assert (out / "steps.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "report.md").read_text().startswith("# hpcopt report")


def test_sweep_replaces_planted_links_instead_of_writing_through_them(tmp_path):
    """``hpcopt sweep --out DIR`` wrote its scripts, site file, sweep file and manifest through
    links planted at their names (and chmod-ed the link's target to 0755); a FIFO at one of them
blocked it for good."""
    from hpcopt.cli import make_parser
    from hpcopt.study import sweep

    spec = tmp_path / "sweep.toml"
    spec.write_text('[job]\nscheduler = "slurm"\n[train]\ndataset = "digits"\nsteps = 4\n'
                    '[sweep]\nranks = [1]\ninterval = [1, 2]\n')
    names = ("array-n1.sh", layout.SITE, layout.SPEC)  # a manifest unlike the study's is refused first
    precious, out = plant_links(tmp_path, "study", *names)
    precious.chmod(0o600)
    (out / layout.SITE).unlink()
    os.mkfifo(out / layout.SITE)
    args = make_parser().parse_args(["sweep", str(spec), "--out", str(out)])
    assert finished_promptly(lambda: sweep.run(args)) == 0
    assert precious.read_text() == "keep me\n" and precious.stat().st_mode & 0o777 == 0o600
    for name in names:
        assert not (out / name).is_symlink() and (out / name).is_file(), name
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, layout.MANIFEST, "logs"])  # no temporary
    assert (out / "array-n1.sh").stat().st_mode & 0o777 == 0o755
    assert (out / layout.SPEC).read_text() == spec.read_text()
    assert len(layout.read_manifest(out)) == 2


def test_outputs_written_by_rename_keep_the_modes_of_files_written_in_place(run, tmp_path):
    """A temporary file is made with the umask's mode, as ``open`` makes a file (not 0600)."""
    mask = os.umask(0o022)
    try:
        written = [*collect([run], tmp_path / "c"), *export([str(run)], "csv", tmp_path / "e")]
    finally:
        os.umask(mask)
    assert {oct(path.stat().st_mode & 0o777) for path in written} == {oct(0o644)}


def test_sweep_local_refuses_a_fifo_at_a_task_log_without_blocking(tmp_path):
    """``sweep --local`` opened ``logs/task-N.log`` to write: a FIFO there blocked it for good."""
    from hpcopt.study import local

    study = make_study(tmp_path, {}, 1)
    os.mkfifo(layout.log_path(study, 0))
    entry = layout.read_manifest(study)[0]
    refused_promptly(lambda: local._start(study, entry, dict(os.environ), local.task_command(entry)),
                     "is a FIFO, not a regular file")
