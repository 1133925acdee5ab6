"""The run's timeline (``--timeline true``): each rank's spans, in the trace file under ``/timeline``.

A span is (rank, step, kind, start, duration): ``start`` in seconds on the run's clock (the
trace's ``wall`` column: from the start barrier, continuing across resumes), ``step`` the
rank's step it belongs to (the steps taken so far, outside a step). Kinds are (category,
name) pairs: ("compute", "compute") for a step's time outside communication, ("comm", label)
and ("wait", label) for each counted communication call (``hpcopt.comm.Comm``: every call has a
label), ("evaluation", "evaluation" or "final") and ("checkpoint", "checkpoint"). Layout:
docs/formats.md.

Cost: each rank's ``Recorder`` keeps its spans in preallocated NumPy columns (grown by
doubling, at most ``timeline_max_spans`` a rank; further spans are counted as dropped). The
spans reach rank 0 only at points every rank passes anyway: every ``GATHER_ROWS`` finished
trace rows, before each checkpoint and at the end of the run; there one gather of four
numbers a rank and one Gatherv of the spans (label "timeline") bring them to rank 0, which
appends them to ``/timeline/spans`` and flushes. A crash loses the spans since the last of
those points. Off by default: then nothing of this runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any, TypeVar

import numpy as np

from ..comm import Comm
from ..config import Config
from ..errors import HpcoptError
from . import READ_ERRORS, is_int, json_attr, open_for_reading
from .trace import DECLARED_BOUND, FILE_KIND, TraceWriter

T = TypeVar("T")

GROUP = "timeline"
LABEL = "timeline"
CATEGORIES = ("compute", "comm", "wait", "evaluation", "checkpoint")
#: A span in ``/timeline/spans``.
SPAN_DTYPE = np.dtype([("rank", "int32"), ("step", "int64"), ("kind", "uint16"),
                       ("start", "float64"), ("duration", "float64")])
#: A span as a rank sends it to rank 0 (its rank comes with the gather's counts).
_WIRE_DTYPE = np.dtype([("step", "int64"), ("kind", "uint16"), ("start", "float64"),
                        ("duration", "float64")])
CHUNK_SPANS = 4096
#: Finished trace rows between two gathers (the trace's own ``flush_rows``).
GATHER_ROWS = 64
_FIRST_CAPACITY = 1024


class Recorder:
    """One rank's spans since the last gather; on rank 0 also the ``writer`` of ``/timeline``.

    ``communicated`` is the ``CommStats.spans`` hook; ``stepping`` and ``timed`` wrap the
    session's steps, evaluations and checkpoint writes; ``rows_finished`` and ``gather`` are
    collective. ``rank`` is this rank in the job as it started, which its spans keep after a
    lost rank (``--on-rank-loss continue``: the survivors' communicator numbers them anew)."""

    def __init__(self, max_spans: int, writer: TimelineWriter | None = None, rank: int = 0) -> None:
        self.writer, self.rank = writer, rank
        self.room = max_spans  # spans this rank may still record in this run
        self.dropped = 0       # ... and those it could not, since the last gather
        self.capacity = min(_FIRST_CAPACITY, max_spans)  # spans it may hold (<= room)
        self._columns = [np.empty(self.capacity, dtype) for dtype in ("float64", "float64", "uint16",
                                                                      "int64")]
        self._start, self._duration, self._kind, self._step = self._columns
        self.spans = 0
        self.kinds: dict[tuple[str, str], int] = {}
        self._comm_kinds: dict[str, int] = {}
        self._wait_kinds: dict[str, int] = {}
        self._compute = self.kind("compute", "compute")
        self.origin = 0.0  # perf_counter() at wall time 0 of the run's clock
        self.step = 0
        self._mark: float | None = None  # in a step: where its current compute span began
        self._rows = 0

    def kind(self, category: str, name: str) -> int:
        """The code of kind (``category``, ``name``) on this rank."""
        return self.kinds.setdefault((category, name), len(self.kinds))

    def start(self, origin: float, step: int) -> None:
        """The run's clock reads 0 at ``perf_counter() == origin``; ``step`` steps are taken."""
        self.origin, self.step = origin, step

    def _add(self, kind: int, start: float, duration: float) -> None:
        i = self.spans
        if i >= self.capacity and not self._grow():
            self.dropped += 1
            return
        self._start[i] = start
        self._duration[i] = duration
        self._kind[i] = kind
        self._step[i] = self.step
        self.spans = i + 1

    def _grow(self) -> bool:
        """Double the room for spans, up to ``room``; False when it holds ``room`` spans already."""
        capacity = min(2 * self.capacity, self.room)
        if capacity <= self.capacity:
            return False
        if capacity > self._start.size:
            for i, column in enumerate(self._columns):
                grown = np.empty(capacity, column.dtype)
                grown[:self.spans] = column[:self.spans]
                self._columns[i] = grown
            self._start, self._duration, self._kind, self._step = self._columns
        self.capacity = capacity
        return True

    def communicated(self, op: str, label: str, seconds: float) -> None:
        """A counted call of ``seconds`` has just ended: its span, and in a step the compute
        span before it."""
        end = perf_counter()
        start = end - seconds
        if self._mark is not None:
            if start > self._mark:
                self._add(self._compute, self._mark, start - self._mark)
            self._mark = end
        kinds = self._wait_kinds if op == "wait" else self._comm_kinds
        kind = kinds.get(label)
        if kind is None:
            kind = kinds[label] = self.kind("wait" if op == "wait" else "comm", label)
        self._add(kind, start, seconds)

    def stepping(self, step: Callable[[], T], progress: Callable[[], int]) -> Callable[[], T]:
        """``step`` recording the compute spans between its communication; ``progress()``:
        the steps taken."""
        def recorded() -> T:
            self.step = progress() + 1
            self._mark = perf_counter()
            ended = step()
            end, mark, self._mark = perf_counter(), self._mark, None
            self._add(self._compute, mark, end - mark)
            return ended

        return recorded

    def timed(self, category: str, name: str, function: Callable[..., T]) -> Callable[..., T]:
        """``function`` recording its span as kind (``category``, ``name``)."""
        kind = self.kind(category, name)

        def recorded(*args: Any) -> T:
            start = perf_counter()
            result = function(*args)
            self._add(kind, start, perf_counter() - start)
            return result

        return recorded

    def rows_finished(self, rows: int, comm: Comm, due: bool) -> None:
        """Collective: ``rows`` more trace rows are finished; gather every ``GATHER_ROWS`` of
        them, and when ``due`` (before a checkpoint)."""
        self._rows += rows
        if due or self._rows >= GATHER_ROWS:
            self.gather(comm)

    def gather(self, comm: Comm) -> None:
        """Collective: every rank's spans to rank 0, which appends them to the file."""
        n, dropped = self.spans, self.dropped
        table = json.dumps([list(k) for k in sorted(self.kinds, key=self.kinds.__getitem__)]).encode()
        wire = np.empty(n, _WIRE_DTYPE)
        wire["step"], wire["kind"] = self._step[:n], self._kind[:n]
        wire["start"], wire["duration"] = self._start[:n] - self.origin, self._duration[:n]
        payload = np.concatenate([wire.view(np.uint8), np.frombuffer(table, np.uint8)])
        counts = comm.gather(np.array([n, len(table), dropped, self.rank], np.int64), LABEL)
        everyone = comm.gatherv(payload, None if counts is None else
                                counts[:, 0] * _WIRE_DTYPE.itemsize + counts[:, 1], LABEL)
        later = self.spans - n  # the gather's own spans, recorded (or dropped) while it ran
        for column in self._columns:
            column[:later] = column[n:self.spans]
        self.spans, self.room, self._rows = later, self.room - n, 0
        self.capacity = max(later, min(self.capacity, self.room))
        self.dropped -= dropped
        if self.writer is not None:
            assert counts is not None and everyone is not None
            self.writer.append(counts, everyone)


def _received(counts: np.ndarray,
              everyone: np.ndarray) -> list[tuple[int, np.ndarray, list[list[str]], int]]:
    """Each rank's (rank, spans, kind table, dropped) from a gather's ``counts`` and bytes."""
    parts, offset = [], 0
    for n, table_bytes, dropped, rank in counts.tolist():
        end = offset + n * _WIRE_DTYPE.itemsize
        spans = everyone[offset:end].view(_WIRE_DTYPE)
        table = json.loads(everyone[end:end + table_bytes].tobytes())
        parts.append((rank, spans, table, dropped))
        offset = end + table_bytes
    return parts


class TimelineWriter:
    """Rank 0's appender of ``/timeline`` in the trace ``trace`` writes (created if absent; a
    resumed run's was cut at its checkpoint by ``cut``)."""

    def __init__(self, trace: TraceWriter, ranks: int, max_spans: int) -> None:
        self.trace, self.ranks, self.max_spans = trace, ranks, max_spans
        f = trace.file
        self.kinds: list[tuple[str, str]] = []
        if GROUP in f:
            kinds, self.dropped = _checked_group(f, trace.path, ranks)
            self.kinds = [(k[0], k[1]) for k in kinds]
            self.on_disk = np.bincount(f[GROUP]["spans"]["rank"], minlength=ranks)
            return
        self.dropped, self.on_disk = [0] * ranks, np.zeros(ranks, np.int64)

        def create(f: Any) -> None:
            group = f.create_group(GROUP)
            group.attrs.update({"kinds": "[]", "dropped": json.dumps(self.dropped)})
            group.create_dataset("spans", (0,), maxshape=(None,), dtype=SPAN_DTYPE, chunks=(CHUNK_SPANS,))
            f.flush()

        trace.writing.attempt(create)
        trace.writing.check()

    def append(self, counts: np.ndarray, everyone: np.ndarray) -> None:
        """Append a gather's spans (``Recorder.gather``), at most ``max_spans`` a rank."""
        codes = {kind: i for i, kind in enumerate(self.kinds)}
        pieces = []
        for rank, spans, table, dropped in _received(counts, everyone):
            kept = spans[:max(0, self.max_spans - int(self.on_disk[rank]))]
            self.dropped[rank] += dropped + len(spans) - len(kept)
            self.on_disk[rank] += len(kept)
            local = np.array([codes.setdefault((category, name), len(codes)) for category, name in table]
                             or [0])
            piece = np.empty(len(kept), SPAN_DTYPE)
            piece["rank"], piece["step"], piece["kind"] = rank, kept["step"], local[kept["kind"]]
            piece["start"], piece["duration"] = kept["start"], kept["duration"]
            pieces.append(piece)
        self.kinds = list(codes)
        spans = np.concatenate(pieces)

        def write(f: Any) -> None:
            group = f[GROUP]
            dataset = group["spans"]
            start = dataset.shape[0]
            dataset.resize((start + len(spans),))
            dataset[start:] = spans
            group.attrs.update({"kinds": json.dumps([list(k) for k in self.kinds]),
                                "dropped": json.dumps(self.dropped)})
            f.flush()

        self.trace.writing.attempt(write)
        self.trace.writing.check()


def cut(trace: TraceWriter, wall: float) -> None:
    """Rank 0 of a run resumed at wall time ``wall`` (its checkpoint's): drop the spans of
    ``/timeline`` that start from there on (the resumed run redoes that part) and end the ones
    that run past it there, so that the resumed run's spans follow them."""
    f = trace.file
    if GROUP not in f:
        return
    _checked_group(f, trace.path, int(f.attrs.get("world_size", 0)))
    dataset = f[GROUP]["spans"]
    spans = dataset[()]
    kept = spans[spans["start"] < wall]
    ends = kept["start"] + kept["duration"]
    over = ends > wall  # the checkpoint write itself (its wall time was taken as it began)
    kept["duration"][over] = wall - kept["start"][over]
    if len(kept) < len(spans) or over.any():
        def write(f: Any) -> None:
            dataset.resize((len(kept),))
            dataset[:] = kept
            f.flush()

        trace.writing.attempt(write)
        trace.writing.check()


def open_timeline(config: Config, trace: TraceWriter | None, comm: Comm,
                  resumed_wall: float | None) -> Recorder | None:
    """Every rank (inside ``agreed``): this rank's recorder when the run records a timeline
    (``config.run.timeline``), with rank 0's writer; None otherwise. A resumed run's
    ``/timeline`` is cut at its checkpoint's wall time (``resumed_wall``) either way."""
    if trace is not None and resumed_wall is not None:
        cut(trace, resumed_wall)
    run = config.run
    if not run.timeline:
        return None
    if not run.out:
        raise HpcoptError("timeline is recorded in the trace: it needs a run directory (--out DIR)")
    writer = TimelineWriter(trace, comm.size, run.timeline_max_spans) if trace is not None else None
    return Recorder(run.timeline_max_spans, writer, comm.rank)


def _checked_group(f: Any, path: Path, ranks: int) -> tuple[list[list[str]], list[int]]:
    """(kinds, dropped) of ``/timeline``, once its layout is known to be hpcopt's for
    ``ranks`` ranks; HpcoptError naming the file otherwise."""
    group = f[GROUP]
    spans = group.get("spans")
    if not hasattr(group, "attrs") or spans is None or not hasattr(spans, "dtype") or spans.ndim != 1:
        raise HpcoptError(f"{path}: /{GROUP} must hold a 1-D dataset 'spans'")
    fields = spans.dtype.fields or {}
    if sorted(fields) != sorted(SPAN_DTYPE.names or ()) or \
            any(fields[name][0].kind not in "iuf" for name in fields):
        raise HpcoptError(f"{path}: /{GROUP}/spans must have the numeric fields "
                          f"{', '.join(SPAN_DTYPE.names or ())}")
    kinds = json_attr(group.attrs, "kinds", path)
    if not isinstance(kinds, list) or not all(
            isinstance(k, list) and len(k) == 2 and k[0] in CATEGORIES and isinstance(k[1], str)
            for k in kinds):
        raise HpcoptError(f"{path}: /{GROUP} attribute 'kinds' must list [category, name] pairs "
                          f"(categories {', '.join(CATEGORIES)})")
    dropped = json_attr(group.attrs, "dropped", path)
    if not isinstance(dropped, list) or len(dropped) != ranks or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dropped):
        raise HpcoptError(f"{path}: /{GROUP} attribute 'dropped' must list {ranks} counts >= 0, "
                          "one per rank")
    return kinds, dropped


@dataclass
class Timeline:
    """A trace's ``/timeline``, read and checked."""

    path: Path
    spans: np.ndarray      # SPAN_DTYPE
    kinds: list[tuple[str, str]]
    dropped: list[int]     # per rank

    @property
    def ranks(self) -> int:
        return len(self.dropped)


def read_timeline(path: str | Path) -> Timeline | None:
    """The timeline of the trace ``path``, None when it has none; HpcoptError (one line,
    naming the file) when it is damaged."""
    path = Path(path)
    with open_for_reading(path, FILE_KIND, *DECLARED_BOUND) as f:
        if GROUP not in f:
            return None
        try:
            ranks = f.attrs.get("world_size")
            if not is_int(ranks) or ranks < 1:
                raise HpcoptError(f"{path}: attribute 'world_size' is missing or not a positive integer")
            kinds, dropped = _checked_group(f, path, int(ranks))
            spans = f[GROUP]["spans"][()].astype(SPAN_DTYPE)
        except READ_ERRORS as exc:
            raise HpcoptError(f"{path} has a damaged timeline ({type(exc).__name__}: {exc})") from None
    if spans.size:
        if spans["kind"].max() >= len(kinds) or spans["rank"].min() < 0 or spans["rank"].max() >= ranks:
            raise HpcoptError(f"{path}: /{GROUP}/spans names kinds or ranks it does not have")
        times = np.concatenate([spans["start"], spans["duration"]])
        if not np.isfinite(times).all() or spans["duration"].min() < 0:
            raise HpcoptError(f"{path}: /{GROUP}/spans holds non-finite times or negative durations")
    return Timeline(path, spans, [(k[0], k[1]) for k in kinds], dropped)


def chrome_events(timeline: Timeline) -> Iterator[dict[str, Any]]:
    """The Trace Event Format events of ``timeline``, one at a time: a "process_name" metadata
    event per rank ("rank N") and a complete ("X") event per span, times in microseconds."""
    for rank in range(timeline.ranks):
        yield {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}}
        yield {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}
    kinds = timeline.kinds
    for rank, step, kind, start, duration in timeline.spans.tolist():
        category, name = kinds[kind]
        yield {"name": name, "cat": category, "ph": "X", "ts": round(start * 1e6, 3),
               "dur": round(duration * 1e6, 3), "pid": rank, "tid": 0, "args": {"step": step}}


def dropped_note(timeline: Timeline) -> str:
    """"" or a line saying how many spans the cap dropped."""
    total = sum(timeline.dropped)
    if not total:
        return ""
    worst = max(range(timeline.ranks), key=timeline.dropped.__getitem__)
    return (f"{timeline.path}: {total} spans were not kept (timeline_max_spans; rank {worst} "
            f"dropped {timeline.dropped[worst]}): the timeline ends early")

