"""Checkpoints of pipeline runs: every stage's own block, in one atomically written HDF5 file.

Same file name, attributes and atomic write as the data-parallel checkpoints
(``hpcopt.io.data_parallel_checkpoint``: ``checkpoints/step-<tick>.h5``, written as ``.tmp``,
fsynced, renamed), format ``hpcopt-pipeline-checkpoint``. Layout (docs/formats.md):

- ``/model/flat`` and ``/model/params/<layer>.<tensor>``: the whole model (every stage's block
  put together, frozen layers included), readable with h5py alone;
- ``/stages/<s>``: stage s's optimizer state as ``PipelineState`` declares it
  (``hpcopt.algorithms.state``; ``VECTORS`` and ``NUMBER_TYPES`` name what the format holds):
  one dataset per vector it holds (``x``, and ``prev`` for
  momentum, ``z``, ``anchor``, ``grad_sum`` for the accelerated loop), one attribute per
  number (``step``, ``alpha``), and ``block`` (its [start, stop) in the flat vector). With the
  seed in the config, ``step`` is the whole random state: PPRS noise is keyed by (seed, step,
  sample, stage);
- ``/ranks/window``: per rank, the trace window in progress (loss sum, loss max, iterations),
  the messages all stages sent up to the last trace row, this rank's sends since, and the
  modelled pipeline time so far;
- ``/comm``: rank 0's communication counters.

Each stage sends its block and state to rank 0 (``hpcopt.run.checkpointing``), which writes the
file and seals it with the same SHA-256 content digest (hpcopt.io.digest), verified before reading.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config, config_from_toml
from ..errors import HpcoptError
from ..flat import ParamLayout
from . import data_parallel_checkpoint as ckpt_io
from . import int_attr, json_attr, text_attr
from .digest import check_sealed, refuse_damaged, seal
from .safe_files import HDF5Writing
from .structure import open_for_reading

FORMAT = "hpcopt-pipeline-checkpoint"
VERSION = 2  # 2: the content digest (root attribute content_sha256)
READABLE = (VERSION,)
#: Optimizer vectors a stage may carry (``PipelineState``'s vectors), in file order, and its
#: numbers (its counters, scalars and flags), each with its Python type (stored as an attribute
#: of that type); tests/unit/test_layers.py holds them against ``PipelineState``'s declarations.
VECTORS = ("x", "prev", "z", "anchor", "grad_sum")
NUMBER_TYPES: dict[str, type] = {"step": int, "alpha": float}
WINDOW_COLUMNS = ("loss_sum", "loss_max", "iterations", "messages", "pending_sends",
                  "modelled_time")


@dataclass
class StageRecord:
    """One stage's part of a checkpoint."""

    block: tuple[int, int]         # [start, stop) of the stage's parameters in the flat vector
    vectors: dict[str, np.ndarray]  # VECTORS present for this algorithm
    numbers: dict[str, Any]         # the state's counters, scalars and flags (step, alpha)


@dataclass
class PipelineCheckpoint:
    config: Config
    world_size: int
    tick: int
    run_id: str
    trace_rows: int
    wall_seconds: float
    model: np.ndarray                       # the whole flat parameter vector
    stages: list[StageRecord]
    window: np.ndarray                      # (N, 4) WINDOW_COLUMNS
    comm: list[ckpt_io.CommRow] = field(default_factory=list)
    path: Path = Path()


def write(path: Path, ckpt: PipelineCheckpoint, layout: ParamLayout, comm_rows: list,
          software: Mapping[str, str], before_commit: Callable[[], None] | None = None) -> None:
    """Write ``ckpt`` to ``path`` atomically (HpcoptError, one line, when a write fails), its root
    attributes naming the ``software`` that wrote it (``ckpt_io.header_attrs``); ``before_commit``
    runs just before the file is published (a debug fault's hook)."""
    def fill(f: Any) -> None:
        f.attrs.update(ckpt_io.header_attrs(FORMAT, VERSION, ckpt, software))
        ckpt_io.write_model(f, layout, ckpt.model)
        for s, record in enumerate(ckpt.stages):
            group = f.create_group(f"stages/{s}")
            group.attrs.update({**record.numbers, "block": json.dumps(list(record.block))})
            for name, values in record.vectors.items():
                group.create_dataset(name, data=values)
        window = f.create_group("ranks").create_dataset("window", data=ckpt.window)
        window.attrs["columns"] = json.dumps(WINDOW_COLUMNS)
        f.create_group("comm").attrs["counters"] = json.dumps([list(r) for r in comm_rows])
        seal(f)
        f.flush()

    writing = HDF5Writing(path.with_name(path.name + ckpt_io.TMP_SUFFIX), "w", "checkpoint", path)
    try:
        writing.attempt(fill)
        writing.close()
        if before_commit is not None:
            before_commit()
        writing.publish()
    finally:
        writing.abandon()  # nothing left to delete once published


def is_pipeline_checkpoint(path: Path) -> bool:
    with open_for_reading(path, "checkpoint") as f:
        return f.attrs.get("format") == FORMAT


def stored_config(path: str | Path) -> tuple[Path, Config]:
    """(the checkpoint file, its config) for either kind of checkpoint (data-parallel or
    pipeline), reading nothing else."""
    found = ckpt_io.find_checkpoint(path)
    if not is_pipeline_checkpoint(found):
        return ckpt_io.stored_config(found)
    with ckpt_io.opened(found) as (found, f):
        try:
            return found, config_from_toml(text_attr(f.attrs, "config", found), found)
        except HpcoptError as exc:
            raise refuse_damaged(f, found, FORMAT, VERSION, "pipeline checkpoint", exc) from None


def read(path: str | Path, world_size: int) -> PipelineCheckpoint:
    """Read and validate a pipeline checkpoint written on ``world_size`` ranks (HpcoptError,
    one line naming the file, for anything wrong)."""
    with ckpt_io.opened(path) as (path, f):
        return _read(f, path, world_size)


def _read(f: Any, path: Path, world_size: int) -> PipelineCheckpoint:
    attrs = f.attrs
    check_sealed(f, path, FORMAT, VERSION, "pipeline checkpoint")
    config = config_from_toml(text_attr(attrs, "config", path), path)
    size = int_attr(attrs, "world_size", path, minimum=1)
    if size != world_size:
        raise HpcoptError(f"{path} was written by a pipeline of {size} stage(s); this run has "
                          f"{world_size} rank(s): resume it with mpiexec -n {size}")
    wall = float(attrs.get("wall_seconds", -1.0))
    if not np.isfinite(wall) or wall < 0:
        raise HpcoptError(f"{path}: attribute 'wall_seconds' is missing or not a number >= 0")
    dtype = np.dtype(config.run.dtype)
    model = f["model/flat"][()]
    if model.dtype != dtype or model.ndim != 1 or not np.isfinite(model).all():
        raise HpcoptError(f"{path}: /model/flat is not a finite {dtype} vector")
    stages = []
    for s in range(size):
        group = f[f"stages/{s}"]
        start, stop = json_attr(group.attrs, "block", path)
        vectors = {name: group[name][()] for name in VECTORS if name in group}
        if any(v.dtype != dtype or not np.isfinite(v).all() for v in vectors.values()):
            raise HpcoptError(f"{path}: /stages/{s} holds non-finite or non-{dtype} values")
        numbers = {}
        for name, cast in NUMBER_TYPES.items():
            value = group.attrs.get(name)
            if not isinstance(value, (int, float, np.integer, np.floating)) or not np.isfinite(value):
                raise HpcoptError(f"{path}: /stages/{s} attribute {name!r} is missing or not a number")
            numbers[name] = cast(value)
        stages.append(StageRecord((int(start), int(stop)), vectors, numbers))
    window = f["ranks/window"][()]
    if window.shape != (size, len(WINDOW_COLUMNS)):
        raise HpcoptError(f"{path}: /ranks/window has shape {window.shape}")
    comm = ckpt_io.comm_rows(f, path)
    return PipelineCheckpoint(config, size, int_attr(attrs, "tick", path),
                              text_attr(attrs, "run_id", path),
                              int_attr(attrs, "trace_rows", path), wall, model, stages, window,
                              comm, path)
