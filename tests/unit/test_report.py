"""``hpcopt report`` on real traces: four PNGs with one line per run and a markdown table."""

from __future__ import annotations

import sys
import warnings

import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.io.trace import read_trace
from hpcopt.report import (
    AXES,
    ONE_POINT_NOTE,
    PIPELINE_AXES,
    figures,
    load_traces,
    run_labels,
    run_style,
    write_report,
)
from tests.command_line import assert_one_line_error, launch

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two finished 1-rank runs that differ in the averaging interval, with evaluations."""
    from hpcopt import train
    from hpcopt.comm import Comm

    root = tmp_path_factory.mktemp("runs")
    paths = []
    for interval in (2, 8):
        out = root / f"I{interval}"
        config = build_config(None, {"dataset": "digits", "hidden": "16", "steps": "48",
                                     "interval": str(interval), "eval_every": "16",
                                     "progress": "false", "out": str(out)})
        comm = Comm()
        train(config, comm, verbose=False)
        comm.free()
        paths.append(out / "trace.h5")
    return paths


def test_report_writes_readable_pngs_and_a_table(two_runs, tmp_path):
    import matplotlib.image

    written = write_report(two_runs, tmp_path / "report")
    names = sorted(p.name for p in written)
    assert names == sorted([f"{axis.name}.png" for axis in AXES] + ["report.md"])
    for path in written:
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == PNG_SIGNATURE
            height, width, _ = matplotlib.image.imread(path).shape
            assert width > 600 and height > 600
    table = (tmp_path / "report" / "report.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| interval=")]
    assert [r.split(" | ")[0] for r in rows] == ["| interval=2", "| interval=8"]
    finished = [read_trace(p).summary for p in two_runs]
    for row, summary in zip(rows, finished):
        assert f"{summary['eval_accuracy']:.4f}" in row and " 48 " in row


def test_one_line_per_run_in_every_panel(two_runs):
    traces = load_traces([p.parent for p in two_runs])  # run directories work too
    labels = run_labels(traces)
    assert labels == ["interval=2", "interval=8"]
    figs = figures(traces, labels)
    assert sorted(figs) == sorted(axis.name for axis in AXES)
    for fig in figs.values():
        loss, accuracy = fig.axes
        assert [line.get_label() for line in loss.get_lines()] == labels
        assert [line.get_label() for line in accuracy.get_lines()] == labels
        # evaluations at steps 16, 32, 48 and the final one
        assert [len(line.get_xdata()) for line in accuracy.get_lines()] == [4, 4]
    rounds = figs["rounds"].axes[0].get_lines()
    assert max(rounds[0].get_xdata()) == 24 and max(rounds[1].get_xdata()) == 6


def test_identical_settings_are_told_apart_by_directory(two_runs, tmp_path):
    again = tmp_path / "again"
    again.mkdir()
    (again / "trace.h5").write_bytes(two_runs[0].read_bytes())
    assert run_labels(load_traces([two_runs[0], again, two_runs[1]])) == [
        "interval=2, I2", "interval=2, again", "interval=8"]
    assert run_labels(load_traces([two_runs[0], again])) == ["I2", "again"]
    assert run_labels(load_traces([two_runs[0], two_runs[0]])) == ["I2 #1", "I2 #2"]


def test_missing_matplotlib_is_a_clear_error(two_runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(HpcoptError, match=r"pip install 'hpcopt\[plot\]'"):
        write_report(two_runs, tmp_path / "report")


def test_report_command_line(two_runs, tmp_path):
    result = launch(["report", *map(str, two_runs), "--out", str(tmp_path / "r")], ranks=1)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("wrote ") == 5
    (tmp_path / "notrace.h5").write_text("nope")
    assert_one_line_error(launch(["report", str(tmp_path / "notrace.h5")], ranks=1),
                          "not an HDF5 file (expected a trace)")


def test_language_model_runs_are_reported_by_perplexity(tmp_path):
    from hpcopt import train
    from hpcopt.comm import Comm

    out = tmp_path / "lm"
    config = build_config(None, {"dataset": "shakespeare", "model": "lstm", "hidden": "8",
                                 "embed": "4", "batch_size": "4", "bptt": "8", "steps": "6",
                                 "eval_every": "3", "progress": "false", "out": str(out)})
    comm = Comm()
    train(config, comm, verbose=False)
    comm.free()
    traces = load_traces([out])
    fig = figures(traces, ["lm"])["steps"]
    assert fig.axes[1].get_ylabel() == "test perplexity"
    perplexities = fig.axes[1].get_lines()[0].get_ydata()
    assert len(perplexities) == 3 and all(p > 1 for p in perplexities)  # steps 3, 6 and final
    written = write_report([out], tmp_path / "report")
    table = (tmp_path / "report" / "report.md").read_text()
    assert "test perplexity" in table and len(written) == 5


def test_pipeline_runs_get_loss_and_bubble_panels_and_their_own_table(two_runs, tmp_path):
    from hpcopt.comm import Comm
    from hpcopt.run.pipeline import train_pipeline

    paths = []
    for algorithm, momentum in (("pprs", "0.8"), ("pipelined_agd", "0.9")):
        out = tmp_path / algorithm
        config = build_config(None, {"algorithm": algorithm, "problem": "l1_chain", "lr": "0.02",
                                     "momentum": momentum, "steps": "12", "trace_every": "3",
                                     "progress": "false", "out": str(out)})
        comm = Comm()
        train_pipeline(config, comm, verbose=False)
        comm.free()
        paths.append(out)
    traces = load_traces(paths)
    figs = figures(traces, run_labels(traces))
    assert sorted(figs) == sorted(axis.name for axis in PIPELINE_AXES)
    for fig in figs.values():
        loss_ax, bubble_ax = fig.axes
        assert len(loss_ax.get_lines()) == 2 and len(bubble_ax.get_lines()) == 4  # + ideal, dashed
    write_report(paths, tmp_path / "report")
    table = (tmp_path / "report" / "report.md").read_text()
    assert "| bubble measured | bubble ideal | messages |" in table
    assert table.count("`" + str(tmp_path)) == 2
    with pytest.raises(HpcoptError, match="one kind"):
        write_report([paths[0], two_runs[0]], tmp_path / "mixed")


def test_traces_are_read_in_a_child_first_and_damage_names_the_file(two_runs, tmp_path, monkeypatch):
    from hpcopt import child
    from hpcopt.child import ChildResult

    broken = tmp_path / "broken.h5"
    broken.write_bytes(two_runs[1].read_bytes()[:3000])  # a run killed while writing its trace
    with pytest.raises(HpcoptError, match=f"^{broken} is a damaged"):
        load_traces([two_runs[0], broken])
    # where HDF5 itself crashes, the child's last "reading" line names the trace
    monkeypatch.setattr(child, "run_module",
                        lambda *a: ChildResult(-11, "SIGSEGV", f"reading {two_runs[1]}"))
    with pytest.raises(HpcoptError) as error:
        load_traces(two_runs)
    assert str(error.value) == (f"{two_runs[1]} is a damaged trace: the process that checked it "
                                "crashed reading it (SIGSEGV)")


def test_labels_carry_only_the_differing_options_that_apply_to_each_run(tmp_path):
    """An i.i.d. run is not labelled with the Dirichlet alpha it does not use."""
    from hpcopt import train
    from hpcopt.comm import Comm

    paths = []
    for name, partition in (("iid", {}), ("skewed", {"partition": "dirichlet", "alpha": "0.5"})):
        out = tmp_path / name
        config = build_config(None, {"dataset": "digits", "hidden": "16", "steps": "8",
                                     "progress": "false", "out": str(out), **partition})
        comm = Comm()
        train(config, comm, verbose=False)
        comm.free()
        paths.append(out / "trace.h5")
    traces = load_traces(paths)
    assert run_labels(traces) == ["partition=iid", "partition=dirichlet, alpha=0.5"]
    # evaluated only at the end: the metric panel says so
    texts = [t.get_text() for t in figures(traces, run_labels(traces))["steps"].axes[1].texts]
    assert texts == [ONE_POINT_NOTE]


def test_the_one_point_note_is_absent_when_runs_were_evaluated_along_the_way(two_runs):
    traces = load_traces(two_runs)
    assert not figures(traces, run_labels(traces))["steps"].axes[1].texts


def _drawn(fig):
    """``fig`` drawn on an Agg canvas; its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _shown_tick_labels(axis, renderer):
    """(value, box) of every non-empty tick label inside the axis's view, major and minor."""
    lo, hi = sorted(axis.get_view_interval())
    ticks = [*axis.get_major_ticks(), *axis.get_minor_ticks()]
    return [(tick.get_loc(), tick.label1.get_window_extent(renderer)) for tick in ticks
            if lo <= tick.get_loc() <= hi and tick.label1.get_visible() and tick.label1.get_text()]


def test_log_axis_tick_labels_do_not_collide(two_runs):
    """A loss over three decades and bytes over two: on every log axis the labelled ticks
    (decades, and ticks between them only on a short axis) leave room between their labels."""
    import numpy as np

    traces = load_traces(two_runs)
    traces[0].columns["loss_mean"] = np.geomspace(2.0, 0.002, traces[0].rows)
    for fig in figures(traces, run_labels(traces)).values():
        renderer = _drawn(fig)
        loss, accuracy = fig.axes
        for axis in (loss.yaxis, *((accuracy.xaxis,) if accuracy.get_xscale() == "log" else ())):
            shown = _shown_tick_labels(axis, renderer)
            assert len(shown) >= 2
            boxes = [box for _, box in shown]
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    assert not a.overlaps(b), [v for v, _ in shown]
        assert {0.01, 0.1, 1} <= {round(v, 9) for v, _ in _shown_tick_labels(loss.yaxis, renderer)}


def test_the_legend_stands_beside_the_panels_and_covers_no_curve(two_runs):
    traces = load_traces(two_runs)
    for fig in figures(traces, run_labels(traces)).values():
        renderer = _drawn(fig)
        assert all(ax.get_legend() is None for ax in fig.axes)
        legend, = fig.legends
        assert [t.get_text() for t in legend.get_texts()] == ["interval=2", "interval=8"]
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_more_runs_than_colours_are_told_apart_by_line_style(two_runs):
    traces = load_traces(two_runs) * 6
    labels = [f"run {i}" for i in range(12)]
    fig = figures(traces, labels)["steps"]
    for ax in fig.axes:
        styles = [(line.get_color(), line.get_linestyle()) for line in ax.get_lines()]
        assert len(styles) == 12 and len(set(styles)) == 12
    loss, accuracy = fig.axes
    assert [ln.get_color() for ln in loss.get_lines()] == [ln.get_color() for ln in accuracy.get_lines()]


def test_one_child_process_checks_every_trace_of_a_report(two_runs, monkeypatch):
    """A child's start-up (Python, h5py) costs more than reading a small trace: the runs of a
    report are checked by one child, not one each."""
    from hpcopt import child

    calls = []
    real = child.run_module
    monkeypatch.setattr(child, "run_module", lambda *a: calls.append(a[1]) or real(*a))
    traces = load_traces([*two_runs, two_runs[0].parent])
    assert [t.path for t in traces] == [*two_runs, two_runs[0]]
    assert calls == [["--traces", *map(str, two_runs), str(two_runs[0])]]


def test_runs_traced_once_are_drawn_and_no_report_warns(tmp_path):
    """README's example (two 8-step runs: one trace row each) draws a marker per run in the loss
    panel, where a line of one point showed nothing; and matplotlib warns of nothing for 2-40 runs."""
    from hpcopt import train
    from hpcopt.comm import Comm

    paths = []
    for interval in (4, 2):
        out = tmp_path / f"I{interval}"
        comm = Comm()
        train(build_config(None, {"dataset": "digits", "hidden": "8", "steps": "8", "interval": str(interval),
                                  "progress": "false", "out": str(out)}), comm, verbose=False)
        comm.free()
        paths.append(out / "trace.h5")
    traces = load_traces(paths)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for count in (2, 7, 12, 40):
            many = (traces * 6)[:count]
            for name, fig in figures(many, run_labels(many)).items():
                fig.savefig(tmp_path / f"{count}-{name}.png")
    loss = figures(traces, run_labels(traces))["steps"].axes[0]
    assert [len(line.get_xdata()) for line in loss.get_lines()] == [1, 1]
    assert [line.get_marker() for line in loss.get_lines()] == [run_style(run)["marker"] for run in (0, 1)]
    assert all(line.get_markersize() > 0 for line in loss.get_lines())


def test_neighbouring_runs_differ_in_colour_line_style_and_marker():
    """Runs whose curves coincide (on one rank, runs that differ only in the interval) stay
    apart: each run's colour, line style and marker differ from the run before's; runs of one
    colour differ in both line style and marker up to 40 runs."""
    styles = [run_style(run) for run in range(40)]
    for key in ("color", "linestyle", "marker"):
        assert all(a[key] != b[key] for a, b in zip(styles, styles[1:])), key
    for colour in {s["color"] for s in styles}:
        same = [s for s in styles if s["color"] == colour]
        assert len(same) == 4
        assert len({s["linestyle"] for s in same}) == len({s["marker"] for s in same}) == 4


def _line_styles(ax):
    return [(line.get_color(), line.get_linestyle(), line.get_marker()) for line in ax.get_lines()]


@pytest.mark.parametrize("count", [12, 30])
def test_every_run_of_a_report_has_its_own_style_in_every_panel(two_runs, count):
    """12 and 30 runs: (colour, line style, marker) differ between any two runs, a run keeps its
    own in both panels of every plot and in the legend, and the accuracy panel's markers tell
    neighbouring runs apart (it drew one marker, "o", for every run)."""
    traces = (load_traces(two_runs) * count)[:count]
    labels = [f"run {i}" for i in range(count)]
    for name, fig in figures(traces, labels).items():
        loss, accuracy = fig.axes
        styles = _line_styles(loss)
        assert len(styles) == count and len(set(styles)) == count, name
        assert _line_styles(accuracy) == styles, name
        legend, = fig.legends
        assert [(h.get_color(), h.get_linestyle(), h.get_marker()) for h in legend.legend_handles] == styles
        markers = [line.get_marker() for line in accuracy.get_lines()]
        assert all(a != b for a, b in zip(markers, markers[1:])), markers


@pytest.mark.parametrize("count", [40, 60])
def test_the_legend_of_many_runs_fits_beside_the_panels(two_runs, count):
    """A legend too tall for the figure would lose its last runs past the edge: the figure
    grows instead, and the legend stays inside it and off the panels."""
    traces = (load_traces(two_runs) * count)[:count]
    fig = figures(traces, [f"algorithm=diloco, interval={i}, seed=3" for i in range(count)])["steps"]
    renderer = _drawn(fig)
    legend, = fig.legends
    box, whole = legend.get_window_extent(renderer), fig.bbox
    assert whole.y0 <= box.y0 and box.y1 <= whole.y1 and box.x1 <= whole.x1
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)
