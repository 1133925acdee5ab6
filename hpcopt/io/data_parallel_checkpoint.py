"""Data-parallel checkpoints: one HDF5 file holds everything needed to continue a run bit for bit.

Contents (layout: docs/formats.md): the averaged model (flat and under its layer names), the
algorithm's state as its class declares it (``hpcopt.algorithms.state``: each rank's model
when the ranks' models differ (mid-round), every per-rank vector such as momentum or batch-norm
statistics, vectors shared by all ranks once, per-rank counters and scalars, each table with
its column names), each rank's sampler position (with the seed in the config, that is the
whole random state: every draw comes from a stream keyed by (seed, purpose, rank, epoch, ...)),
an LSTM's hidden state, the trace window in progress, rank 0's communication counters, the
resolved config as TOML, the world size, versions and a format version. Nothing here knows an
algorithm, nor a run: host arrays go in and out, and a run's state is saved and restored by its
declarations (``hpcopt.run.checkpointing``, where the ranks' parts meet on rank 0).

Writing is atomic: the file is written as ``NAME.tmp``, flushed, fsynced, renamed to ``NAME``
and the directory fsynced, so a crash or kill at any moment leaves the previous checkpoint
intact; readers never take a ``.tmp`` file. Rank 0 is the only writer, a per-rank vector's rows
added one rank at a time (``CheckpointWriter.row``: a writer holds one model in memory, not N).
Committing seals the file with a SHA-256 content digest (hpcopt.io.digest) that reading
verifies before anything else, once per reader; reading then validates everything it returns
and raises one HpcoptError line for any problem, so a bad file is never partly loaded.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config, clips, config_from_toml, to_toml
from ..errors import HpcoptError
from ..flat import ParamLayout
from . import (
    READ_ERRORS,
    check_format,
    int_attr,
    json_attr,
    text_attr,
    versions,
)
from .digest import check_sealed, damaged, refuse_damaged, seal
from .safe_files import HDF5Writing, check_regular, publish
from .structure import open_for_reading
from .trace import FILE_NAME as TRACE_FILE

FORMAT = "hpcopt-checkpoint"
VERSION = 3  # 2: the content digest (root attribute content_sha256); 3: the state as declared
READABLE = (2, 3)
TMP_SUFFIX = ".tmp"
NAME_PATTERN = re.compile(r"^step-(\d+)\.h5$")
SUBDIR = "checkpoints"
SAMPLER_COLUMNS = ("epoch", "position", "batch_size", "shard_size", "seed", "rank")
BPTT_SAMPLER_COLUMNS = ("epoch", "position", "bptt", "stream_length", "batch_size", "rank")
WINDOW_COLUMNS = ("loss_sum", "steps")
CLIP_WINDOW_COLUMNS = (*WINDOW_COLUMNS, "clips")  # the window of a clipping run
#: Per-rank tables (``/ranks/<name>``, with a ``columns`` attribute) that are not state vectors.
TABLES = ("counters", "scalars", "sampler", "window", "clipping")
#: The problem's per-rank state (``Workload.carried``), not the algorithm's: an LSTM's hidden
#: state, a torch module's integer buffers.
HIDDEN = "hidden"
#: Version 2 kept a clipping algorithm's numbers in their own table, all as floats.
V2_CLIPPING = "clipping"
RNG_NOTE = ("every random draw comes from hpcopt.rng.stream(seed, purpose, *key), a pure function "
            "of its key; a rank's random state is the seed (config) and its sampler row")
#: Every dataset carries HDF5's Fletcher-32 checksum per chunk: a flipped bit in the numbers is
#: a read error (a HpcoptError), never a silently different model; any HDF5 reader checks it.
CHECKSUMMED = {"fletcher32": True}
ROW_CHUNK = 1 << 18  # values per chunk of a per-rank row (1 MB of float32): read one row at a time

#: A stored counter: (op, label, calls, bytes, seconds, in-node calls, in-node bytes)
#: (``CommStats.stored_rows``; files written before the in-node split hold the first five).
CommRow = tuple[str, str, int, int, float, int, int]


@dataclass
class Checkpoint:
    """One checkpoint in memory. ``rows[name]`` holds per-rank vectors of ``ranks``."""

    config: Config
    world_size: int
    tick: int                 # the algorithm's clock when it was taken
    run_id: str
    trace_rows: int           # rows of the run's trace that precede it
    wall_seconds: float       # run time so far (rank 0's clock)
    layout: ParamLayout
    model: np.ndarray         # (d,) the averaged model
    counters: dict[str, np.ndarray]  # the state's counters: name -> (N,) int64
    sampler: np.ndarray       # (N, 6) int64, SAMPLER_COLUMNS
    window: np.ndarray        # (N, 2) float64, WINDOW_COLUMNS ((N, 3), CLIP_WINDOW_COLUMNS, clipping)
    comm: list[CommRow] = field(default_factory=list)   # rank 0's counters (CommRow)
    rows: dict[str, np.ndarray] = field(default_factory=dict)  # per-rank vectors: (len(ranks), width)
    ranks: tuple[int, ...] = ()
    path: Path = Path()       # where it was read from
    scalars: dict[str, np.ndarray] = field(default_factory=dict)  # scalars and flags: name -> (N,) float64
    shared: dict[str, np.ndarray] = field(default_factory=dict)   # vectors the same on every rank


def run_id_of(path: Path) -> str | None:
    """The ``run_id`` attribute of a checkpoint or trace, read alone; None where it cannot be
    read (a damaged file, or no regular file: a FIFO is never opened; its owner is unknown)."""
    import h5py

    try:
        check_regular(path, "checkpoint")
        with h5py.File(path, "r", locking=False) as f:
            value = f.attrs.get("run_id")
    except (HpcoptError, *READ_ERRORS):
        return None
    return value if isinstance(value, str) else None


def find_checkpoint(path: str | Path) -> Path:
    """``path`` itself if it is a file; for a directory (a run's or its ``checkpoints``), the
    newest complete checkpoint in it. Partial files (``*.tmp``) are never chosen."""
    path = Path(path)
    if path.name.endswith(TMP_SUFFIX):
        raise HpcoptError(f"{path} is an incomplete checkpoint (a write that did not finish)")
    if not path.is_dir():
        return path
    for directory in (path / SUBDIR, path):
        found = complete(directory)
        if found:
            return found[-1][1]
    if (path / TRACE_FILE).is_file():
        raise HpcoptError(f"no checkpoint in {path}: its run has written none (if it ended "
                          f"before its first checkpoint, train --out {path} starts a run there)")
    raise HpcoptError(f"no checkpoint in {path}")


def complete(directory: Path) -> list[tuple[int, Path]]:
    """(tick, path) of the complete checkpoints in ``directory`` (named ``NAME_PATTERN``; never a
    ``*.tmp`` file), oldest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := NAME_PATTERN.match(p.name))]
    return sorted(found)


class CheckpointWriter:
    """Writes one checkpoint file atomically; rows of per-rank vectors are added one at a time.

    ``with CheckpointWriter(path, ckpt, names) as w: w.row(name, rank, values); ...; w.commit(comm)``
    writes everything in ``ckpt`` except ``rows`` and ``comm`` on entry (its root attributes
    name the ``software`` that wrote it: ``hpcopt.io.versions`` when not given); ``commit`` adds
    the communication counters, then closes, fsyncs and renames. Leaving the block without
    ``commit`` (an exception) deletes the temporary file; a killed process leaves it behind,
    where readers ignore it and the next prune deletes it (``hpcopt.run.directory.prune``). A
    write that fails (a full disk: ``hpcopt.io.safe_files``) stops the writing but not the
    block, so rank 0 goes on receiving every rank's rows; ``commit`` raises it (one HpcoptError
    line naming the file and the free space) and the temporary file is deleted.
    """

    def __init__(self, path: Path, ckpt: Checkpoint, names: Sequence[str],
                 widths: dict[str, int] | None = None, software: Mapping[str, str] | None = None) -> None:
        self.path, self.ckpt, self.names = path, ckpt, tuple(names)
        self.widths = widths or {}  # per-rank vectors not of the model's size (hidden, buffers)
        self.software = versions() if software is None else software  # who writes it (``header_attrs``)
        self.tmp = path.with_name(path.name + TMP_SUFFIX)
        self.committed = False

    def __enter__(self) -> CheckpointWriter:
        self.writing = HDF5Writing(self.tmp, "w", "checkpoint", self.path)
        self.writing.attempt(self._create)
        return self

    def _create(self, f: Any) -> None:
        ckpt, d = self.ckpt, self.ckpt.model.size
        f.attrs.update(header_attrs(FORMAT, VERSION, ckpt, self.software))
        write_model(f, ckpt.layout, ckpt.model, **CHECKSUMMED)
        ranks = f.create_group("ranks")
        ranks.attrs["rng"] = RNG_NOTE
        tables = [("counters", _table(ckpt.counters, ckpt.world_size, np.int64), list(ckpt.counters)),
                  ("scalars", _table(ckpt.scalars, ckpt.world_size, np.float64), list(ckpt.scalars)),
                  ("sampler", ckpt.sampler, sampler_columns(ckpt.config)),
                  ("window", ckpt.window, _window_columns(ckpt.config))]
        for name, data, columns in tables:
            ranks.create_dataset(name, data=data, **CHECKSUMMED).attrs["columns"] = json.dumps(columns)
        if ckpt.shared:
            group = f.create_group("shared")
            for name, values in ckpt.shared.items():
                group.create_dataset(name, data=values, **CHECKSUMMED)
        for name in self.names:
            width = self.widths.get(name, d)
            ranks.create_dataset(name, (ckpt.world_size, width), dtype=ckpt.model.dtype,
                                 chunks=(1, max(1, min(width, ROW_CHUNK))), **CHECKSUMMED)

    def row(self, name: str, rank: int, values: np.ndarray) -> None:
        def write(f: Any) -> None:
            f[f"ranks/{name}"][rank] = values

        self.writing.attempt(write)

    def commit(self, comm: Sequence[CommRow]) -> None:
        """Add the counters, then flush, fsync, rename over ``path`` and fsync the directory."""
        def finish(f: Any) -> None:
            f.create_group("comm").attrs["counters"] = json.dumps([list(r) for r in comm])
            seal(f)
            f.flush()

        self.writing.attempt(finish)
        self.writing.publish()
        self.committed = True

    def __exit__(self, *_: Any) -> None:
        if not self.committed:
            self.writing.abandon()


def _table(columns: dict[str, np.ndarray], size: int, dtype: Any) -> np.ndarray:
    """(N, len(columns)) with one column per named (N,) vector."""
    return np.stack([np.asarray(v, dtype=dtype) for v in columns.values()], axis=1) \
        if columns else np.zeros((size, 0), dtype=dtype)


def header_attrs(format_name: str, version: int, ckpt: Any, software: Mapping[str, str]) -> dict[str, Any]:
    """The root attributes of either kind of checkpoint (``ckpt``: a Checkpoint or a
    pipeline checkpoint): format, the ``software`` that wrote it (``hpcopt.io.versions``, with
    the MPI library's for a run's: ``hpcopt.run.checkpointing.written_by``), the config as TOML,
    where the run stands."""
    return {"format": format_name, "format_version": version, **software,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "algorithm": ckpt.config.algorithm.algorithm, "config": to_toml(ckpt.config),
            "run_id": ckpt.run_id, "world_size": ckpt.world_size, "tick": ckpt.tick,
            "trace_rows": ckpt.trace_rows, "wall_seconds": ckpt.wall_seconds}


def write_model(f: Any, layout: ParamLayout, model: np.ndarray, **filters: Any) -> None:
    """``/model``: the flat vector, and one dataset per layer tensor (readable with h5py alone)."""
    group = f.create_group("model")
    group.attrs["layout"] = json.dumps([[name, list(shape)] for name, shape in layout.entries])
    group.create_dataset("flat", data=model, **filters)
    for name, view in layout.views(model).items():
        group.create_dataset(f"params/{name}", data=view, **filters)


@contextmanager
def opened(path: str | Path) -> Iterator[tuple[Path, Any]]:
    """(the checkpoint file ``path`` names, the open file): what h5py or numpy raise while
    it is read becomes one HpcoptError line naming the file."""
    path = find_checkpoint(path)
    with open_for_reading(path, "checkpoint") as f:
        try:
            yield path, f
        except READ_ERRORS as exc:
            raise damaged(path, exc) from None


def sampler_columns(config: Config) -> tuple[str, ...]:
    """The columns of ``/ranks/sampler``: a minibatch sampler's, or a BPTT sampler's (corpora)."""
    return BPTT_SAMPLER_COLUMNS if config.model.model == "lstm" else SAMPLER_COLUMNS


def _window_columns(config: Config) -> tuple[str, ...]:
    return CLIP_WINDOW_COLUMNS if clips(config) else WINDOW_COLUMNS


def write_checkpoint(path: Path, ckpt: Checkpoint, software: Mapping[str, str] | None = None) -> None:
    """Write a checkpoint held entirely in memory (``rows`` of every rank); ``software`` as
    ``CheckpointWriter`` takes it."""
    widths = {name: rows.shape[1] for name, rows in ckpt.rows.items()}
    with CheckpointWriter(path, ckpt, list(ckpt.rows), widths, software) as writer:
        for name, rows in ckpt.rows.items():
            for rank in range(ckpt.world_size):
                writer.row(name, rank, rows[rank])
        writer.commit(ckpt.comm)


# -- reading -----------------------------------------------------------------------------------

def read_checkpoint(path: str | Path, rank: int | None = None,
                    world_size: int | None = None, verify: bool = True) -> Checkpoint:
    """Read and validate a checkpoint: every rank's vectors, or only those of ``rank`` (of a
    run on ``world_size`` ranks, which must be the size that wrote it). ``verify=False`` skips
    the content digest, for a job whose rank 0 has checked it (``hpcopt.run.vetting``): hashing
    reads the whole file, and N ranks each hashing it would read it N times.

    Raises HpcoptError (one line, naming the file) for anything wrong; nothing in the file is
    executed or unpickled (TOML and JSON text, numbers).
    """
    with opened(path) as (path, f):
        return _read(f, path, rank, world_size, verify)


def stored_config(path: str | Path) -> tuple[Path, Config]:
    """(the checkpoint file, its config), reading nothing else: for merging command-line flags.

    The digest is not computed here (``read_checkpoint`` verifies it before a run uses anything,
    so each reader hashes the file once); a problem found here is reported as damage when the
    digest does not match."""
    with opened(path) as (path, f):
        try:
            check_format(f.attrs, path, FORMAT, READABLE, "checkpoint")
            return path, config_from_toml(text_attr(f.attrs, "config", path), path)
        except HpcoptError as exc:
            raise refuse_damaged(f, path, FORMAT, READABLE, "checkpoint", exc) from None


def checkpoint_world_size(path: str | Path) -> int:
    """The number of ranks that wrote the checkpoint ``path`` (vetted by the caller:
    hpcopt.run.vetting); HpcoptError (one line) where it cannot be read."""
    with opened(path) as (path, f):
        return int_attr(f.attrs, "world_size", path, minimum=1)


def _read(f: Any, path: Path, rank: int | None, world_size: int | None, verify: bool) -> Checkpoint:
    attrs = f.attrs
    if verify:
        check_sealed(f, path, FORMAT, READABLE, "checkpoint")
    else:
        check_format(attrs, path, FORMAT, READABLE, "checkpoint")
    config = config_from_toml(text_attr(attrs, "config", path), path)
    size = int_attr(attrs, "world_size", path, minimum=1)
    if world_size is not None and world_size != size:
        raise HpcoptError(f"{path} was written by a run on {size} rank(s); this run has {world_size}: "
                          f"resume it on {size} (mpiexec -n {size} ...), or pass --ranks-changed to "
                          f"carry it over to {world_size}")
    wall = attrs.get("wall_seconds")
    if not isinstance(wall, (float, np.floating)) or not np.isfinite(wall) or wall < 0:
        raise HpcoptError(f"{path}: attribute 'wall_seconds' is missing or not a number >= 0")
    if rank is not None and not 0 <= rank < size:
        raise HpcoptError(f"{path} was written by {size} rank(s); it has no rank {rank}")
    layout = _layout(f, path)
    dtype = np.dtype(config.run.dtype)
    model = _finite(_array(f, "model/flat", path, dtype, (layout.size,))[()], "model/flat", path)
    for name, shape in layout.entries:
        _array(f, f"model/params/{name}", path, dtype, shape)
    counters = _columns(f, "ranks/counters", path, np.int64, size)
    if any((v < 0).any() for v in counters.values()):
        raise HpcoptError(f"{path}: /ranks/counters holds negative counts")
    scalars = {} if "ranks/scalars" not in f else _columns(f, "ranks/scalars", path, np.float64, size)
    if V2_CLIPPING in f.get("ranks", {}):  # version 2: clip_count, clipped, grad_norm as floats
        clipping = _columns(f, f"ranks/{V2_CLIPPING}", path, np.float64, size)
        counts = clipping.pop("clip_count", np.zeros(size))
        if not (np.isfinite(counts).all() and (counts >= 0).all()):
            raise HpcoptError(f"{path}: /ranks/clipping holds negative or non-finite counts")
        counters["clip_count"] = counts.astype(np.int64)
        scalars.update(clipping)
    sampler = _array(f, "ranks/sampler", path, np.int64, (size, len(sampler_columns(config))))[()]
    window = _finite(_array(f, "ranks/window", path, np.float64,
                            (size, len(_window_columns(config))))[()], "ranks/window", path)
    ranks = tuple(range(size)) if rank is None else (rank,)
    rows = {}
    for name in f["ranks"]:
        if name in TABLES:
            continue
        width = getattr(f[f"ranks/{name}"], "shape", (0, 0))[-1]
        data = _array(f, f"ranks/{name}", path, dtype, (size, width))
        rows[name] = _finite(data[()] if rank is None else data[rank:rank + 1], f"ranks/{name}", path)
    shared = {}
    for name in f.get("shared", {}):
        data = _array(f, f"shared/{name}", path, dtype, (getattr(f[f"shared/{name}"], "shape", (0,))[0],))
        shared[name] = _finite(data[()], f"shared/{name}", path)
    return Checkpoint(config=config, world_size=size, tick=int_attr(attrs, "tick", path),
                      run_id=text_attr(attrs, "run_id", path),
                      trace_rows=int_attr(attrs, "trace_rows", path), wall_seconds=float(wall),
                      layout=layout, model=model, counters=counters, sampler=sampler, window=window,
                      comm=comm_rows(f, path), rows=rows, ranks=ranks, path=path,
                      scalars=scalars, shared=shared)


def _columns(f: Any, name: str, path: Path, dtype: Any, size: int) -> dict[str, np.ndarray]:
    """A per-rank table as column name -> (N,) vector (names from its ``columns`` attribute)."""
    dataset = f.get(name)
    attrs = getattr(dataset, "attrs", {})
    columns = json_attr(attrs, "columns", path) if "columns" in attrs else None
    width = len(columns) if isinstance(columns, list) else (getattr(dataset, "shape", ()) or (0,))[-1]
    table = _array(f, name, path, dtype, (size, width))[()]
    if not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
        raise HpcoptError(f"{path}: /{name} has no list of columns")
    return {column: table[:, i] for i, column in enumerate(columns)}


def _array(f: Any, name: str, path: Path, dtype: Any, shape: tuple[int, ...]) -> Any:
    """The dataset ``name``, after checking that it exists with this dtype and shape."""
    import h5py

    obj = f.get(name)
    if not isinstance(obj, h5py.Dataset):  # missing, or a group or named type in its place
        raise HpcoptError(f"{path}: dataset /{name} is missing")
    if obj.dtype != np.dtype(dtype) or obj.shape != tuple(shape):
        raise HpcoptError(f"{path}: /{name} has dtype {obj.dtype} and shape {obj.shape}, "
                          f"expected {np.dtype(dtype)} and {tuple(shape)}")
    return obj


def _finite(values: np.ndarray, name: str, path: Path) -> np.ndarray:
    if not np.isfinite(values).all():
        raise HpcoptError(f"{path}: /{name} contains NaN or infinite values")
    return values


def _layout(f: Any, path: Path) -> ParamLayout:
    entries = json_attr(f["model"].attrs, "layout", path) if "model" in f else None
    try:
        if not isinstance(entries, list) or not entries:
            raise ValueError
        items = []
        for name, shape in entries:
            if not isinstance(name, str) or not all(isinstance(n, int) and n > 0 for n in shape):
                raise ValueError
            items.append((name, tuple(shape)))
        return ParamLayout.from_items(items)
    except (ValueError, TypeError):
        raise HpcoptError(f"{path}: /model attribute 'layout' is missing or malformed") from None


def comm_rows(f: Any, path: Path) -> list[CommRow]:
    """``/comm``'s stored communication counters, checked (HpcoptError naming the file); a
    file's rows without the in-node split count nothing in-node."""
    rows = json_attr(f["comm"].attrs, "counters", path) if "comm" in f else None
    if not isinstance(rows, list) or not all(
            isinstance(r, list) and len(r) in (5, 7) and isinstance(r[0], str) and isinstance(r[1], str)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in r[2:4] + r[5:])
            and isinstance(r[4], (int, float)) and r[5:] <= r[2:4] for r in rows):
        raise HpcoptError(f"{path}: /comm attribute 'counters' is missing or malformed")
    return [(r[0], r[1], r[2], r[3], float(r[4]), *(r[5:] or (0, 0))) for r in rows]


__all__ = ["Checkpoint", "CheckpointWriter", "write_checkpoint", "read_checkpoint",
           "stored_config", "opened", "damaged", "header_attrs", "write_model", "publish", "comm_rows",
           "find_checkpoint", "complete", "run_id_of", "FORMAT", "VERSION"]
