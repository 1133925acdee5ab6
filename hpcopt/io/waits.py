"""Waiting at collectives, read from a run's timeline (``--timeline true``).

A rank's seconds in a collective call are the call's own (the transfer, which an alpha-beta
model prices: ``hpcopt.comm.costmodel``) plus its wait for the ranks that came later. Every rank
leaves a collective at about the same time, once the last one has arrived and the data has
moved, so the rank that arrived last waited for no other: its seconds in the call are the
call's own, and each other rank's excess over them is its "wait at N x N" (Scalasca's wait
states: Geimer, Wolf, Wylie, Abraham, Becker, Mohr, "The Scalasca performance toolset
architecture", CCPE 2010). On a machine whose ranks share cores that wait is mostly the
scheduler's, and no network model can price it.

Per label (communication and wait spans alike: a non-blocking call's post and its wait), the
k-th span of the label on each rank is one call, and its own seconds are the least of its
ranks' spans. Calls of one label on different communicators at once (two-level averaging's
node groups) are counted as one call, the least of their spans.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np

from .timeline import Timeline

#: The categories of a timeline whose spans are communication calls.
CALL_CATEGORIES = ("comm", "wait")


def own_seconds(timeline: Timeline, labels: Collection[str] | None = None,
                until: float = math.inf) -> dict[str, float]:
    """label -> the seconds of its calls themselves (module docstring) that began before
    ``until`` on the run's clock (a trace row's ``wall``: the calls its counters hold), for
    every label of a communication or wait span, or those of ``labels``."""
    spans = timeline.spans[timeline.spans["start"] < until]
    out: dict[str, float] = {}
    for code, (category, label) in enumerate(timeline.kinds):
        if category not in CALL_CATEGORIES or (labels is not None and label not in labels):
            continue
        chosen = spans[spans["kind"] == code]
        if not chosen.size:
            continue
        per_rank = [chosen["duration"][chosen["rank"] == rank] for rank in range(timeline.ranks)]
        least = np.full(max(d.size for d in per_rank), math.inf)
        for durations in per_rank:
            np.minimum(least[:durations.size], durations, out=least[:durations.size])
        out[label] = out.get(label, 0.0) + float(least.sum())
    return out
