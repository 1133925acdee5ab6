"""The run trace: one HDF5 table per run (``OUT/trace.h5``), a row every few clock ticks.

A row holds, for the window of steps since the previous row: the step, averaging rounds, mean
and max loss over ranks, the gradient norm, the learning rate, wall time, the evaluation when
one was made at that tick, and rank 0's cumulative communication calls, bytes and seconds per
label. In the file: ``/rows``, one compound dataset (a field per column), and ``/comm/calls``,
``/comm/bytes``, ``/comm/seconds``, (rows x labels) with the labels in ``/comm``'s ``labels``
attribute; four datasets, so appending a chunk of rows costs four writes. Layout and meaning
of every column: docs/formats.md.

Only rank 0 touches the file, appending rows in chunks and flushing them, so after a crash (even
kill -9) the file opens and holds every flushed row. Each row's window statistics are reduced
over the ranks by ``hpcopt.run.window``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config, config_from_toml
from ..errors import HpcoptError
from . import READ_ERRORS, check_format, json_attr, text_attr
from .safe_files import HDF5Writing
from .structure import check_structure, open_for_reading

FORMAT = "hpcopt-trace"
VERSION = 1
FILE_NAME = "trace.h5"
FILE_KIND = "trace"  # in messages
#: The group of the ranks lost and survived (--on-rank-loss continue), one entry per lost rank.
RANK_LOSSES = "rank_losses"
RANK_LOSS_COLUMNS = {"step": "int64", "rank": "int64", "recover_seconds": "float64",
                     "round_step": "int64"}
#: (ratio, slack) of the data a trace may declare to its size (``structure.check_structure``):
#: a label first used late leaves the counters' chunks of the earlier rows unwritten (read as
#: zeros), and a run killed mid-append can leave a chunk declared but unwritten.
DECLARED_BOUND = (4.0, 1 << 20)
#: Row columns and their dtypes: the fields of the compound dataset ``/rows``.
COLUMNS = {"step": "int64", "rounds": "int64", "loss_mean": "float64", "loss_max": "float64",
           "grad_norm": "float64", "grad_norm_max": "float64", "lr": "float64",
           "wall": "float64", "eval_loss": "float64", "eval_accuracy": "float64"}
ROW_DTYPE = np.dtype(list(COLUMNS.items()))
#: Columns only some runs have: ``clip_fraction`` with a clipping algorithm (celgc, naive_clip),
#: ``eval_perplexity`` with a language model (whose ``eval_accuracy`` is NaN).
#: The most bytes a rank had in flight at once (streaming fragments): an optional column.
PEAK_COLUMN = "peak_bytes_in_flight"
OPTIONAL_COLUMNS = {"clip_fraction": "float64", "eval_perplexity": "float64",
                    # pipeline runs (hpcopt.run.pipeline): measured and ideal bubble, seconds per
                    # op tau, modelled pipeline time, point-to-point messages so far (all stages)
                    "bubble": "float64", "bubble_ideal": "float64", "tau": "float64",
                    "modelled_time": "float64", "messages": "int64",
                    # streaming fragments (hpcopt.algorithms.streaming): the most bytes a rank had
                    # in flight at once over the round (interval steps) up to the row's step
                    PEAK_COLUMN: "int64",
                    # reductions in flight moved on by the communication thread
                    # (hpcopt.comm.progress): the fraction of their own seconds hidden, so far
                    "hidden_fraction": "float64"}
#: Per-stage columns of pipeline runs: ``busy_<s>`` and ``idle_<s>``, stage s's seconds in the window.
STAGE_COLUMNS = ("busy", "idle")


def optional_dtype(name: str) -> str | None:
    """The dtype of optional column ``name`` (``OPTIONAL_COLUMNS`` or a per-stage column)."""
    prefix, _, stage = name.rpartition("_")
    if prefix in STAGE_COLUMNS and stage.isdigit():
        return "float64"
    return OPTIONAL_COLUMNS.get(name)
#: ``/comm/<name>`` (rows x labels): rank 0's counters per label, summed over operations,
#: cumulative since the start of the run.
COMM_COLUMNS = {"calls": "int64", "bytes": "int64", "seconds": "float64"}
#: ``/comm/in_node_calls``, ``/comm/in_node_bytes`` (rows x labels): of those calls and bytes, the
#: ones on a communicator within one node (``Comm.in_node``); the rest went across nodes.
#: Traces written before the split lack them, and a resumed run appends to such a trace without.
NODE_COLUMNS = {"in_node_calls": "int64", "in_node_bytes": "int64"}
#: With a cost-model profile (``--network``): ``/comm/modelled``, the modelled seconds of the same
#: calls and bytes on that profile (hpcopt.comm.costmodel); ``/comm``'s ``ops`` attribute names each
#: label's operation, so any profile can be applied later (``costmodel.trace_modelled``).
MODELLED = "modelled"
#: The order of the values of a label in rank 0's counters (``hpcopt.run.window.comm_totals``).
TOTALS = (*COMM_COLUMNS, *NODE_COLUMNS, MODELLED)
CHUNK_ROWS = 256
#: Rows a reader takes from ``/rows`` at a time (about 1.3 MB of a row of ten columns).
READ_ROWS = 1 << 14

@dataclass(frozen=True)
class RankLoss:
    """One lost rank as the trace records it (``/rank_losses``, a dataset per field of
    ``RANK_LOSS_COLUMNS``; hpcopt.run.rank_loss): the step (rank 0's, when the loss was seen),
    the lost rank (of the job's original ranks), the seconds from detection to training again,
    and the step of the round the survivors went on from."""

    step: int
    rank: int
    recover_seconds: float
    round_step: int


class TraceWriter:
    """Rank 0's appender for a trace file; rows are buffered and written in chunks.

    Buffered rows reach the file, followed by an HDF5 flush, every ``flush_rows`` rows, when
    ``flush_seconds`` have passed since the last flush, and whenever ``flush()`` is called
    (the run calls it before every checkpoint, so a checkpoint never counts unwritten rows).

    ``resume_at`` None starts a new file (``attrs`` become its attributes). A resumed run
    passes (rows, step) of its checkpoint: an existing trace of the same ``run_id`` is cut back
    to its first ``rows`` rows (dropping the interrupted run's rows after the checkpoint) and
    appended to; a missing one is started anew. Either way ``step`` is added to the
    ``resumed_at`` attribute.
    """

    def __init__(self, path: Path, attrs: dict[str, Any], resume_at: tuple[int, int] | None = None,
                 flush_rows: int = 64, flush_seconds: float = 10.0,
                 extra_columns: Sequence[str] = (), modelled: bool = False) -> None:
        self.columns = {**COLUMNS, **{name: optional_dtype(name) for name in extra_columns}}
        self.comm_columns = {**COMM_COLUMNS, **NODE_COLUMNS, **({MODELLED: "float64"} if modelled else {})}
        self.ops: dict[str, str] = {}  # label -> operation, written with the labels (``ops``)
        self.row_dtype = np.dtype(list(self.columns.items()))
        self.path, self.flush_rows, self.flush_seconds = path, flush_rows, flush_seconds
        self._rows: list[tuple[dict[str, float], dict[str, tuple]]] = []
        self._last_flush = time.monotonic()
        self.labels: list[str] = []
        self.rows_on_disk = 0
        if resume_at is not None and path.exists():
            trace = _check_resumable(path, attrs["run_id"], resume_at[0])  # vetted, read
            self.writing = HDF5Writing(path, "r+", FILE_KIND)
            self.writing.check()
            self.file = self.writing.file
            if any(name not in self.file.get("comm", {}) for name in NODE_COLUMNS):  # an older trace
                self.comm_columns = {k: v for k, v in self.comm_columns.items() if k not in NODE_COLUMNS}
            try:
                check_structure(self.file, path, FILE_KIND, *DECLARED_BOUND)
                self._check_appendable()
            except HpcoptError:
                self.writing.close()
                raise
            self.labels = json.loads(self.file["comm"].attrs["labels"])  # checked by read_trace
            self.ops = trace.ops or {}

            def reopen(f: Any) -> None:
                self._truncate(resume_at[0])
                self._forget_rank_losses_after(resume_at[1])
                f.attrs["resumed_at"] = _resumed(f.attrs.get("resumed_at"), resume_at[1])
                f.attrs["config"] = attrs["config"]  # a resumed run may run longer

            self._attempt(reopen)
            return
        if path.exists():
            raise HpcoptError(f"{path} exists: it belongs to an earlier run "
                              "(resume that run, or choose another --out)")
        self.writing = HDF5Writing(path, "w", FILE_KIND)
        self.file = self.writing.file

        def create(f: Any) -> None:
            f.attrs.update({"format": FORMAT, "format_version": VERSION, **attrs,
                            "resumed_at": _resumed(None, resume_at[1]) if resume_at else "[]"})
            f.create_dataset("rows", (0,), maxshape=(None,), dtype=self.row_dtype, chunks=(CHUNK_ROWS,))
            comm = f.create_group("comm")
            comm.attrs["labels"] = "[]"
            for name, dtype in self.comm_columns.items():
                comm.create_dataset(name, (0, 0), maxshape=(None, None), dtype=dtype,
                                    chunks=(CHUNK_ROWS, 8))
            f.flush()

        self._attempt(create)

    def _check_appendable(self) -> None:
        """The datasets a resumed run appends to exist, with this run's columns, and can grow."""
        path, f = self.path, self.file
        if f["rows"].dtype != self.row_dtype:
            raise HpcoptError(f"{path}: its rows have columns {', '.join(f['rows'].dtype.names or ())}, "
                              f"this run writes {', '.join(self.columns)}")
        stored = [name for name in f["comm"] if name in TOTALS]
        if sorted(stored) != sorted(self.comm_columns):
            raise HpcoptError(f"{path}: /comm holds {', '.join(stored)}, this run writes "
                              f"{', '.join(self.comm_columns)}")
        for name in ["rows", *(f"comm/{c}" for c in self.comm_columns)]:
            dataset = f[name]
            if dataset.chunks is None or any(m is not None for m in dataset.maxshape):
                raise HpcoptError(f"{path}: /{name} cannot grow (written with a fixed size, "
                                  "not by hpcopt); pass --out DIR to start a new trace")

    def _attempt(self, step: Callable[[Any], None]) -> None:
        """One step of writing; HpcoptError (naming the trace and the free space) if it fails."""
        self.writing.attempt(step)
        self.writing.check()

    @property
    def rows(self) -> int:
        """Rows written so far, buffered ones included."""
        return self.rows_on_disk + len(self._rows)

    def append(self, row: dict[str, float], comm: dict[str, tuple]) -> None:
        """Add a row (every name in ``self.columns``) with rank 0's counters per label
        (``TOTALS``: ``hpcopt.run.window.comm_totals``; values left off a label's end count 0)."""
        self._rows.append((row, comm))
        if len(self._rows) >= self.flush_rows or \
                time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows and flush the file. A write that fails (a full disk, a lost
        mount) ends the writing there, as a kill would: every earlier flushed row is intact."""
        self._attempt(lambda _: self._write())

    def _write(self) -> None:
        if self._rows:
            start, rows = self.rows_on_disk, self._rows
            table = np.array([tuple(r[name] for name in self.columns) for r, _ in rows], self.row_dtype)
            self.file["rows"].resize((start + len(rows),))
            self.file["rows"][start:] = table
            new = sorted({label for _, c in rows for label in c} - set(self.labels))
            if new:  # labels first used now: their earlier counters are 0 (the fill value)
                self.labels += new
                self.file["comm"].attrs["labels"] = json.dumps(self.labels)
                if self.ops:
                    self.file["comm"].attrs["ops"] = json.dumps(self.ops)
            for name, dtype in self.comm_columns.items():
                i = TOTALS.index(name)
                values = np.array([[_value(c.get(label, ()), i) for label in self.labels]
                                   for _, c in rows], dtype)
                dataset = self.file[f"comm/{name}"]
                dataset.resize((start + len(rows), len(self.labels)))
                dataset[start:] = values
            self.rows_on_disk += len(rows)
            self._rows = []
        self.file.flush()
        self._last_flush = time.monotonic()

    def finish(self, summary: dict[str, Any]) -> None:
        """Flush, then record the end of the run (group ``summary``, its attributes)."""
        self.flush()

        def write(f: Any) -> None:
            f.create_group("summary").attrs.update(summary)
            f.flush()

        self._attempt(write)

    def close(self) -> None:
        """Write what is buffered and close; a failure not raised before is raised here."""
        if self.writing.failure is None and self.file.id.valid:
            self.writing.attempt(lambda _: self._write())
        self.writing.close()

    def roll_back(self, rows: int) -> None:
        """Cut the trace back to its first ``rows`` rows (the survivors of a lost rank go on
        from an earlier round: hpcopt.run.rank_loss); the buffered rows are written first."""
        self.flush()
        self._attempt(lambda _: self._truncate(rows))

    def record_rank_loss(self, loss: RankLoss) -> None:
        """Append one lost rank (``RankLoss``) to ``/rank_losses``
        (a dataset per field: docs/formats.md), made at the first loss."""
        def write(f: Any) -> None:
            group = f.require_group(RANK_LOSSES)
            for name, dtype in RANK_LOSS_COLUMNS.items():
                if name not in group:
                    group.create_dataset(name, (0,), maxshape=(None,), dtype=dtype, chunks=(64,))
            at = group["step"].shape[0]
            for name in RANK_LOSS_COLUMNS:
                group[name].resize((at + 1,))
                group[name][at] = getattr(loss, name)
            f.flush()

        self._attempt(write)

    def _forget_rank_losses_after(self, step: int) -> None:
        """Drop the losses recorded after ``step`` (a resumed run's checkpoint came before them)."""
        group = self.file.get(RANK_LOSSES)
        if group is None:
            return
        keep = group["step"][()] <= step
        for name in RANK_LOSS_COLUMNS:
            values = group[name][()][keep[:group[name].shape[0]]]
            group[name].resize((values.size,))
            group[name][:] = values

    def _truncate(self, rows: int) -> None:
        self.file["rows"].resize((rows,))
        for name in self.comm_columns:
            self.file[f"comm/{name}"].resize((rows, len(self.labels)))
        if "summary" in self.file:
            del self.file["summary"]
        self.rows_on_disk = rows
        self.file.flush()


def _value(totals: tuple, index: int) -> float:
    """The ``index``-th of a label's counters (``TOTALS``), 0 where it has fewer."""
    return totals[index] if index < len(totals) else 0


def _check_resumable(path: Path, run_id: str, keep_rows: int) -> Trace:
    """``path`` read (vetted by the caller first, hpcopt.run.vetting: this process then writes to
    it); HpcoptError unless it is this run's trace with at least ``keep_rows`` rows."""
    trace = read_trace(path)
    if trace.attrs.get("run_id") != run_id:
        raise HpcoptError(f"{path} is the trace of another run (run_id {trace.attrs.get('run_id')!r}, "
                          f"the checkpoint has {run_id!r}); pass --out DIR for a new run directory")
    if trace.rows < keep_rows:
        raise HpcoptError(f"{path} holds {trace.rows} rows but the checkpoint was taken after "
                          f"{keep_rows}; pass --out DIR to start a new trace")
    return trace


@dataclass
class Trace:
    """A trace file read into memory (rows cut to the length every column has)."""

    path: Path
    attrs: dict[str, Any]
    config: Config
    columns: dict[str, np.ndarray]
    comm: dict[str, dict[str, np.ndarray]]
    summary: dict[str, Any] | None
    ops: dict[str, str] | None = None  # label -> operation (traces written with --network)
    #: /rank_losses (--on-rank-loss continue): step, rank, recover_seconds, round_step; empty: none lost
    rank_losses: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.columns["step"].size)

    def bytes_total(self) -> np.ndarray:
        """Rank 0's bytes communicated so far, all labels, per row."""
        total = np.zeros(self.rows, dtype=np.int64)
        for fields in self.comm.values():
            total += fields["bytes"]
        return total


def read_trace(path: str | Path) -> Trace:
    """Read and check a trace file; HpcoptError (one line, naming the file) when it is unusable.

    Rows are cut to the number every dataset holds (a run killed between the writes of one
    chunk leaves some datasets a chunk ahead).
    """
    path = Path(path)
    with open_for_reading(path, FILE_KIND, *DECLARED_BOUND) as f:
        try:
            check_format(f.attrs, path, FORMAT, VERSION, "trace")
            attrs = {k: _plain(v) for k, v in f.attrs.items()}
            config = config_from_toml(text_attr(f.attrs, "config", path), path)
            table = _dataset(f, "rows", path, 1)
            table_rows = table.shape[0]
            fields = table.dtype.fields or {}
            if any(name not in fields or fields[name][0].kind not in "if" for name in COLUMNS):
                raise HpcoptError(f"{path}: /rows lacks numeric fields {', '.join(COLUMNS)}")
            present = [*COLUMNS, *(name for name in fields if name not in COLUMNS and optional_dtype(name))]
            data = _read_columns(table, present)
            labels = json_attr(f["comm"].attrs, "labels", path) if "comm" in f else None
            if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
                raise HpcoptError(f"{path}: /comm attribute 'labels' is missing or malformed")
            names = [*COMM_COLUMNS, *(name for name in (*NODE_COLUMNS, MODELLED) if name in f["comm"])]
            counters = {name: _dataset(f, f"comm/{name}", path, 2)[()] for name in names}
            summary = {k: _plain(v) for k, v in f["summary"].attrs.items()} if "summary" in f else None
            ops = json_attr(f["comm"].attrs, "ops", path) if "ops" in f["comm"].attrs else None
            losses = {name: _dataset(f, f"{RANK_LOSSES}/{name}", path, 1)[()]
                      for name in RANK_LOSS_COLUMNS} if RANK_LOSSES in f else {}
        except READ_ERRORS as exc:
            raise HpcoptError(f"{path} is a damaged trace ({type(exc).__name__}: {exc})") from None
    rows = min(table_rows, *(c.shape[0] for c in counters.values()))
    width = min(len(labels), *(c.shape[1] for c in counters.values()))
    columns = {name: column[:rows] for name, column in data.items()}
    comm = {label: {name: counters[name][:rows, j] for name in counters}
            for j, label in enumerate(labels[:width])}
    return Trace(path, attrs, config, columns, comm, summary, ops if isinstance(ops, dict) else None,
                 losses)


def _read_columns(table: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The fields ``names`` of the compound dataset ``table``, a column each, read ``READ_ROWS``
    rows at a time: memory holds the columns and one block, never the table twice."""
    columns = {name: np.empty(table.shape[0], dtype=table.dtype.fields[name][0]) for name in names}
    for start in range(0, table.shape[0], READ_ROWS):
        block = table[start:start + READ_ROWS]
        for name, column in columns.items():
            column[start:start + block.shape[0]] = block[name]
    return columns


def _dataset(f: Any, name: str, path: Path, ndim: int) -> Any:
    dataset = f.get(name)
    if dataset is None or not hasattr(dataset, "dtype"):
        raise HpcoptError(f"{path}: dataset /{name} is missing")
    if dataset.ndim != ndim or (dataset.dtype.names is None and dataset.dtype.kind not in "if"):
        raise HpcoptError(f"{path}: /{name} must be a {ndim}-D numeric dataset")
    return dataset


def _plain(value: Any) -> Any:
    """An HDF5 attribute value as a plain Python value (str, int, float or list)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _resumed(previous: Any, step: int) -> str:
    """The ``resumed_at`` attribute after resuming at clock tick ``step`` (JSON list)."""
    try:
        steps = json.loads(previous) if isinstance(previous, str) else []
    except ValueError:
        steps = []
    return json.dumps([*(steps if isinstance(steps, list) else []), step])
