"""Files in run and study directories, opened as untrusted: anyone who can write there can plant
a FIFO, a device, a socket or a symbolic link where hpcopt expects a file it wrote.

- Reading: ``open_regular`` opens without blocking (``O_NONBLOCK``: a FIFO's open would wait
  for a writer for ever, and no signal handler runs meanwhile) and checks with ``fstat`` that
  it opened a regular file; anything else is one HpcoptError line naming the file and what it
  is. A link to a regular file is read (reading through it writes nothing) unless the caller
  says ``follow=False``: a study's own files, whose links could only have been planted.
  ``read_bounded`` reads at most a given number of bytes: a file that holds more
  (``/dev/zero`` is refused first) is refused, never read whole.
- Folders: ``open_folder`` opens a folder never through a link at its name; the files in it
  are then opened relative to its descriptor (``folder=``, never through a link either), so a
  link planted at the folder's name (a study's ``logs/``) cannot lead reads or writes elsewhere,
  even one planted after the check.
- Writing: ``replacing`` writes a new file under a random name in the target's own directory
  (created with ``O_EXCL``: never through a link planted there) and renames it over the
  target, so a link at the target's name is replaced, never followed. ``open_writable`` opens
  a file for update without following a link at its name. ``publish`` makes a finished file
  the target atomically (fsynced, renamed, the directory fsynced).
- HDF5 files written so that a failed write (a full disk) ends in one error line, not a crash.
  When a write fails, HDF5 carries on: its caches stay dirty, every later flush and close fails
  again, h5py reports each failure as an ignored exception when it frees an object, and the
  process can die with SIGSEGV when the library shuts down. So hpcopt's writers hand h5py a
  ``_Sink`` (its ``fileobj`` driver) instead of a path: the first write that fails is
  remembered, and it and every write after it are dropped, so HDF5 only ever sees writes that
  worked and closes cleanly. The file on disk ends where the failure happened, as if the writer
  had been killed there. ``HDF5Writing`` runs the writer's steps, stops at the first failure
  and raises it as one HpcoptError line naming the file and the space left on its file system
  (``write_failure``). The sink holds an exclusive ``flock`` on the file while it is open, as
  HDF5 does for a writer.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import HpcoptError
from . import described, human_size

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1 << 16  # bytes ``read_bounded`` reads at a time


def kind(mode: int) -> str:
    """What a file of mode ``mode`` is, for messages: "a FIFO", "a regular file", ..."""
    return _KINDS.get(stat.S_IFMT(mode), "a regular file" if stat.S_ISREG(mode) else "a special file")


def open_regular(path: Path, what: str, *, follow: bool = True, folder: int | None = None) -> IO[bytes]:
    """``path`` opened for reading once it is known to be a regular file (module docstring);
    HpcoptError naming the file otherwise, a symbolic link at its name included unless
    ``follow``. ``folder``: the descriptor of ``path``'s folder (``open_folder``), which its name
    is opened in, never through a link. FileNotFoundError when there is none."""
    no_link = not follow or folder is not None
    try:
        fd = os.open(path if folder is None else path.name, _READ_FLAGS | (os.O_NOFOLLOW if no_link else 0),
                     dir_fd=folder)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a socket: ENXIO; no permission; a link, when not followed: ELOOP
        raise _refusal(path, what, "read", exc, folder, follow=not no_link) from None
    return os.fdopen(_regular(fd, path, what), "rb")


def check_regular(path: Path, what: str) -> os.stat_result:
    """``path``'s status once it is known to be a regular file (``open_regular``): what a reader
    that opens it by name (h5py) checks first."""
    with open_regular(path, what) as handle:
        return os.fstat(handle.fileno())


def read_bounded(path: Path, what: str, limit: int, *, follow: bool = True,
                 folder: int | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: HpcoptError for a larger
    file or one that is not regular (``open_regular``, with ``follow`` and ``folder``).
    FileNotFoundError when there is none."""
    data = bytearray()  # grown a chunk at a time: memory follows the file, not the limit
    with open_regular(path, what, follow=follow, folder=folder) as handle:
        while len(data) <= limit and (chunk := handle.read(min(limit + 1 - len(data), _CHUNK))):
            data += chunk
    if len(data) > limit:
        raise HpcoptError(f"{path} holds more than {human_size(limit)}, more than a {what} holds")
    return bytes(data)


def open_writable(path: Path, what: str, create: bool = False, folder: int | None = None) -> int:
    """A descriptor of ``path`` opened for reading and writing (created when ``create``): never
    through a link at its name (``O_NOFOLLOW``), never blocking, and only a regular file
    (HpcoptError otherwise). ``folder``: as for ``open_regular``."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path if folder is None else path.name, flags | (os.O_CREAT if create else 0), 0o644,
                     dir_fd=folder)
    except OSError as exc:
        raise _refusal(path, what, "open", exc, folder) from None
    fd = _regular(fd, path, what)
    os.set_blocking(fd, True)
    return fd


def open_folder(path: Path, what: str, create: bool = False) -> int:
    """A descriptor of the folder ``path`` (made first, with its parents, when ``create``), never
    through a link at its name: HpcoptError for a link or anything else that is not a folder.
    FileNotFoundError when there is none. The caller closes it."""
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)  # a link to a folder passes: refused below
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = stat.S_IFDIR
        if not stat.S_ISDIR(mode):  # O_NOFOLLOW with O_DIRECTORY: ENOTDIR for a link too
            raise HpcoptError(f"{path} is {kind(mode)}, not a folder (expected the {what})") from None
        raise HpcoptError(f"cannot open the {what} {path}: {exc.strerror or exc}") from None


def _regular(fd: int, path: Path, what: str) -> int:
    """``fd``, once ``fstat`` shows a regular file; else it is closed and HpcoptError raised."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise HpcoptError(f"{path} is {kind(mode)}, not a regular file (expected a {what})")
    return fd


def _refusal(path: Path, what: str, verb: str, exc: OSError, folder: int | None = None, *,
             follow: bool = False) -> HpcoptError:
    """Why ``path`` (in the folder of descriptor ``folder``, if any) could not be opened, in one
    line: a link (``O_NOFOLLOW``'s ELOOP), a socket (ENXIO: what it is, not the system's "No
    such device or address") or the system's words."""
    if exc.errno == errno.ELOOP:
        return HpcoptError(f"{path} is a symbolic link, not a regular file (expected a {what})")
    if exc.errno == errno.ENXIO:
        with contextlib.suppress(OSError):
            name = path if folder is None else path.name
            mode = os.stat(name, dir_fd=folder, follow_symlinks=follow).st_mode
            if not stat.S_ISREG(mode):
                return HpcoptError(f"{path} is {kind(mode)}, not a regular file (expected a {what})")
    return HpcoptError(f"cannot {verb} the {what} {path}: {exc.strerror or exc}")


@contextlib.contextmanager
def replacing(path: Path, what: str, mode: str = "w") -> Iterator[IO]:
    """A new file (opened with ``mode``, "w" or "wb") that becomes ``path`` when the block ends
    without an exception (``writing.publish``: fsynced, renamed, the directory fsynced); the
    temporary file is removed when it raises. OSError is one HpcoptError line naming ``path``."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:  # O_EXCL: a new file, whatever was planted; its mode as any file's (the umask's)
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise write_failure(path, what, exc) from None
    try:
        with os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, newline="") as handle:
            yield handle
        publish(tmp, path, what)
    except OSError as exc:
        raise write_failure(path, what, exc) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_replacing(path: Path, text: str, what: str) -> None:
    """``path`` replaced by a file holding ``text`` (``replacing``)."""
    with replacing(path, what) as handle:
        handle.write(text)

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
