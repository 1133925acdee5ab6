"""HDF5 files written so that a failed write (a full disk) ends in one error line, not a crash.

When a write fails, HDF5 carries on: its caches stay dirty, every later flush and close fails
again, h5py reports each failure as an ignored exception when it frees an object, and the
process can die with SIGSEGV when the library shuts down. So hpcopt's writers hand h5py a
``_Sink`` (its ``fileobj`` driver) instead of a path: the first write that fails is remembered,
and it and every write after it are dropped, so HDF5 only ever sees writes that worked and
closes cleanly. The file on disk ends where the failure happened, as if the writer had been
killed there. ``HDF5Writing`` runs the writer's steps, stops at the first failure and raises it
as one HpcoptError line naming the file and the space left on its file system. The sink holds
an exclusive ``flock`` on the file while it is open, as HDF5 does for a writer.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HpcoptError
from . import described, human_size
from .safe_files import open_writable

#: What h5py raises when HDF5 fails to write (or to read back what it wrote).
WRITE_ERRORS = (OSError, RuntimeError)


class HDF5Writing:
    """One HDF5 file being written: ``mode`` "w" creates ``path`` (and its folder), replacing
    what had that name (never writing through a symbolic link), "r+" opens an existing file;
    ``what`` names it in messages ("checkpoint"), as ``shown`` (default ``path``: a temporary
    file is shown as the file it becomes).

    ``attempt(step)`` runs ``step(file)`` unless a step has failed; the first failure is kept
    (``failure``), never raised there, so a writer that must go on receiving data (rank 0 of a
    checkpoint) can. ``check()`` raises it; ``close()`` closes the file and raises it unless
    ``check()`` did; ``publish()`` closes and renames it to ``shown``; ``abandon()`` closes
    quietly and deletes the file.
    """

    def __init__(self, path: Path, mode: str, what: str, shown: Path | None = None,
                 **options: Any) -> None:
        import h5py

        self.path, self.what, self.shown = path, what, shown or path
        self.failure: HpcoptError | None = None
        self.file: Any = None
        self._sink: _Sink | None = None
        self._raised = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._sink = _Sink(path, mode, what)
            self.file = h5py.File(self._sink, mode, **options)
        except WRITE_ERRORS as exc:
            self._failed(exc)

    def attempt(self, step: Callable[[Any], None]) -> None:
        """``step(file)`` unless an earlier step failed (then nothing)."""
        if self.failure is None:
            try:
                step(self.file)
            except WRITE_ERRORS as exc:
                self._failed(exc)
            if self._sink is not None and self._sink.error is not None:
                self._failed(self._sink.error)

    def check(self) -> None:
        """Raise the first failure (HpcoptError), if there was one."""
        if self.failure is not None:
            self._raised = True
            raise self.failure

    def close(self) -> None:
        """Close the file (what was dropped stays dropped), then raise a failure not raised yet."""
        if self.file is not None and self.file.id.valid:
            try:
                self.file.close()
            except WRITE_ERRORS as exc:
                self._failed(exc)
        if self._sink is not None:
            self._sink.close()
            if self._sink.error is not None:
                self._failed(self._sink.error)
        if not self._raised:
            self.check()

    def publish(self) -> None:
        """Close, then make the file the one it is ``shown`` as (``publish``); HpcoptError for
        a failure in any of it."""
        self.close()
        self.check()  # even one raised before: a failed file is never published
        publish(self.path, self.shown, self.what)

    def abandon(self) -> None:
        """Close without raising and delete the file (a write that is not to be published)."""
        self._raised = True
        self.close()
        self.path.unlink(missing_ok=True)

    def _failed(self, exc: BaseException) -> None:
        if self.failure is None:  # the sink's error is the cause of whatever h5py raised after it
            sink_error = self._sink.error if self._sink is not None else None
            self.failure = write_failure(self.shown, self.what, sink_error or exc)


def publish(tmp: Path, path: Path, what: str = "checkpoint") -> None:
    """Make the closed file ``tmp`` the file ``path``: fsync it, rename it over ``path``
    (atomic: a file or symbolic link there is replaced, never written through), fsync the
    directory so the rename survives a crash. HpcoptError (one line) if any of it fails: then
    ``path`` is as it was."""
    try:
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(path.parent)
    except OSError as exc:
        raise write_failure(path, what, exc) from None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_failure(path: Path, what: str, exc: BaseException) -> HpcoptError:
    """``cannot write the WHAT PATH: REASON (SPACE free on its file system)``."""
    strerror = getattr(exc, "strerror", None)  # the system's words (No space left on device)
    reason = strerror.splitlines()[0] if isinstance(strerror, str) and strerror else described(exc)
    try:
        free = f"{human_size(shutil.disk_usage(path.parent).free)} free"
    except OSError:
        free = "free space unknown"
    return HpcoptError(f"cannot write the {what} {path}: {reason} ({free} on its file system)")


class _Sink:
    """The file object h5py writes through: writes go straight to the file (unbuffered) until
    one fails; that one and every later one are dropped (``error`` keeps the first failure)."""

    def __init__(self, path: Path, mode: str, what: str) -> None:
        self.error: OSError | None = None
        if mode == "w":  # a new file: whatever has this name (a planted symlink) is replaced
            path.unlink(missing_ok=True)
            self._raw = open(path, "x+b", buffering=0)  # noqa: SIM115
        else:  # an existing file: a regular one, never through a link (``safe_files``)
            self._raw = io.FileIO(open_writable(path, what), "r+")
        try:
            fcntl.flock(self._raw.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._raw.close()
            raise

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.error is None:
            try:
                written = 0
                while written < view.nbytes:
                    written += self._raw.write(view[written:])
                return written
            except OSError as exc:
                self.error = exc
        self._raw.seek(view.nbytes, os.SEEK_CUR)  # dropped: HDF5 goes on as if it was written
        return view.nbytes

    def readinto(self, buffer: Any) -> int:
        return self._raw.readinto(buffer)

    def read(self, size: int = -1) -> bytes:
        return self._raw.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._raw.truncate(size)
            except OSError as exc:
                self.error = exc
        return self._raw.tell() if size is None else size

    def flush(self) -> None:
        """Nothing to do: nothing is buffered here."""

    def close(self) -> None:
        self._raw.close()
