"""Files in run and study directories, opened as untrusted: anyone who can write there can plant
a FIFO, a device, a socket or a symbolic link where hpcopt expects a file it wrote.

- Reading: ``open_regular`` opens without blocking (``O_NONBLOCK``: a FIFO's open would wait
  for a writer for ever, and no signal handler runs meanwhile) and checks with ``fstat`` that
  it opened a regular file; anything else is one HpcoptError line naming the file and what it
  is. A link to a regular file is read (reading through it writes nothing). ``read_bounded``
  reads at most a given number of bytes: a file that holds more (``/dev/zero`` is refused
  first) is refused, never read whole.
- Writing: ``replacing`` writes a new file under a random name in the target's own directory
  (created with ``O_EXCL``: never through a link planted there) and renames it over the
  target, so a link at the target's name is replaced, never followed. ``open_writable`` opens
  a file for update without following a link at its name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ..errors import HpcoptError
from . import human_size

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def kind(mode: int) -> str:
    """What a file of mode ``mode`` is, for messages: "a FIFO", "a regular file", ..."""
    return _KINDS.get(stat.S_IFMT(mode), "a regular file" if stat.S_ISREG(mode) else "a special file")


def open_regular(path: Path, what: str) -> IO[bytes]:
    """``path`` opened for reading once it is known to be a regular file (module docstring);
    HpcoptError naming the file otherwise. FileNotFoundError when there is none."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a socket: ENXIO; no permission
        raise HpcoptError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise HpcoptError(f"{path} is {kind(mode)}, not a regular file (expected a {what})")
    return os.fdopen(fd, "rb")


def check_regular(path: Path, what: str) -> os.stat_result:
    """``path``'s status once it is known to be a regular file (``open_regular``): what a reader
    that opens it by name (h5py) checks first."""
    with open_regular(path, what) as handle:
        return os.fstat(handle.fileno())


def read_bounded(path: Path, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: HpcoptError for a larger
    file or one that is not regular. FileNotFoundError when there is none."""
    with open_regular(path, what) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise HpcoptError(f"{path} holds more than {human_size(limit)}, more than a {what} holds")
    return data


def open_writable(path: Path, what: str, create: bool = False) -> int:
    """A descriptor of ``path`` opened for reading and writing (created when ``create``): never
    through a link at its name (``O_NOFOLLOW``), never blocking, and only a regular file
    (HpcoptError otherwise)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | (os.O_CREAT if create else 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HpcoptError(f"{path} is a symbolic link, not a regular file (expected a {what})") from None
        raise HpcoptError(f"cannot open the {what} {path}: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise HpcoptError(f"{path} is {kind(mode)}, not a regular file (expected a {what})")
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def replacing(path: Path, what: str, mode: str = "w") -> Iterator[IO]:
    """A new file (opened with ``mode``, "w" or "wb") that becomes ``path`` when the block ends
    without an exception (``writing.publish``: fsynced, renamed, the directory fsynced); the
    temporary file is removed when it raises. OSError is one HpcoptError line naming ``path``."""
    from .writing import publish, write_failure

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
