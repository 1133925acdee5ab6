"""What an hpcopt HDF5 file may hold, checked before any object in it is opened by name.

Checkpoints, traces and exported state_dicts hold groups and plain datasets, each reached by
exactly one hard link, with their data inside the file. ``check_structure`` walks the file's
links without following any and refuses (HpcoptError, one line naming the file and the object):

- soft, external and user-defined links: following one can open another file (another run's
  trace, which a resumed run would then write to), or a FIFO, where the open blocks for ever;
- an object reached by two links (a loop), and named datatypes;
- virtual datasets (a missing source reads as zeros) and data stored in external files;
- any filter but Fletcher-32, the only one hpcopt writes: a filter plugin is code loaded from
  a shared library, and compressed data can declare far more than it stores;
- more declared data than the file can hold: the datasets' declared bytes (shape times item
  size, counted per link) must not exceed ``ratio`` times the file's size plus ``slack``, so
  reading, hashing or vetting a file costs memory and time in proportion to its real size,
  never to what a few header bytes declare. Nor may they exceed ``ALLOCATED_RATIO`` times the
  blocks allocated to it (``st_blocks``) plus ``ALLOCATED_SLACK``, since a sparse file
  (``truncate -s 2G``) has a length that costs nothing and reads as zeros. That second bound
  is loose on purpose: a compressing file system (ZFS, btrfs) allocates fewer blocks than a
  genuine file's length, and none for its runs of zeros (a zero momentum buffer).

The walk opens each object by its own hard link (never by a path through another link) and
reads only object headers, so it costs time in proportion to the file's metadata. Every reader
opens its file with ``open_for_reading``, which checks this first.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HpcoptError
from . import READ_ERRORS, described, human_size
from .safe_files import open_regular

if TYPE_CHECKING:
    import h5py

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"

#: How much more data than its allocated blocks hold a file may declare, and the slack on top:
#: room for a compressing file system and zero buffers, none for a sparse file's empty length.
ALLOCATED_RATIO, ALLOCATED_SLACK = 64, 64 * 2**20
#: The filters hpcopt writes (HDF5's filter ids): Fletcher-32 checksums (``H5Z_FILTER_FLETCHER32``).
FLETCHER32 = 3
ALLOWED_FILTERS = {FLETCHER32: "Fletcher-32"}


def open_for_reading(path: str | Path, what: str, ratio: float = 1.0, slack: int = 0) -> h5py.File:
    """Open an HDF5 file read-only, or raise a HpcoptError saying why it cannot be a ``what``.

    It must be a regular file (``safe_files.open_regular``), checked without blocking. Before
    anything in it is opened by name, its links and datasets are checked
    (``check_structure``, with ``ratio`` and ``slack`` bounding the data it may
    declare): no link is ever followed out of the file, whoever opens it, vetted or not. File
    locking is off so that a trace can be read while its run is still writing it.
    """
    import h5py

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


def check_structure(f: Any, path: Path, what: str, ratio: float = 1.0, slack: int = 0) -> None:
    """HpcoptError unless the open HDF5 file ``f`` (a ``what``, read from ``path``) holds only
    hard-linked groups and plain datasets whose declared data fit the file (module docstring)."""
    import h5py

    status = path.stat()
    size = min(status.st_size, ALLOCATED_SLACK + ALLOCATED_RATIO * allocated_bytes(status))
    declared = 0
    seen = {_address(f.id)}
    groups = [("", f.id)]
    while groups:
        prefix, group = groups.pop()
        for raw, kind in _links(group):
            name = f"{prefix}/{raw.decode('utf-8', 'replace')}"
            if kind != h5py.h5l.TYPE_HARD:
                link = {h5py.h5l.TYPE_SOFT: "a soft link", h5py.h5l.TYPE_EXTERNAL: "an external link"}
                raise HpcoptError(f"{path}: {name} is {link.get(kind, 'a user-defined link')}; "
                                  f"an hpcopt {what} holds only plain groups and datasets")
            child = h5py.h5o.open(group, raw)
            address = _address(child)
            if address in seen:
                raise HpcoptError(f"{path}: {name} links to an object already linked elsewhere "
                                  f"(an hpcopt {what} links each object once)")
            seen.add(address)
            if isinstance(child, h5py.h5g.GroupID):
                groups.append((name, child))
            elif isinstance(child, h5py.h5d.DatasetID):
                declared += _declared_bytes(child, name, path, what)
            else:
                raise HpcoptError(f"{path}: {name} is a named datatype; an hpcopt {what} holds "
                                  "only plain groups and datasets")
    if declared > ratio * size + slack:
        raise HpcoptError(f"{path}: its datasets declare {human_size(declared)} of data but the "
                          f"file holds {human_size(size)} (a damaged or crafted {what})")


def allocated_bytes(status: os.stat_result) -> int:
    """The bytes allocated to a file on disk (``st_blocks`` counts 512-byte units; the holes of
    a sparse file take none), or its length where the system does not say."""
    blocks = getattr(status, "st_blocks", None)
    return status.st_size if blocks is None else blocks * 512


def _links(group: Any) -> list[tuple[bytes, int]]:
    """(name, link type) of every link in ``group``, none followed."""
    found: list[tuple[bytes, int]] = []
    group.links.iterate(lambda name, info: found.append((name, info.type)), info=True)
    return found


def _address(obj: Any) -> tuple[int, int]:
    import h5py

    info = h5py.h5o.get_info(obj)
    return info.fileno, info.addr


def _declared_bytes(dataset: Any, name: str, path: Path, what: str) -> int:
    """The bytes ``dataset`` declares, once its layout and filters are known to be plain."""
    import h5py

    plist = dataset.get_create_plist()
    if plist.get_layout() not in (h5py.h5d.COMPACT, h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED):
        raise HpcoptError(f"{path}: {name} is a virtual dataset (its data lie in other files); "
                          f"an hpcopt {what} holds only plain datasets")
    if plist.get_external_count():
        raise HpcoptError(f"{path}: {name} keeps its data in an external file; "
                          f"an hpcopt {what} holds only plain datasets")
    for i in range(plist.get_nfilters()):
        code, _, _, label = plist.get_filter(i)
        if code not in ALLOWED_FILTERS:
            shown = label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
            raise HpcoptError(f"{path}: {name} uses the filter {shown or code} (id {code}); "
                              f"an hpcopt {what} uses only {', '.join(ALLOWED_FILTERS.values())}")
    return int(dataset.get_space().get_simple_extent_npoints()) * int(dataset.get_type().get_size())
