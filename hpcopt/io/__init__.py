"""HDF5 files a run leaves behind: checkpoints (``data_parallel_checkpoint.py``,
``pipeline_checkpoint.py``) and the run trace (``trace.py``); checkpoints are sealed with a
SHA-256 content digest (``digest.py``).

Both are plain HDF5 that h5py opens without hpcopt; their layouts are in docs/formats.md. Files
are data only: numbers, strings, TOML and JSON text, read with tomllib and json, never pickle.
h5py is imported inside functions, so ``import hpcopt`` does not load it. Readers turn every
problem with a file into one ``HpcoptError`` line that names the file.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HpcoptError

if TYPE_CHECKING:
    import h5py

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Exceptions h5py and numpy raise on a damaged file or an unexpected object; readers map them
#: to HpcoptError.
READ_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)


def open_for_reading(path: str | Path, what: str, ratio: float = 1.0, slack: int = 0) -> h5py.File:
    """Open an HDF5 file read-only, or raise a HpcoptError saying why it cannot be a ``what``.

    It must be a regular file (``safe_files.open_regular``), checked without blocking. Before
    anything in it is opened by name, its links and datasets are checked
    (``structure.check_structure``, with ``ratio`` and ``slack`` bounding the data it may
    declare): no link is ever followed out of the file, whoever opens it, vetted or not. File
    locking is off so that a trace can be read while its run is still writing it.
    """
    import h5py

    from .safe_files import open_regular
    from .structure import check_structure

    path = Path(path)
    try:
        with open_regular(path, what) as handle:  # a FIFO or a device: refused, never waited on
            head = handle.read(len(HDF5_SIGNATURE))
    except FileNotFoundError:
        raise HpcoptError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise HpcoptError(f"cannot read {what} {path}: {exc.strerror}") from None
    if head != HDF5_SIGNATURE:
        raise HpcoptError(f"{path} is not an HDF5 file (expected a {what})")
    try:
        f = h5py.File(path, "r", locking=False)
    except READ_ERRORS:
        raise HpcoptError(f"{path} is a damaged or truncated HDF5 file (expected a {what})") from None
    try:
        check_structure(f, path, what, ratio, slack)
    except READ_ERRORS as exc:
        f.close()
        raise HpcoptError(f"{path} is a damaged {what} ({described(exc)})") from None
    except HpcoptError:
        f.close()
        raise
    return f


def check_format(attrs: Any, path: Path, name: str, version: int | tuple[int, ...], what: str) -> None:
    """The file's ``format`` attribute must be ``name`` and ``format_version`` ``version`` (or
    one of them, for a reader of several versions)."""
    found = attrs.get("format")
    if found != name:
        raise HpcoptError(f"{path} is not an hpcopt {what} (format attribute {found!r}, expected {name!r})")
    versions = (version,) if isinstance(version, int) else version
    found_version = attrs.get("format_version")
    if not is_int(found_version) or int(found_version) not in versions:
        shown = found_version.item() if hasattr(found_version, "item") else found_version
        raise HpcoptError(f"{path} has {what} format version {shown!r}; "
                          f"this hpcopt reads version {' or '.join(map(str, versions))}")


def described(exc: BaseException) -> str:
    """An exception in one line, ``TypeError: first line`` (HDF5's messages run over several)."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def human_size(nbytes: float) -> str:
    """A size for messages: ``4.9 kB``, ``0.45 MB``, ``2.15 GB``."""
    if nbytes < 1e6:
        return f"{nbytes / 1e3:.1f} kB"
    return f"{nbytes / 1e6:.2f} MB" if nbytes < 1e9 else f"{nbytes / 1e9:,.2f} GB"


def is_int(value: Any) -> bool:
    """An integer (Python or NumPy), not a bool."""
    import numpy as np

    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def text_attr(attrs: Any, key: str, path: Path) -> str:
    """A string attribute, required."""
    value = attrs.get(key)
    if not isinstance(value, str):
        raise HpcoptError(f"{path}: attribute {key!r} is missing or not text")
    return value


def int_attr(attrs: Any, key: str, path: Path, minimum: int = 0) -> int:
    """An integer attribute >= ``minimum``, required."""
    value = attrs.get(key)
    if not is_int(value) or int(value) < minimum:
        raise HpcoptError(f"{path}: attribute {key!r} is missing or not an integer >= {minimum}")
    return int(value)


def json_attr(attrs: Any, key: str, path: Path) -> Any:
    """A JSON text attribute, parsed (data only)."""
    try:
        return json.loads(text_attr(attrs, key, path))
    except json.JSONDecodeError:
        raise HpcoptError(f"{path}: attribute {key!r} is not valid JSON") from None


def versions() -> dict[str, str]:
    """Versions of hpcopt and the libraries that wrote a file (stored as attributes)."""
    import h5py
    import mpi4py
    import numpy as np

    from .. import __version__
    from ..comm.mpi_support import mpi_library

    return {
        "hpcopt_version": __version__,
        "python_version": platform.python_version(),
        "numpy_version": np.__version__,
        "h5py_version": h5py.version.version,
        "hdf5_version": h5py.version.hdf5_version,
        "mpi4py_version": mpi4py.__version__,
        "mpi_library": mpi_library(),
    }
