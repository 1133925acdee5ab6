"""Waiting at collectives (hpcopt/io/waits.py): a call's own seconds are the least of its ranks'
spans; a straggling rank's partners spend their extra seconds waiting, not transferring."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcopt.io.timeline import SPAN_DTYPE, Timeline, read_timeline
from hpcopt.io.trace import read_trace
from hpcopt.io.waits import own_seconds
from tests.command_line import launch

KINDS = [("compute", "compute"), ("comm", "average"), ("wait", "trace"), ("comm", "leaders"),
         ("comm", "setup")]


def timeline(spans: list[tuple[int, int, float]], ranks: int = 3) -> Timeline:
    """A timeline of (rank, kind, duration) spans in order."""
    table = np.zeros(len(spans), SPAN_DTYPE)
    for i, (rank, kind, duration) in enumerate(spans):
        table[i] = (rank, 0, kind, float(i), duration)
    return Timeline(Path("t.h5"), table, KINDS, [0] * ranks)


def test_each_call_costs_the_least_of_its_ranks_spans():
    spans = [(0, 1, 0.5), (1, 1, 0.1), (2, 1, 0.4),      # first average: rank 1 came last
             (0, 1, 0.2), (1, 1, 0.3), (2, 1, 0.25),     # second: rank 0 did
             (0, 2, 0.05), (1, 2, 0.01), (2, 2, 0.02),   # a wait span counts like a call
             (0, 3, 1.0),                                # a call only rank 0 made
             (0, 0, 9.0), (1, 0, 9.0), (2, 0, 9.0),      # computation is no call
             (0, 4, 3.0), (1, 4, 3.0), (2, 4, 3.0)]
    own = own_seconds(timeline(spans), labels=("average", "trace", "leaders"))
    assert own == pytest.approx({"average": 0.3, "trace": 0.01, "leaders": 1.0})
    assert own_seconds(timeline(spans), until=3.0) == pytest.approx({"average": 0.1})  # the first 3 spans


def test_a_straggler_s_partners_wait_at_the_average(tmp_path):
    """Rank 1 computes 5 times slower (``--straggler 1:0.2``): rank 0's seconds in the averages
    are mostly its wait for rank 1, and the averages' own seconds a small part of them."""
    out = tmp_path / "run"
    done = launch(["train", "--dataset", "digits", "--hidden", "64", "--steps", "16", "--interval", "2",
                   "--trace-every", "4", "--progress", "false", "--timeline", "true", "--straggler", "1:0.2",
                   "--out", str(out)])
    assert done.returncode == 0, done.stderr
    held = float(read_trace(out / "trace.h5").comm["average"]["seconds"][-1])
    timeline = read_timeline(out / "trace.h5")
    assert timeline is not None
    own = own_seconds(timeline)["average"]
    assert 0 < own < 0.5 * held
