"""The study directory: what ``hpcopt sweep`` writes and its tasks fill in.

::

    STUDY/
      study.toml            the sweep file, as given
      manifest.tsv          one line per task: index, run directory, ranks, hpcopt train options
      array-n<R>.sh         the job array of the tasks on R ranks (Slurm or PBS)
      site.sh               the site file the arrays source (unless $HPCOPT_SITE names another)
      logs/task-<i>.log     task i's output (the scheduler's, or --local's)
      logs/task-<i>.json    task i's record: where and when it started, its exit code once ended
      runs/<name>/          task i's run directory (trace.h5, checkpoints/)

Every path inside is relative to the study directory, so a study can be moved. While a task
runs, its process holds an exclusive ``flock`` on its record; ``collect`` tells a running task
from one that died without recording its end by trying a shared lock on the record.

The study's own files are untrusted (hpcopt.io.safe_files): the manifest, a task's record and
log are read and written only as regular files, never through a symbolic link at their names
or at ``logs/`` (one HpcoptError line instead), and the manifest and records are read up to a
bound. The study directory itself may be a link (the user names it).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shlex
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import HpcoptError
from ..io.safe_files import open_folder, open_regular, open_writable, read_bounded
from .spec import Task, command_line

MANIFEST = "manifest.tsv"
COLUMNS = ("index", "run", "ranks", "options")
LOGS = "logs"
SITE = "site.sh"
SPEC = "study.toml"
RECORD_KIND = "task record"  # in messages
MANIFEST_KIND = "study manifest"
#: Largest manifest read: about 200,000 tasks of 300 bytes (a job array holds far fewer).
MAX_MANIFEST_BYTES = 64 << 20
#: Largest task record read: one holds about 200 bytes.
MAX_RECORD_BYTES = 1 << 16
#: Seconds a task waits for its record's lock (held a moment by ``collect``) before deciding
#: that another process runs the same task.
LOCK_WAIT = 10.0


@dataclass(frozen=True)
class Entry:
    """A line of the manifest."""

    index: int
    run: Path  # relative to the study directory
    ranks: int
    args: tuple[str, ...]


def is_study(path: Path) -> bool:
    """Whether ``path`` holds something named ``manifest.tsv`` (``read_manifest`` refuses one
    that is no regular file)."""
    return os.path.lexists(path / MANIFEST)


def manifest_text(tasks: Sequence[Task]) -> str:
    lines = ["\t".join(COLUMNS)]
    lines += [f"{t.index}\t{t.run.as_posix()}\t{t.ranks}\t{command_line(t)}" for t in tasks]
    return "\n".join(lines) + "\n"


def stored_manifest(study: Path) -> str | None:
    """The text of the study's manifest, None when it has none; HpcoptError (one line) for a
    link, anything but a regular file, more than ``MAX_MANIFEST_BYTES`` or text that is not UTF-8."""
    path = study / MANIFEST
    try:
        return read_bounded(path, MANIFEST_KIND, MAX_MANIFEST_BYTES, follow=False).decode()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise HpcoptError(f"{path} is not a {MANIFEST_KIND} (not UTF-8 text)") from None


def read_manifest(study: Path) -> list[Entry]:
    """The study's tasks in index order; HpcoptError (naming the line) for a malformed manifest."""
    path = study / MANIFEST
    text = stored_manifest(study)
    if text is None:
        raise HpcoptError(f"cannot read the manifest {path}: no such file")
    lines = text.splitlines()
    if not lines or tuple(lines[0].split("\t")) != COLUMNS:
        raise HpcoptError(f"{path} is not a study manifest (first line: {' '.join(COLUMNS)}, tab-separated)")
    entries: list[Entry] = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t", 3)
        try:
            index, run, ranks, options = int(fields[0]), Path(fields[1]), int(fields[2]), fields[3]
            args = tuple(shlex.split(options))
        except (ValueError, IndexError):
            raise HpcoptError(f"{path}:{number}: expected {len(COLUMNS)} tab-separated fields") from None
        if index != len(entries) or ranks < 1 or run.is_absolute() or ".." in run.parts or not run.parts:
            raise HpcoptError(f"{path}:{number}: expected task {len(entries)}, a run directory "
                              "inside the study and ranks >= 1")
        entries.append(Entry(index, run, ranks, args))
    return entries


def study_traces(study: Path) -> list[Path]:
    """The trace files the study's runs have written so far, in task order."""
    from ..io.trace import FILE_NAME

    return [trace for entry in read_manifest(study) if (trace := study / entry.run / FILE_NAME).is_file()]


def log_path(study: Path, index: int) -> Path:
    return study / LOGS / f"task-{index}.log"


def record_path(study: Path, index: int) -> Path:
    return study / LOGS / f"task-{index}.json"


@contextlib.contextmanager
def logs_folder(path: Path, create: bool = False) -> Iterator[int]:
    """The descriptor of the study's ``logs/`` folder ``path`` (made when ``create``), for
    opening a task's record or log in it: never through a link at the folder's name."""
    folder = open_folder(path, "study's logs folder", create)
    try:
        yield folder
    finally:
        os.close(folder)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class TaskRecord:
    """Task ``index``'s record, locked while the task runs: ``start`` writes where and when it
    started, ``end`` adds its exit code and releases the lock."""

    def __init__(self, study: Path, entry: Entry) -> None:
        self.path = record_path(study, entry.index)
        self.values: dict[str, Any] = {"index": entry.index, "run": entry.run.as_posix()}
        self.handle: IO[str] | None = None

    def start(self) -> None:
        """Lock and write the record; HpcoptError when another process holds it."""
        with logs_folder(self.path.parent, create=True) as folder:
            handle = os.fdopen(open_writable(self.path, RECORD_KIND, create=True, folder=folder), "r+")
        locked, deadline = False, time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    held = read_record(self.path) or {}
                    raise HpcoptError(f"task {self.values['index']} is running already (on "
                                      f"{held.get('host', '?')}, process {held.get('pid', '?')})") from None
                time.sleep(0.1)
            except OSError:  # a file system without locks: collect cannot tell running from dead
                break
        self.handle = handle
        self.values.update(host=socket.gethostname(), pid=os.getpid(), started=_now(), locked=locked)
        self._write()

    def end(self, code: int) -> None:
        self.values.update(exit_code=code, ended=_now())
        self._write()
        if self.handle is not None:
            self.handle.close()  # releases the lock
            self.handle = None

    def _write(self) -> None:
        assert self.handle is not None
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(json.dumps(self.values) + "\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())


def read_record(path: Path) -> dict[str, Any] | None:
    """A task record, or None when there is none or it cannot be parsed; HpcoptError (one line)
    for no regular file (a link included, at its name or at ``logs/``), or one larger than a
    record can be (never read whole)."""
    try:
        with logs_folder(path.parent) as folder:
            data = read_bounded(path, RECORD_KIND, MAX_RECORD_BYTES, folder=folder)
        value = json.loads(data)
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return value if isinstance(value, dict) else None


def lock_held(path: Path) -> bool | None:
    """Whether a running task holds the record's lock; None when that cannot be told;
    HpcoptError for no regular file (as ``read_record``)."""
    try:
        with logs_folder(path.parent) as folder:
            handle = open_regular(path, RECORD_KIND, folder=folder)
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return None
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False
