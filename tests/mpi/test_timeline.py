"""The timeline under MPI: every rank's spans reach rank 0's trace at the agreed points, one
process per rank in the Trace Event Format export, for data-parallel and pipeline runs."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hpcopt.config import build_config
from hpcopt.io.timeline import read_timeline
from hpcopt.run.recorder import GATHER_ROWS
from hpcopt.study.export import export
from tests.runs import fresh_pipeline, fresh_train
from tests.trace_events import assert_nested, check_trace_event_format

pytestmark = pytest.mark.mpi


def exported(comm, out, tmp):
    """Rank 0: the complete events of ``out``'s timeline, and each rank's kinds counted."""
    [path] = export([str(out)], "chrome", tmp)
    document = json.loads(path.read_text())
    events = check_trace_event_format(document)
    names = sorted((e["pid"], e["args"]["name"]) for e in document["traceEvents"]
                   if e["ph"] == "M" and e["name"] == "process_name")
    assert names == [(r, f"rank {r}") for r in range(comm.size)]
    assert_nested(events)
    per_rank = [Counter((e["cat"], e["name"]) for e in events if e["pid"] == r) for r in range(comm.size)]
    return events, per_rank


def test_every_ranks_spans_reach_the_trace(comm, shared_dir):
    out = shared_dir / "dp"
    steps = 4 * (GATHER_ROWS + 4)  # rows every 4 steps: one gather on the way, one at the end
    fresh_train(build_config(None, {"dataset": "digits", "hidden": "16", "steps": str(steps),
                                    "interval": "4", "trace_every": "4", "progress": "false",
                                    "out": str(out), "timeline": "true"}))
    if comm.rank != 0:
        return
    timeline = read_timeline(out / "trace.h5")
    assert timeline is not None and timeline.dropped == [0] * comm.size
    events, per_rank = exported(comm, out, shared_dir / "x")
    for counts in per_rank:
        assert counts[("comm", "average")] == steps // 4  # every rank takes part in every round
        assert counts[("comm", "timeline")] == 2 * 2      # a gather of counts and of spans, twice
        assert counts[("evaluation", "final")] == 1 and counts[("checkpoint", "checkpoint")] == 1
    for r in range(comm.size):
        assert {e["args"]["step"] for e in events if e["pid"] == r and e["cat"] == "compute"} == \
            set(range(1, steps + 1))


def test_pipeline_stages_record_their_messages_and_waits(comm, shared_dir):
    out = shared_dir / "pipe"
    iterations = 5
    fresh_pipeline(build_config(None, {"algorithm": "pprs", "problem": "l1_chain", "samples": "3",
                                       "smoothing": "0.05", "lr": "0.02", "dtype": "float64",
                                       "steps": str(iterations), "trace_every": "2", "progress": "false",
                                       "out": str(out), "timeline": "true"}))
    if comm.rank != 0:
        return
    events, per_rank = exported(comm, out, shared_dir / "x")
    for stage, counts in enumerate(per_rank):
        if comm.size > 1:  # every stage sends forward or back, and waits for what it receives
            assert counts[("comm", "pprs.activation")] + counts[("comm", "pprs.gradient")] > 0, stage
            assert counts[("wait", "pprs.activation")] + counts[("wait", "pprs.gradient")] > 0, stage
        assert {e["args"]["step"] for e in events if e["pid"] == stage and e["cat"] == "compute"} == \
            set(range(1, iterations + 1))
