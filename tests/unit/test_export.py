"""``hpcopt export``: a trace's rows and per-label communication table as CSV, read back by the
csv module, and as TensorBoard event files, read back by TensorBoard's own reader (those tests
skip where the optional tensorboard extra is not installed)."""

from __future__ import annotations

import csv
import math
import sys

import numpy as np
import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.io.trace import read_trace
from hpcopt.study.export import export, scalars
from tests.command_line import assert_one_line_error, launch
from tests.runs import fresh_train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run with evaluations along the way and a network profile (modelled seconds)."""
    out = tmp_path_factory.mktemp("export") / "run-a"
    fresh_train(build_config(None, {"dataset": "digits", "hidden": "16", "steps": "12", "interval": "3",
                                    "trace_every": "3", "eval_every": "6", "network": "eth10",
                                    "progress": "false", "out": str(out)}))
    return out


def cell(value: float | int) -> str:
    return "" if isinstance(value, float) and math.isnan(value) else str(value)


def test_csv_holds_the_rows_and_the_communication_table(run, tmp_path):
    written = export([str(run)], "csv", tmp_path / "out")
    assert written == [tmp_path / "out" / "run-a" / "rows.csv", tmp_path / "out" / "run-a" / "comm.csv"]
    trace = read_trace(run / "trace.h5")
    with open(written[0], newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(trace.columns) and len(rows) == trace.rows == 4
    for i, row in enumerate(rows):
        for name, column in trace.columns.items():
            value = column[i].item()
            assert row[name] == cell(value) or float(row[name]) == value, (name, row[name], value)
    assert [row["eval_accuracy"] == "" for row in rows] == [True, False, True, False]
    with open(written[1], newline="") as handle:
        comm = list(csv.DictReader(handle))
    assert list(comm[0]) == ["step", "label", "op", "calls", "bytes", "seconds", "modelled", "in_node_calls",
                             "in_node_bytes"]
    assert len(comm) == trace.rows * len(trace.comm)
    averages = [row for row in comm if row["label"] == "average"]
    assert [int(row["step"]) for row in averages] == [3, 6, 9, 12]
    assert [int(row["bytes"]) for row in averages] == list(trace.comm["average"]["bytes"])
    assert [int(row["in_node_bytes"]) for row in averages] == list(trace.comm["average"]["in_node_bytes"])
    assert [float(row["modelled"]) for row in averages] == list(trace.comm["average"]["modelled"])
    assert {row["op"] for row in averages} == {trace.ops["average"]}


@pytest.mark.extra
def test_tensorboard_event_files_are_read_by_tensorboard(run, tmp_path):
    pytest.importorskip("tensorboardX", reason="the optional tensorboard extra is not installed")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                      reason="tensorboard (its reader) is not installed")
    [events] = export([str(run)], "tensorboard", tmp_path / "tb")
    assert events.parent == tmp_path / "tb" / "run-a" and events.name.startswith("events.out.tfevents.")
    reader = accumulator.EventAccumulator(str(events.parent))
    reader.Reload()
    tags = set(reader.Tags()["scalars"])
    trace = read_trace(run / "trace.h5")
    assert {"train/loss_mean", "train/lr", "train/grad_norm", "eval/accuracy", "eval/loss",
            "comm/bytes/average", "comm/seconds/average", "comm/modelled/average", "run/rounds"} <= tags
    loss = reader.Scalars("train/loss_mean")
    assert [e.step for e in loss] == list(trace.columns["step"])
    np.testing.assert_array_equal([e.value for e in loss], trace.columns["loss_mean"].astype(np.float32))
    accuracy = reader.Scalars("eval/accuracy")  # steps 6 and 12, and the end-of-run evaluation
    assert [e.step for e in accuracy] == [6, 12, 12]
    assert accuracy[-1].value == np.float32(trace.summary["eval_accuracy"])
    assert [e.value for e in reader.Scalars("comm/bytes/average")] == list(trace.comm["average"]["bytes"])
    walls = [e.wall_time for e in loss]
    assert walls == sorted(walls) and walls[0] > 1.7e9  # the run's start plus its wall column
    assert len(scalars(trace)) == sum(len(reader.Scalars(tag)) for tag in tags)
    with pytest.raises(HpcoptError, match="holds TensorBoard event files already"):
        export([str(run)], "tensorboard", tmp_path / "tb")


def test_without_tensorboardx_the_error_says_what_to_install(run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(HpcoptError, match=r"needs tensorboardX: pip install 'hpcopt\[tensorboard\]'"):
        export([str(run)], "tensorboard", tmp_path / "tb")


def test_export_command_line(run, tmp_path):
    again = tmp_path / "b" / "run-a"  # another run of the same name gets a folder of its own
    again.mkdir(parents=True)
    (again / "trace.h5").write_bytes((run / "trace.h5").read_bytes())
    result = launch(["export", str(run), str(again), "--format", "csv", "--out", str(tmp_path / "o")], ranks=1)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["wrote", str(tmp_path / "o" / "run-a" / "rows.csv"),
                                     "wrote", str(tmp_path / "o" / "run-a" / "comm.csv"),
                                     "wrote", str(tmp_path / "o" / "run-a-2" / "rows.csv"),
                                     "wrote", str(tmp_path / "o" / "run-a-2" / "comm.csv")]
    assert_one_line_error(launch(["export", str(run), "--format", "json"], ranks=1), "invalid choice: 'json'")
    assert_one_line_error(launch(["export", str(tmp_path / "none"), "--format", "csv"], ranks=1),
                          "trace not found")
