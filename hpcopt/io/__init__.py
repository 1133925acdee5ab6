"""HDF5 files a run leaves behind: checkpoints (``data_parallel_checkpoint.py``,
``pipeline_checkpoint.py``) and the run trace (``trace.py``); checkpoints are sealed with a
SHA-256 content digest (``digest.py``).

Both are plain HDF5 that h5py opens without hpcopt; their layouts are in docs/formats.md. Files
are data only: numbers, strings, TOML and JSON text, read with tomllib and json, never pickle.
h5py is imported inside functions, so ``import hpcopt`` does not load it. Readers open a file
with ``structure.open_for_reading`` and turn every problem with it into one ``HpcoptError``
line that names the file. This package holds the formats alone: host arrays in and out, no MPI
(the collective parts of saving, restoring and tracing are ``hpcopt.run``'s).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from ..errors import HpcoptError

#: Exceptions h5py and numpy raise on a damaged file or an unexpected object; readers map them
#: to HpcoptError.
READ_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)


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
    """Versions of hpcopt and the libraries that write a file (stored as attributes); a run's
    files also name its MPI (``hpcopt.comm.mpi_support.library_versions``)."""
    import h5py
    import numpy as np

    from .. import __version__

    return {
        "hpcopt_version": __version__,
        "python_version": platform.python_version(),
        "numpy_version": np.__version__,
        "h5py_version": h5py.version.version,
        "hdf5_version": h5py.version.hdf5_version,
    }
