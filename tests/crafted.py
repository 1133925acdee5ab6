"""Crafted files for the trust tests: one function per kind of hostile or damaged checkpoint,
trace or state_dict file, each built from a real file the test made and returning its path.

A crafted file that should pass the content digest is resealed (``reseal``), as an attacker
with ``hpcopt.io.digest.seal`` would, so the refusals tested are those of the checks behind
the digest, not of the digest itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py

from hpcopt.io.digest import seal


def reseal(path: Path) -> Path:
    """``path`` with its content digest recomputed over what it holds now."""
    with h5py.File(path, "r+") as f:
        seal(f)
    return path


def _with_stored_config(source: Path, dest: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of checkpoint ``source`` at ``dest`` whose stored config ``edit`` changed, resealed."""
    import shutil

    from hpcopt.config import config_from_stored, to_toml, tomllib

    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    with h5py.File(dest, "r+") as f:
        values = tomllib.loads(f.attrs["config"])
        edit(values)
        f.attrs["config"] = to_toml(config_from_stored(values))
    return reseal(dest)


def checkpoint_naming_a_module(source: Path, dest: Path, spec: str) -> Path:
    """A copy of a built-in model's checkpoint whose stored ``model`` is ``spec``
    (``torch:MODULE:FUNCTION``, the MLP's ``hidden`` dropped), resealed: resuming it must not
    import MODULE."""

    def edit(values: dict[str, Any]) -> None:
        values["model"]["model"] = spec
        values["model"].pop("hidden", None)

    return _with_stored_config(source, dest, edit)


def checkpoint_with_foreign_out(source: Path, dest: Path, victim: Path) -> Path:
    """A copy of a checkpoint whose stored ``[run] out`` is another run's directory ``victim``,
    with ``trace = false`` and ``keep_checkpoints = 1`` (so a run in it would prune all but
    one of the victim's checkpoints), resealed."""

    def edit(values: dict[str, Any]) -> None:
        values["run"].update(out=str(victim), trace=False, keep_checkpoints=1)

    return _with_stored_config(source, dest, edit)


def lock_file(directory: Path, host: str, pid: int, age_seconds: float = 0.0, **fields: Any) -> Path:
    """``directory``'s lock file naming the holder ``host``, ``pid`` (other fields as given, or
    plausible), last refreshed ``age_seconds`` ago."""
    import json
    import time

    from hpcopt.run.lock import FILE_NAME

    path = directory / FILE_NAME
    record = {"host": host, "pid": pid, "started": "", "boot": "", "run_id": "0" * 32,
              "since": "2026-01-01T00:00:00", "token": "1" * 32, **fields}
    path.write_text(json.dumps(record))
    when = time.time() - age_seconds
    os.utime(path, (when, when))
    return path


# -- what a file points at or declares (hpcopt.io.structure refuses each) -----------------------

def _sealed_again(path: Path) -> Path:
    """``reseal`` a checkpoint (a file with a content digest); other files as they are."""
    from hpcopt.io.digest import ATTRIBUTE

    with h5py.File(path, "r") as f:
        sealed = ATTRIBUTE in f.attrs
    return reseal(path) if sealed else path


def _rewrite(path: Path, name: str, make) -> Path:
    """Dataset ``name`` replaced by ``make(f, name, values)`` (its attributes kept), resealed."""
    with h5py.File(path, "r+") as f:
        values, attrs = f[name][()], dict(f[name].attrs)
        del f[name]
        make(f, name, values)
        if isinstance(f.get(name, getlink=True), h5py.HardLink):  # never follow the others
            f[name].attrs.update(attrs)
    return _sealed_again(path)


def soft_link(path: Path, name: str) -> Path:
    """``name`` moved to ``/moved`` and replaced by a soft link to it (readers following links
    read the same values)."""
    def make(f, name, values):
        f["moved"] = values
        f[name] = h5py.SoftLink("/moved")
    return _rewrite(path, name, make)


def external_link(path: Path, name: str, target: Path) -> Path:
    """``name`` replaced by an external link to the object of that name in the file ``target``
    (a copy of its values, made there when ``target`` has none: another run's trace has its own)."""
    def make(f, name, values):
        with h5py.File(target, "a") as other:
            if name not in other:
                other[name] = values
        f[name] = h5py.ExternalLink(str(target), name)
    return _rewrite(path, name, make)


def fifo_link(path: Path, name: str) -> Path:
    """``name`` replaced by an external link into a FIFO made next to ``path``: a reader that
    follows it blocks in open() until something writes to the FIFO."""
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo)

    def make(f, name, values):
        f[name] = h5py.ExternalLink(str(fifo), "/x")
    return _rewrite(path, name, make)


def virtual_dataset(path: Path, name: str) -> Path:
    """``name`` replaced by a virtual dataset of its shape whose source file does not exist
    (HDF5 reads it as the fill value, zeros)."""
    def make(f, name, values):
        layout = h5py.VirtualLayout(shape=values.shape, dtype=values.dtype)
        layout[...] = h5py.VirtualSource(str(path.with_name("missing.h5")), "x", shape=values.shape)
        f.create_virtual_dataset(name, layout)
    return _rewrite(path, name, make)


def external_storage(path: Path, name: str) -> Path:
    """``name`` rewritten with its values in an external raw file next to ``path``."""
    raw = path.with_name(path.name + ".raw")

    def make(f, name, values):
        f.create_dataset(name, data=values, external=[(str(raw), 0, values.nbytes)])
    return _rewrite(path, name, make)


def gzip_filter(path: Path, name: str) -> Path:
    """``name`` rewritten compressed with gzip (a filter hpcopt never writes; the values read
    back the same)."""
    def make(f, name, values):
        f.create_dataset(name, data=values, compression="gzip", chunks=values.shape or None)
    return _rewrite(path, name, make)


def linked_twice(path: Path, name: str, alias: str) -> Path:
    """A second hard link ``alias`` to the dataset ``name`` (read twice by a reader of both)."""
    with h5py.File(path, "r+") as f:
        f[alias] = f[name]
    return _sealed_again(path)


def unwritten(path: Path, name: str, shape: tuple[int, ...]) -> Path:
    """``name`` replaced by a chunked dataset of ``shape`` (its dtype) none of whose chunks is
    written: a few bytes of header declaring any amount of data (read as zeros)."""
    def make(f, name, values):
        f.create_dataset(name, shape, dtype=values.dtype, chunks=(1 << 16,) + (1,) * (len(shape) - 1),
                         maxshape=(None,) * len(shape))
    return _rewrite(path, name, make)


def huge_model(path: Path, parameters: int) -> Path:
    """A checkpoint whose model declares ``parameters`` values (layout, ``/model/flat`` and
    ``/model/params/w`` consistent, none of them written): its digest and shapes check out."""
    with h5py.File(path, "r+") as f:
        dtype = f["model/flat"].dtype
        del f["model"]
        model = f.create_group("model")
        model.attrs["layout"] = f'[["w", [{parameters}]]]'
        for name in ("flat", "params/w"):
            model.create_dataset(name, (parameters,), dtype=dtype, chunks=(1 << 16,))
    return reseal(path)


def huge_trace(path: Path, rows: int) -> Path:
    """A trace whose ``/rows`` and ``/comm/*`` datasets are grown to ``rows`` rows, unwritten."""
    with h5py.File(path, "r+") as f:
        for name in ["rows", *(f"comm/{c}" for c in f["comm"])]:
            f[name].resize(rows, axis=0)
    return path


def contiguous_comm(path: Path) -> Path:
    """A trace whose ``/comm/*`` datasets are rewritten contiguous (fixed size, cannot grow)."""
    with h5py.File(path, "r") as f:
        names = list(f["comm"])
    for name in names:
        _rewrite(path, f"comm/{name}", lambda f, name, values: f.create_dataset(name, data=values))
    return path


def state_dict_with_group(path: Path) -> Path:
    """A state_dict file with a group (holding a dataset) at its root, next to the tensors."""
    with h5py.File(path, "r+") as f:
        f.create_group("block").create_dataset("weight", data=[1.0, 2.0])
    return path


def truncated_trace(source: Path, path: Path, keep: int = 3000) -> Path:
    """The first ``keep`` bytes of the trace ``source`` at ``path``: a run killed while it wrote
    its trace (or a trace caught while copied)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(source.read_bytes()[:keep])
    return path


def huge_timeline(path: Path, spans: int) -> Path:
    """A trace whose ``/timeline/spans`` is grown to ``spans`` spans, none of them written."""
    with h5py.File(path, "r+") as f:
        f["timeline/spans"].resize((spans,))
    return path


def timeline_attribute(path: Path, name: str, text: str) -> Path:
    """A trace whose ``/timeline`` attribute ``name`` (``kinds``, ``dropped``) is ``text``."""
    with h5py.File(path, "r+") as f:
        f["timeline"].attrs[name] = text
    return path


def timeline_span_kind(path: Path, kind: int) -> Path:
    """A trace whose first span names kind ``kind`` (beyond the kinds it lists, for a large one)."""
    with h5py.File(path, "r+") as f:
        spans = f["timeline/spans"]
        first = spans[0]
        first["kind"] = kind
        spans[0] = first
    return path
