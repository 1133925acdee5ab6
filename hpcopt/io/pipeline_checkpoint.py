"""Checkpoints of pipeline runs: every stage's own block, in one atomically written HDF5 file.

Same file name, attributes and atomic write as the data-parallel checkpoints
(``hpcopt.io.data_parallel_checkpoint``: ``checkpoints/step-<tick>.h5``, written as ``.tmp``,
fsynced, renamed), format ``hpcopt-pipeline-checkpoint``. Layout (docs/formats.md):

- ``/model/flat`` and ``/model/params/<layer>.<tensor>``: the whole model (every stage's block
  put together, frozen layers included), readable with h5py alone;
- ``/stages/<s>``: stage s's optimizer state as ``PipelineState`` declares it
  (``hpcopt.algorithms.state``): one dataset per vector it holds (``x``, and ``prev`` for
  momentum, ``z``, ``anchor``, ``grad_sum`` for the accelerated loop), one attribute per
  number (``step``, ``alpha``), and ``block`` (its [start, stop) in the flat vector). With the
  seed in the config, ``step`` is the whole random state: PPRS noise is keyed by (seed, step,
  sample, stage);
- ``/ranks/window``: per rank, the trace window in progress (loss sum, loss max, iterations),
  the messages all stages sent up to the last trace row, this rank's sends since, and the
  modelled pipeline time so far;
- ``/comm``: rank 0's communication counters.

Each stage sends its block and state to rank 0 (label "checkpoint"), which writes the file and
seals it with the same SHA-256 content digest (hpcopt.io.digest), verified before reading.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..algorithms import state as fields
from ..algorithms.pprs import PipelineState
from ..comm import Comm, agreed
from ..config import Config, config_from_toml
from ..errors import HpcoptError
from ..flat import ParamLayout
from . import data_parallel_checkpoint as ckpt_io
from . import int_attr, json_attr, open_for_reading, text_attr
from .digest import check_sealed, refuse_damaged, seal
from .safe_files import HDF5Writing

FORMAT = "hpcopt-pipeline-checkpoint"
VERSION = 2  # 2: the content digest (root attribute content_sha256)
READABLE = (VERSION,)
LABEL = ckpt_io.LABEL
#: Optimizer vectors a stage may carry (``PipelineState`` attributes), in file order, and its numbers.
VECTORS = fields.fields_of(PipelineState, fields.VECTOR)
NUMBER_KINDS = (fields.COUNTER, fields.SCALAR, fields.FLAG)
#: Each number's Python type (stored as an attribute of that type).
NUMBER_TYPES = {name: fields.NUMBER_TYPES[kind] for kind in NUMBER_KINDS
                for name in fields.fields_of(PipelineState, kind)}
WINDOW_COLUMNS = ("loss_sum", "loss_max", "iterations", "messages", "pending_sends",
                  "modelled_time")
_TAG = 7401


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


def _numbers(state: PipelineState) -> dict[str, float]:
    return {name: value for kind in NUMBER_KINDS for name, value in fields.numbers(state, kind).items()}


def save(path: Path, comm: Comm, config: Config, layout: ParamLayout, block: Any, block_slice: slice,
         state: PipelineState, window: np.ndarray, tick: int, run_id: str, trace_rows: int,
         wall_seconds: float, before_commit: Callable[[], None] | None = None) -> None:
    """Collective: every stage sends its parameter block and state to rank 0, which writes
    ``path`` atomically. ``window`` is this rank's WINDOW_COLUMNS. ``before_commit`` runs on
    rank 0 just before the file is published (a debug fault's hook)."""
    to_host = comm.backend.to_host
    names = fields.present(state, fields.VECTOR)  # the same on every stage: one algorithm
    numbers = _numbers(state)
    header = np.array([block_slice.start, block_slice.stop, state.x.size, *numbers.values(),
                       *window], dtype=np.float64)
    mine = [np.ascontiguousarray(to_host(block)),
            *(np.ascontiguousarray(to_host(getattr(state, n))) for n in names)]
    if comm.rank != 0:
        requests = [comm.isend(header, 0, _TAG, LABEL)]
        requests += [comm.isend(v, 0, _TAG + 1 + i, LABEL) for i, v in enumerate(mine)]
        comm.waitall(requests, LABEL)
        agreed(lambda: None, comm, LABEL)
        return
    headers, stages = [header], [mine]
    for source in range(1, comm.size):
        h = np.empty_like(header)
        comm.waitall([comm.irecv_(h, source, _TAG, LABEL)], LABEL)
        sizes = [int(h[1] - h[0])] + [int(h[2])] * len(names)
        vectors = [np.empty(n, dtype=mine[0].dtype) for n in sizes]
        comm.waitall([comm.irecv_(v, source, _TAG + 1 + i, LABEL) for i, v in enumerate(vectors)],
                     LABEL)
        headers.append(h)
        stages.append(vectors)
    model = np.empty(layout.size, dtype=mine[0].dtype)
    records = []
    for h, vectors in zip(headers, stages):
        start, stop = int(h[0]), int(h[1])
        model[start:stop] = vectors[0]
        records.append(StageRecord((start, stop), dict(zip(names, vectors[1:])),
                                   {name: NUMBER_TYPES[name](v) for name, v in zip(numbers, h[3:])}))
    ckpt = PipelineCheckpoint(config, comm.size, tick, run_id, trace_rows, wall_seconds, model,
                              records, np.stack([h[3 + len(numbers):] for h in headers]))
    agreed(lambda: _write(path, ckpt, layout, ckpt_io.with_agreement(comm.stats.stored_rows(), comm.in_node),
                          before_commit), comm, LABEL)


def _write(path: Path, ckpt: PipelineCheckpoint, layout: ParamLayout, comm_rows: list,
           before_commit: Callable[[], None] | None = None) -> None:
    """Write ``ckpt`` to ``path`` atomically (HpcoptError, one line, when a write fails)."""
    def fill(f: Any) -> None:
        f.attrs.update(ckpt_io.header_attrs(FORMAT, VERSION, ckpt))
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


def restore(ckpt: PipelineCheckpoint, rank: int, block: Any, block_slice: slice,
            state: PipelineState, backend: Any) -> np.ndarray:
    """Put stage ``rank``'s part of ``ckpt`` into a fresh run (its whole parameter block and
    its optimizer state); returns this rank's trace window row. HpcoptError when it does not fit."""
    record = ckpt.stages[rank]
    if record.block != (block_slice.start, block_slice.stop):
        raise HpcoptError(f"{ckpt.path}: stage {rank} holds parameters {list(record.block)}, this "
                          f"run's stage {rank} holds [{block_slice.start}, {block_slice.stop}]")
    names = fields.present(state, fields.VECTOR)
    if sorted(record.vectors) != sorted(names):
        raise HpcoptError(f"{ckpt.path}: stage {rank} holds {sorted(record.vectors)}, this "
                          f"algorithm needs {sorted(names)}")
    for name in names:
        target = getattr(state, name)
        if record.vectors[name].shape != target.shape:
            raise HpcoptError(f"{ckpt.path}: stage {rank}'s {name} has shape "
                              f"{record.vectors[name].shape}, expected {target.shape}")
    block[...] = backend.asarray(ckpt.model[block_slice])
    for name in names:
        getattr(state, name)[...] = backend.asarray(record.vectors[name])
    for kind in NUMBER_KINDS:
        fields.load_numbers(state, kind, record.numbers)
    return ckpt.window[rank].copy()
