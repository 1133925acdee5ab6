"""A small real checkpoint and a field-by-field comparison of loaded checkpoints: shared by the
checkpoint property tests and the byte-edit probe (benchmarks/faults/checkpoint_fuzz.py); and
an older format's state moved into today's format by hand, for the tests of old files."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from hpcopt.config import build_config
from hpcopt.io.data_parallel_checkpoint import Checkpoint
from tests.crafted import reseal
from tests.runs import fresh_train


def small_checkpoint(out: Path) -> Path:
    """PR-SGD on 1 rank, MLP 64-12-10 on digits, momentum 0.9, I = 4, checkpoint at tick 6
    (mid-round: every kind of per-rank dataset); its path."""
    fresh_train(build_config(None, {"dataset": "digits", "hidden": "12", "steps": "6", "interval": "4",
                                    "momentum": "0.9", "progress": "false", "out": str(out)}))
    return out / "checkpoints" / "step-000000006.h5"


def differences(a: Checkpoint, b: Checkpoint) -> list[str]:
    """The fields in which two loaded checkpoints differ (bitwise for arrays); [] when equal."""
    found = []
    for name in ("model", "sampler", "window"):
        x, y = getattr(a, name), getattr(b, name)
        if x.shape != y.shape or x.tobytes() != y.tobytes():
            found.append(name)
    for name in ("counters", "scalars", "rows", "shared"):  # name -> array
        x, y = getattr(a, name), getattr(b, name)
        if sorted(x) != sorted(y):
            found.append(name)
        found += [f"{name}/{n}" for n in x if n in y and x[n].tobytes() != y[n].tobytes()]
    for name in ("config", "world_size", "tick", "run_id", "trace_rows", "wall_seconds", "comm"):
        if getattr(a, name) != getattr(b, name):
            found.append(name)
    if a.layout.entries != b.layout.entries:
        found.append("layout")
    return found


def with_state_of(old: Path, today: Path) -> Path:
    """Checkpoint ``today`` (written by today's hpcopt for the run ``old`` is from, at the same
    tick) made to hold the floating-point state of ``old`` (a file of an older format), resealed.

    It reads ``old`` with h5py alone, not with hpcopt's reader of old formats: every float
    dataset under /model, /ranks and /shared is replaced by ``old``'s of the same name, every
    float column of a per-rank table (a dataset with a ``columns`` attribute) by the column of
    that name in any of ``old``'s tables (version 2 keeps ``clipped`` and ``grad_norm`` in
    /ranks/clipping). Integers are the same on every machine: integer datasets and columns
    (counters, sampler) must be equal already (version 2's ``clip_count`` is a float column)."""
    with h5py.File(old, "r") as source, h5py.File(today, "r+") as dest:
        assert source.attrs["tick"] == dest.attrs["tick"]
        columns: dict[str, np.ndarray] = {}
        for table in _datasets(source, tables=True):
            for i, column in enumerate(json.loads(table.attrs["columns"])):
                assert column not in columns, f"column {column} in two tables of {old}"
                columns[column] = table[:, i]
        vectors = _datasets(dest, tables=False)
        assert sorted(v.name for v in vectors) == sorted(v.name for v in _datasets(source, tables=False))
        for vector in vectors:
            stored = source[vector.name]
            assert (stored.dtype, stored.shape) == (vector.dtype, vector.shape), vector.name
            if vector.dtype.kind == "f":
                vector[...] = stored[()]
            else:
                np.testing.assert_array_equal(vector[()], stored[()], err_msg=vector.name)
        for table in _datasets(dest, tables=True):
            for i, column in enumerate(json.loads(table.attrs["columns"])):
                if table.dtype.kind == "f":
                    table[:, i] = columns[column]
                else:
                    np.testing.assert_array_equal(table[:, i], columns[column],
                                                  err_msg=f"{table.name} {column}")
    return reseal(today)


def _datasets(f: h5py.File, tables: bool) -> list[h5py.Dataset]:
    """The per-rank tables of a checkpoint (datasets with a ``columns`` attribute), or its other
    datasets."""
    found: list[h5py.Dataset] = []
    f.visititems(lambda _, obj: found.append(obj) if isinstance(obj, h5py.Dataset)
                 and ("columns" in obj.attrs) == tables else None)
    return found
