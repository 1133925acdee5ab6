"""The run's timeline (``--timeline true``): each rank's spans, in the trace file under ``/timeline``.

A span is (rank, step, kind, start, duration): ``start`` in seconds on the run's clock (the
trace's ``wall`` column: from the start barrier, continuing across resumes), ``step`` the
rank's step it belongs to (the steps taken so far, outside a step). Kinds are (category,
name) pairs: ("compute", "compute") for a step's time outside communication, ("comm", label)
and ("wait", label) for each counted communication call (``hpcopt.comm.Comm``: every call has a
label), ("evaluation", "evaluation" or "final") and ("checkpoint", "checkpoint"). Layout:
docs/formats.md.

Each rank records its spans (``hpcopt.run.recorder``), and rank 0 appends everyone's to
``/timeline/spans`` here (``TimelineWriter``) at the points where they are gathered. Off by
default: then nothing of this runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HpcoptError
from . import READ_ERRORS, is_int, json_attr
from .structure import open_for_reading
from .trace import DECLARED_BOUND, FILE_KIND, TraceWriter

GROUP = "timeline"
CATEGORIES = ("compute", "comm", "wait", "evaluation", "checkpoint")
#: A span in ``/timeline/spans``.
SPAN_DTYPE = np.dtype([("rank", "int32"), ("step", "int64"), ("kind", "uint16"),
                       ("start", "float64"), ("duration", "float64")])
CHUNK_SPANS = 4096


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

    def append(self, parts: Sequence[tuple[int, np.ndarray, list[list[str]], int]]) -> None:
        """Append one gather's spans (``hpcopt.run.recorder``), at most ``max_spans`` a rank:
        each rank's (rank, spans with the fields step, kind, start and duration, its table of
        kinds as [category, name] pairs, spans it dropped)."""
        codes = {kind: i for i, kind in enumerate(self.kinds)}
        pieces = []
        for rank, spans, table, dropped in parts:
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

