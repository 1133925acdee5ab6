"""``--timeline true``: each rank's spans in the trace's /timeline, exported as Trace Event Format
JSON (read back by json and checked against the format's required fields), bounded by
``timeline_max_spans``, cut and continued on resume; off, the run is today's."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from hpcopt.io.timeline import read_timeline
from hpcopt.io.trace import read_trace
from hpcopt.run import recorder
from hpcopt.run.vetting import vet_traces
from hpcopt.study.export import export
from tests import crafted
from tests.command_line import assert_one_line_error, launch
from tests.runs import fresh_train
from tests.trace_events import assert_nested, check_trace_event_format

STEPS = 24


def config(out: Path | str, **overrides: str):
    options = {"dataset": "digits", "hidden": "16", "steps": str(STEPS), "interval": "4",
               "trace_every": "4", "eval_every": "12", "checkpoint_every": "12", "progress": "false",
               "out": str(out), "timeline": "true", **overrides}
    return build_config(None, options)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("timeline") / "run-t"
    fresh_train(config(out))
    return out


def test_chrome_export_is_trace_event_format_json_of_every_kind_of_span(run, tmp_path):
    [path] = export([str(run)], "chrome", tmp_path / "out")
    assert path == tmp_path / "out" / "run-t" / "timeline.json"
    with open(path) as handle:
        document = json.load(handle)
    events = check_trace_event_format(document)
    names = [e for e in document["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert [(e["pid"], e["args"]["name"]) for e in names] == [(0, "rank 0")]
    kinds = Counter((e["cat"], e["name"]) for e in events)
    rounds = STEPS // 4
    assert kinds[("comm", "average")] == rounds  # one allreduce per round, as the trace counts
    assert kinds[("evaluation", "evaluation")] == 2 and kinds[("evaluation", "final")] == 1
    assert kinds[("checkpoint", "checkpoint")] == 2 and kinds[("wait", "trace")] >= 1
    assert {("comm", "eval"), ("comm", "trace"), ("comm", "checkpoint"), ("comm", "timeline")} <= set(kinds)
    steps = {e["args"]["step"] for e in events if e["cat"] == "compute"}
    assert steps == set(range(1, STEPS + 1))
    assert_nested(events)
    trace = read_trace(run / "trace.h5")
    ends = [e["ts"] + e["dur"] for e in events]
    assert 0 <= min(e["ts"] for e in events) and max(ends) <= 1e6 * trace.summary["wall"] + 1e5
    averages = sorted(e["ts"] for e in events if e["name"] == "average")
    assert averages == sorted(averages) and np.all(np.diff(averages) > 0)


def test_a_run_without_a_timeline_is_one_error_line(tmp_path):
    out = tmp_path / "plain"
    fresh_train(config(out, timeline="false"))
    assert read_timeline(out / "trace.h5") is None
    with pytest.raises(HpcoptError, match="has no timeline: record one with --timeline true"):
        export([str(out)], "chrome", tmp_path / "x")
    assert_one_line_error(launch(["export", str(out), "--format", "chrome", "--out", str(tmp_path / "y")],
                                 ranks=1), "has no timeline")


def test_off_the_run_is_todays_and_on_it_computes_the_same(run, tmp_path):
    off = tmp_path / "off"
    fresh_train(config(off, timeline="false"))
    with h5py.File(off / "trace.h5") as f:
        assert "timeline" not in f and "timeline" not in json.loads(f["comm"].attrs["labels"])
    a, b = read_trace(run / "trace.h5"), read_trace(off / "trace.h5")
    for name in ("loss_mean", "grad_norm", "eval_loss", "eval_accuracy"):
        np.testing.assert_array_equal(a.columns[name], b.columns[name], err_msg=name)
    final = f"checkpoints/step-{STEPS:09d}.h5"
    np.testing.assert_array_equal(read_checkpoint(run / final).model, read_checkpoint(off / final).model)
    for label, fields in b.comm.items():
        np.testing.assert_array_equal(fields["bytes"], a.comm[label]["bytes"], err_msg=label)


def test_the_cap_bounds_the_spans_and_counts_those_dropped(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(recorder, "_FIRST_CAPACITY", 4)  # the columns grow 4, 8, 16, 30
    out = tmp_path / "capped"
    fresh_train(config(out, timeline_max_spans="30"))
    capped, whole = read_timeline(out / "trace.h5"), read_timeline(run / "trace.h5")
    assert capped is not None and whole is not None
    assert capped.spans.size == 30 and capped.dropped[0] == whole.spans.size - 30 > 0
    assert capped.spans["step"].max() < STEPS  # the first spans are kept
    export([str(out)], "chrome", tmp_path / "x")
    assert f"{capped.dropped[0]} spans were not kept (timeline_max_spans" in capsys.readouterr().err


def span_counts(timeline, steps) -> Counter:
    return Counter((timeline.kinds[kind], step) for kind, step in
                   zip(timeline.spans["kind"].tolist(), timeline.spans["step"].tolist()) if step in steps)


@pytest.mark.parametrize("resumed_with", ["true", "false"])
def test_resume_cuts_the_timeline_at_its_checkpoint_and_continues_it(run, tmp_path, resumed_with):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    checkpoint = copy / "checkpoints" / "step-000000012.h5"
    wall = read_checkpoint(checkpoint).wall_seconds
    fresh_train(config(copy, timeline=resumed_with), resume=checkpoint)
    whole, resumed = read_timeline(run / "trace.h5"), read_timeline(copy / "trace.h5")
    assert whole is not None and resumed is not None
    before, after = set(range(12)), set(range(13, STEPS + 1))
    assert span_counts(resumed, before) == span_counts(whole, before)
    assert span_counts(resumed, after) == (span_counts(whole, after) if resumed_with == "true" else Counter())
    late = resumed.spans["step"] > 12
    assert (resumed.spans["start"][late] >= wall).all() and (resumed.spans["start"][~late] < wall).all()
    [path] = export([str(copy)], "chrome", tmp_path / "x")
    assert_nested(check_trace_event_format(json.loads(path.read_text())))  # no span twice


@pytest.mark.parametrize("craft, words", [
    (lambda p: crafted.huge_timeline(p, 1 << 22), "declare"),
    (lambda p: crafted.timeline_attribute(p, "kinds", '[["compute"]]'), "'kinds' must list"),
    (lambda p: crafted.timeline_attribute(p, "kinds", "[not json"), "'kinds' is not valid JSON"),
    (lambda p: crafted.timeline_attribute(p, "dropped", "[1, 2]"), "'dropped' must list 1 counts"),
    (lambda p: crafted.timeline_span_kind(p, 999), "names kinds or ranks it does not have"),
])
def test_a_crafted_timeline_is_refused_in_one_line(run, tmp_path, craft, words):
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    craft(bad / "trace.h5")
    with pytest.raises(HpcoptError, match=words):
        vet_traces([bad / "trace.h5"])
    with pytest.raises(HpcoptError, match=words):  # also the resumed run that would append to it
        fresh_train(config(bad), resume=bad / "checkpoints" / "step-000000012.h5")
    assert_one_line_error(launch(["export", str(bad), "--format", "chrome", "--out", str(tmp_path / "x")],
                                 ranks=1), words)


def test_a_timeline_needs_the_trace_and_a_run_directory():
    with pytest.raises(HpcoptError, match=r"timeline is recorded in the trace: it needs trace = true"):
        config(Path("unused"), trace="false")
    with pytest.raises(HpcoptError, match=r"it needs a run directory \(--out DIR\)"):
        fresh_train(config("", checkpoint_every="0"))
