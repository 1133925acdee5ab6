"""One job at a time in a run directory: ``OUT/hpcopt.lock``, held by rank 0 for the job's life.

Why a lock file created with ``O_EXCL`` rather than ``fcntl``/``flock``: run directories live
on shared file systems (NFS, Lustre, GPFS), where kernel locks are exactly what cannot be
relied on. NFS mounted ``nolock`` or ``local_lock=flock``, and Lustre mounted ``localflock``
(or without ``flock``), give locks that hold on one node only, or fail with ENOLCK or ENOSYS:
a second job on another node would then see a free directory and become a second writer.
Creating a file with ``O_CREAT | O_EXCL`` is atomic on every one of them (NFS since version
3), and the file is visible from every node. Only rank 0 creates it (the only rank that writes
the run's files), so ranks on other nodes never touch it.

The file holds its holder as JSON: host name, process id, the process's start time and the
host's boot id (Linux ``/proc``), the run id and when it was taken; the holder refreshes its
modification time every ``HEARTBEAT_SECONDS``. It is removed when the job ends by any path
that unwinds (an error, a crash that aborts the job, SIGTERM, Ctrl-C). A job killed outright
(``kill -9``, MPI_Abort from another rank, a lost node) leaves it behind, and the next job
takes it over once it is stale: on the same host as soon as that process is gone (ended, even
if not yet reaped, or being killed; or the host rebooted, or the process id now names a newer
process); from another host, whose processes
cannot be checked, once it has not been refreshed for ``STALE_SECONDS``. Until then a second
job is refused with one line naming the holder (host, pid) and the file to delete if that job
is known to be gone. Taking over a stale lock is serialized by a second file created the same
way (``hpcopt.lock.break``), so two jobs that find the same stale lock cannot both win. (A job
suspended for longer than ``STALE_SECONDS`` on another host would lose its lock.)

When a job ends, rank 0 removes the file before it exits, also where it ends the job itself
(a stop signal outside the training loop: ``release_held``), so that a requeue started as soon
as the launcher returns finds the directory free. Open MPI's ``mpirun`` can return while a
rank it is killing (after another rank's exit) still runs: a holder on this host that is
still running is therefore waited for up to ``HANDOVER_SECONDS`` before the job is refused.
Where rank 0 is lost under ``--on-rank-loss continue``, the lowest survivor removes its lock
(``release_lost``: the lock that names rank 0's token).

A job that creates the file but cannot write its holder (a full disk) removes it and ends with
one line. A lock file naming no holder (empty, unreadable) is refused while it is new, and
taken over once unchanged for ``ABANDONED_SECONDS`` (its job would have written it at once).
Anything but a regular file there (a FIFO) is refused without waiting on it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import stat
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import HpcoptError
from ..io.safe_files import open_regular, write_failure

FILE_NAME = "hpcopt.lock"
BREAK_SUFFIX = ".break"
HEARTBEAT_SECONDS = 60.0
STALE_SECONDS = 600.0
#: Largest lock file read: a holder's JSON is about 250 bytes.
MAX_BYTES = 4096
#: Seconds a job waits for a holder on this host that still runs to end or let go (a stopped
#: job's rank 0 still exiting after its launcher returned) before it is refused.
HANDOVER_SECONDS = 5.0
#: Seconds after which a lock file naming no holder (empty: its job could not write it) is stale.
ABANDONED_SECONDS = 10.0
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Holder:
    """Who holds a lock file: ``token`` is unique to one taking of it."""

    host: str
    pid: int
    started: str    # the process's start time (Linux: clock ticks after boot); "" where unknown
    boot: str       # the host's boot id; "" where unknown
    run_id: str
    since: str
    token: str

    @staticmethod
    def this_process(run_id: str) -> Holder:
        pid = os.getpid()
        return Holder(socket.gethostname(), pid, _process_start(pid), _boot_id(), run_id,
                      datetime.datetime.now().isoformat(timespec="seconds"), uuid.uuid4().hex)

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {self.since}"

    def running(self) -> bool | None:
        """Whether the holding process still runs; None when that cannot be known here (it
        ran on another host)."""
        if self.host != socket.gethostname():
            return None
        if self.boot and self.boot != _boot_id():
            return False  # the host rebooted since
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process
            pass
        if _ending(self.pid):
            return False
        return not (self.started and self.started != _process_start(self.pid))  # a reused pid


class RunLock:
    """The lock on one run directory, held (and refreshed) by this process until ``release``."""

    def __init__(self, path: Path, holder: Holder) -> None:
        self.path, self.holder = path, holder
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._refresh, name="hpcopt-lock", daemon=True)
        self._heartbeat.start()
        _HELD.append(self)

    @staticmethod
    def acquire(directory: Path, run_id: str) -> RunLock:
        """Take ``directory``'s lock (taking over a stale one); HpcoptError, one line naming the
        holder, when another job holds it."""
        path = directory / FILE_NAME
        holder = Holder.this_process(run_id)
        for _ in range(4):  # a stale break file and a stale lock removed, then a new attempt
            if _create(path, holder):
                return RunLock(path, holder)
            found = _read(path)
            if found is None:
                continue  # deleted since: try again
            refusal = _refusal(path, found)
            if refusal is not None:
                raise refusal
            _break(path, found, holder)
        raise HpcoptError(f"{directory}: its lock {path} keeps changing hands; is another job "
                          "starting there?")

    def _refresh(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        """Stop refreshing and remove the lock file, if it is still this job's."""
        with contextlib.suppress(ValueError):  # released already
            _HELD.remove(self)
        self._stop.set()
        self._heartbeat.join()
        try:
            found = _read(self.path)
        except HpcoptError:  # replaced by something that is not a file: not this job's
            return
        if isinstance(found, Holder) and found.token == self.holder.token:
            self.path.unlink(missing_ok=True)


#: The locks this process holds (rank 0 of a job holds one).
_HELD: list[RunLock] = []


def release_held() -> None:
    """Release every lock this process holds: called by a thread that ends the job at once
    (``hpcopt.run.signals``), while the main thread may still hold one."""
    for lock in tuple(_HELD):
        lock.release()


def release_lost(directory: Path, token: str, run_id: str) -> None:
    """Remove ``directory``'s lock if it is still the one taken with ``token`` (``Holder.token``):
    its holder, rank 0 of a job whose survivors saw it lost (``--on-rank-loss continue``), cannot,
    and from another host it would look held for ``STALE_SECONDS``. Taken over as a stale lock is
    (``_break``); HpcoptError as there."""
    path = directory / FILE_NAME
    found = _read(path)
    if isinstance(found, Holder) and found.token == token:
        _break(path, found, Holder.this_process(run_id))


def check_free(directory: Path) -> None:
    """HpcoptError naming the holder if another job holds ``directory``'s lock; takes nothing
    (a stale lock is left for ``RunLock.acquire`` to take over). A resumed job checks this
    before it reads a checkpoint that the job in there may be about to prune."""
    path = directory / FILE_NAME
    found = _read(path)
    refusal = None if found is None else _refusal(path, found)
    if refusal is not None:
        raise refusal


def _refusal(path: Path, found: Holder | str) -> HpcoptError | None:
    """Why lock file ``path``, naming ``found``, keeps another job out; None when it is stale."""
    directory = path.parent
    if isinstance(found, str):
        if _abandoned(path):
            return None
        return HpcoptError(f"{directory} is locked, but {path} names no holder ({found}); if no "
                           f"job uses {directory}, delete {path}")
    gone = _gone(path, found)
    if gone is False and _let_go(path, found):
        return None
    if gone is None:
        return HpcoptError(f"{directory} is in use by another job ({found.describe()}); a lock "
                           f"from another host is taken over once it has not been refreshed for "
                           f"{STALE_SECONDS / 60:.0f} minutes, or delete {path} if that job has ended")
    if not gone:
        return HpcoptError(f"{directory} is in use by another job ({found.describe()})")
    return None


def _gone(path: Path, holder: Holder) -> bool | None:
    """Whether the job that wrote ``path`` (naming ``holder``) is gone: on this host, whether
    its process is; from another host, once the file has not been refreshed for
    ``STALE_SECONDS`` (None before: not known yet)."""
    running = holder.running()
    if running is not None:
        return not running
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return None
    return True if age > STALE_SECONDS else None


def _let_go(path: Path, holder: Holder) -> bool:
    """Whether ``holder``, running on this host, lets go of lock file ``path`` (removes it or
    ends) within ``HANDOVER_SECONDS``."""
    deadline = time.monotonic() + HANDOVER_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.05)
        current = _read(path)
        if not (isinstance(current, Holder) and current.token == holder.token) or _gone(path, holder):
            return True
    return False


def _create(path: Path, holder: Holder) -> bool:
    """Create ``path`` holding ``holder`` if it does not exist (atomically); False if it does.
    A holder that cannot be written (a full disk) is one HpcoptError line, the file removed."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError as exc:
        raise HpcoptError(f"cannot create the lock file {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(holder), handle)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise write_failure(path, "lock file", exc) from None
    return True


def _read(path: Path) -> Holder | str | None:
    """The holder ``path`` names; a string saying what is wrong with it when it names none;
    None when there is no such file. Retried briefly while it is empty: its creator writes it
    just after creating it."""
    for _ in range(20):
        try:
            with open_regular(path, "lock file") as handle:  # a FIFO: refused, never waited on
                raw = handle.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"unreadable: {exc.strerror or exc}"
        if raw:
            return _parse(raw)
        if _abandoned(path):
            break
        time.sleep(0.05)
    return "empty"


def _parse(raw: bytes) -> Holder | str:
    """The holder a lock file's bytes name (every field, of its type, printable), or why not."""
    try:
        values: Any = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_BYTES else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        values = None
    names = Holder.__dataclass_fields__
    if not (isinstance(values, dict) and set(values) == set(names)
            and isinstance(values["pid"], int) and not isinstance(values["pid"], bool)
            and all(isinstance(values[n], str) and values[n].isprintable() for n in names if n != "pid")):
        return "not a holder's record"
    return Holder(**values)


def _break(path: Path, stale: Holder | str, breaker: Holder) -> None:
    """Remove ``path`` if it still names ``stale`` (or, naming no holder, is still abandoned),
    holding the break file (one job at a time)."""
    guard = path.with_name(path.name + BREAK_SUFFIX)
    if not _create(guard, breaker):
        found = _read(guard)
        if found is None or (isinstance(found, Holder) and _gone(guard, found)):
            guard.unlink(missing_ok=True)  # gone, or left by a job that died breaking a lock
            return
        where = f" ({found.describe()})" if isinstance(found, Holder) else ""
        raise HpcoptError(f"{path.parent}: another job{where} is taking over its stale lock; if "
                          f"no job uses {path.parent}, delete {path} and {guard}")
    try:
        current = _read(path)
        if isinstance(stale, Holder):
            still = isinstance(current, Holder) and current.token == stale.token
        else:
            still = isinstance(current, str) and _abandoned(path)
        if still:
            path.unlink(missing_ok=True)
    finally:
        guard.unlink(missing_ok=True)


def _abandoned(path: Path) -> bool:
    """Whether ``path``, a regular file naming no holder (empty, unreadable, not a holder's
    record), has not changed for ``ABANDONED_SECONDS``: no job is about to write its holder
    (a job writes it at once), so it is what a job that failed to (a full disk) left behind."""
    try:
        status = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(status.st_mode) and time.time() - status.st_mtime > ABANDONED_SECONDS


def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _ending(pid: int) -> bool:
    """Whether process ``pid`` has ended but is not reaped yet (a zombie: what MPI_Abort leaves
    for a moment after the launcher exits) or is being killed (SIGKILL pending); Linux
    ``/proc/PID/status``, False where unknown."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return False
    fields = {name: value.strip() for name, _, value in (line.partition(":") for line in lines)}
    try:
        pending = int(fields.get("SigPnd", "0"), 16) | int(fields.get("ShdPnd", "0"), 16)
    except ValueError:
        pending = 0
    return fields.get("State", "")[:1] in ("Z", "X") or bool(pending >> (signal.SIGKILL - 1) & 1)


def _process_start(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks after boot (``/proc/PID/stat`` field
    22); "" where there is no ``/proc`` or no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""
