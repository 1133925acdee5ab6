"""Each rank's timeline (``--timeline true``): its spans recorded as the run goes, and gathered
to rank 0, which appends them to the trace (``hpcopt.io.timeline``: the spans' meaning and
layout).

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
from collections.abc import Callable
from time import perf_counter
from typing import Any, TypeVar

import numpy as np

from ..comm import Comm
from ..config import Config
from ..errors import HpcoptError
from ..io.timeline import TimelineWriter, cut
from ..io.trace import TraceWriter

T = TypeVar("T")

LABEL = "timeline"
#: A span as a rank sends it to rank 0 (its rank comes with the gather's counts).
_WIRE_DTYPE = np.dtype([("step", "int64"), ("kind", "uint16"), ("start", "float64"),
                        ("duration", "float64")])
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
            self.writer.append(_received(counts, everyone))


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
