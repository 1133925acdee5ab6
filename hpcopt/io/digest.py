"""An end-to-end content digest of an HDF5 file: SHA-256 over a canonical serialization of
everything in it, stored as the root attribute ``content_sha256``.

HDF5's Fletcher-32 covers dataset chunks only; attributes and the chunk metadata are not
checksummed, so a few damaged bytes there could load as different values. The digest covers
what a reader sees: every attribute (name and value) of every object except the digest itself,
and every group and dataset path, in sorted order, with each dataset's dtype, shape and bytes.
It is computed when a writer commits (reading back what it wrote) and checked by a reader
before it trusts anything else in the file. Serialization (docs/formats.md): a sequence of
fields, each an 8-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HpcoptError

ATTRIBUTE = "content_sha256"
BLOCK_BYTES = 1 << 22  # datasets are hashed 4 MB at a time: memory stays flat in the file size


def content_digest(f: Any) -> str:
    """The SHA-256 (hex) of the canonical serialization of an open HDF5 file ``f``."""
    import h5py

    digest = hashlib.sha256()

    def field(*parts: bytes) -> None:
        for part in parts:
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)

    names: list[str] = []
    f.visit(names.append)
    for name in ["/", *sorted(names)]:
        obj = f[name]
        if isinstance(obj, h5py.Dataset):
            field(b"dataset", _name(name), obj.dtype.str.encode(), repr(obj.shape).encode())
            _dataset_values(obj, digest, field)
        elif isinstance(obj, h5py.Group):
            field(b"group", _name(name))
        else:  # a named datatype, or anything else a writer of ours never makes
            field(b"other", _name(name), type(obj).__name__.encode())
        for key in sorted(obj.attrs):
            if name == "/" and key == ATTRIBUTE:
                continue
            field(b"attribute", _name(key))
            _value(obj.attrs[key], field)
    return digest.hexdigest()


def _name(name: str | bytes) -> bytes:
    """An object or attribute name as bytes (h5py gives bytes for names that are not UTF-8)."""
    return name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")


def _dataset_values(dataset: Any, digest: Any, field: Any) -> None:
    """A dataset's values: the field ``values``, then its bytes in C order as one field, read a
    block of leading-axis rows at a time (a scalar, empty or text dataset: one ``_value``)."""
    if dataset.ndim == 0 or dataset.size == 0 or dataset.dtype.kind == "O":
        _value(dataset[()], field)
        return
    total = dataset.dtype.itemsize * dataset.size
    field(b"values")
    digest.update(total.to_bytes(8, "little"))
    step = max(1, BLOCK_BYTES // (total // dataset.shape[0]))
    for start in range(0, dataset.shape[0], step):
        block = np.ascontiguousarray(dataset[start:start + step])
        if block.dtype != dataset.dtype:
            raise TypeError(f"{dataset.name} reads as {block.dtype}, stored as {dataset.dtype}")
        digest.update(block.tobytes())


def _value(value: Any, field: Any) -> None:
    """One attribute or dataset value: text, bytes, or a NumPy array (object arrays element-wise)."""
    if isinstance(value, str):
        field(b"str", value.encode("utf-8", "surrogateescape"))
    elif isinstance(value, bytes):
        field(b"bytes", value)
    else:
        array = np.asarray(value)
        if array.dtype.kind == "O":
            field(b"objects", repr(array.shape).encode())
            for item in array.ravel():
                if not isinstance(item, (str, bytes)):
                    raise TypeError(f"unsupported value of type {type(item).__name__}")
                _value(item, field)
        else:
            field(b"array", array.dtype.str.encode(), repr(array.shape).encode(),
                  np.ascontiguousarray(array).tobytes())


def seal(f: Any) -> None:
    """Store the digest of an open, writable file as its root attribute ``content_sha256``
    (the last change a writer makes before closing)."""
    f.flush()
    f.attrs[ATTRIBUTE] = content_digest(f)


def verify(f: Any, path: Path, what: str) -> None:
    """Raise HpcoptError (naming ``path``) unless ``f``'s stored digest matches its contents."""
    stored = f.attrs.get(ATTRIBUTE)
    if not isinstance(stored, str):
        raise HpcoptError(f"{path} is a damaged {what} (content digest missing)")
    if content_digest(f) != stored:
        raise HpcoptError(f"{path} is a damaged {what} (content digest mismatch)")


def check_sealed(f: Any, path: Path, name: str, version: int | tuple[int, ...], kind: str) -> None:
    """The first check of a checkpoint reader: the content digest, then the format (``name``,
    exactly ``version``; ``kind`` names it in messages).

    A file without the digest gets the format check's message when it is an older version
    (written before the digest) or another kind of file, and "content digest missing" otherwise.
    """
    from . import check_format

    if ATTRIBUTE not in f.attrs:
        check_format(f.attrs, path, name, version, kind)
    verify(f, path, "checkpoint")
    check_format(f.attrs, path, name, version, kind)


def damaged(path: Path, exc: BaseException) -> HpcoptError:
    """The error for a checkpoint that h5py or numpy could not read as it claims to be."""
    return HpcoptError(f"{path} is a damaged checkpoint ({type(exc).__name__}: {exc})")


def refuse_damaged(f: Any, path: Path, name: str, version: int | tuple[int, ...], kind: str,
                   error: HpcoptError) -> HpcoptError:
    """``error``, found by a reader that looked at part of ``f`` before verifying its digest,
    unless the file is damaged: then the digest's (or the format's) error instead."""
    from . import READ_ERRORS

    try:
        check_sealed(f, path, name, version, kind)
    except HpcoptError as refused:
        return refused
    except READ_ERRORS as exc:
        return damaged(path, exc)
    return error
