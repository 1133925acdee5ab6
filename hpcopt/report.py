"""``hpcopt report``: compare runs from their trace files, without rerunning anything.

For runs R1..Rk it writes, into one directory:

- ``steps.png``, ``rounds.png``, ``bytes.png``, ``wall.png``: training loss (top) and test
  accuracy (bottom) against local steps, averaging rounds, megabytes communicated (rank 0, all
  labels) and wall time; one line per run in every panel, of the run's own colour, line style
  and marker (``run_style``), labelled by the settings that differ between the runs
  (``interval=8, lr=0.05``), or by run directory when none do;
- ``report.md``: a markdown table of the final figures of every run;
  every file is written by rename (``safe_files.replacing``): a link or FIFO planted at its name
  is replaced, never written through;
- given a study directory (``hpcopt sweep``): the runs of its tasks that have a readable trace,
  and ``interval.png``, the final test metric and the bytes communicated against the averaging
  interval across the study (``interval_figure``).

Pipeline runs (``--algorithm pprs|pipelined_gd|pipelined_agd``) get their own set:
``steps.png``, ``wall.png`` and ``modelled.png`` (modelled pipeline time) with the loss f(x)
(top) and the measured bubble against the ideal (Delta-1)/(K+Delta-1) (bottom), and a table of
loss, bubble, messages and times. One report compares runs of one kind.

matplotlib (the ``plot`` extra) is imported only here, and only its object-oriented API is used
(no pyplot, no global backend change).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .config import Config, applies
from .errors import HpcoptError
from .io.safe_files import replacing, write_replacing
from .io.trace import FILE_NAME, Trace, read_trace
from .run.progress import Ticker
from .run.vetting import vet_traces
from .study.layout import is_study, read_manifest, study_traces

#: Options that do not change what a run computes; never used to tell runs apart.
NOT_DIFFERENCES = ("out", "progress", "checkpoint_every", "checkpoint_minutes", "keep_checkpoints", "trace",
                   "trace_every", "network")
MB = 1e6


@dataclass(frozen=True)
class Axis:
    """An x axis: its file name, label, and per-row values of a trace plus the end-of-run value."""

    name: str
    label: str
    rows: Callable[[Trace], np.ndarray]
    final: Callable[[Trace], float]
    scale: str = "linear"


AXES = (
    Axis("steps", "local steps", lambda t: t.columns["step"], lambda t: _final(t, "step")),
    Axis("rounds", "averaging rounds", lambda t: t.columns["rounds"], lambda t: _final(t, "rounds")),
    Axis("bytes", "MB communicated (rank 0, all labels)", lambda t: t.bytes_total() / MB,
         lambda t: _final(t, "bytes") / MB, "log"),  # runs differ by orders of magnitude
    Axis("wall", "wall time (s)", lambda t: t.columns["wall"], lambda t: _final(t, "wall")),
)


PIPELINE_AXES = (
    Axis("steps", "iterations", lambda t: t.columns["step"], lambda t: _final(t, "step")),
    Axis("wall", "wall time (s)", lambda t: t.columns["wall"], lambda t: _final(t, "wall")),
    Axis("modelled", "modelled pipeline time (s): sum of 2 tau (K + Delta - 1)",
         lambda t: t.columns["modelled_time"], lambda t: _final(t, "modelled_time")),
)


#: Said on the metric panel when no run was evaluated before its end.
ONE_POINT_NOTE = "one point per run: evaluated only at the end\n(--eval-every N draws a curve)"


def _final(trace: Trace, key: str) -> float:
    value = (trace.summary or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan


def load_traces(paths: Sequence[str | Path]) -> list[Trace]:
    """Read each trace (a trace file, or a run directory holding ``trace.h5``), after a child
    process has read them all (hpcopt.run.vetting: a trace HDF5 crashes on becomes one line). A
    study directory (``hpcopt sweep``) stands for the traces of its runs that could be read."""
    given = [Path(p) for p in paths]
    files = {path: path / FILE_NAME if path.is_dir() else path for path in given
             if not (path.is_dir() and is_study(path))}
    vet_traces(list(files.values()))  # one child for them all: a child's start-up dominates
    traces: list[Trace] = []
    for path in given:
        if path not in files:  # a study
            readable = [t for t in read_each(study_traces(path)) if isinstance(t, Trace)]
            tasks = len(read_manifest(path))
            if len(readable) < tasks:  # not started, or no readable trace yet
                print(f"report: {len(readable)} of the {tasks} runs of {path} have a readable trace; "
                      "the others are left out (hpcopt collect gives their states)",
                      file=sys.stderr, flush=True)
            traces += readable
            continue
        traces.append(read_trace(files[path]))
    return traces


def read_each(files: Sequence[Path]) -> list[Trace | HpcoptError]:
    """Each trace, or the error that refuses it, after one child process has read them all
    (hpcopt.run.vetting); the child is run again past each trace it refuses."""
    refused: dict[int, HpcoptError] = {}
    start = 0
    while start < len(files):
        try:
            vet_traces(files[start:])
            break
        except HpcoptError as exc:  # the child read every trace before the one it names
            named = [i for i in range(start, len(files)) if str(files[i]) in str(exc)]
            culprit = named[0] if named else start
            refused[culprit] = exc
            start = culprit + 1
    results: list[Trace | HpcoptError] = []
    for i, path in enumerate(files):
        if i in refused:
            results.append(refused[i])
            continue
        try:
            results.append(read_trace(path))
        except HpcoptError as exc:
            results.append(exc)
    return results


def settings(config: Config, ranks: Any) -> dict[str, Any]:
    """What tells runs apart: the world size and every option that changes what a run computes."""
    return {"ranks": ranks, **{k: v for section in config.to_dict().values() for k, v in section.items()
                               if k not in NOT_DIFFERENCES}}


def differences(chosen: Sequence[dict[str, Any]]) -> list[str]:
    """The keys whose values differ between ``chosen`` settings, in their order."""
    keys = list(dict.fromkeys(k for s in chosen for k in s))
    return [k for k in keys if len({repr(s.get(k)) for s in chosen}) > 1]


def run_labels(traces: Sequence[Trace]) -> list[str]:
    """One label per run: the options whose values differ between the runs (world size
    included), else the run directory names; made unique when runs share them."""
    chosen = [settings(t.config, t.attrs.get("world_size")) for t in traces]
    keys = differences(chosen)
    labels = [", ".join(f"{k}={text(s.get(k))}" for k in keys if applies(t.config, k))
              for s, t in zip(chosen, traces)]
    if len(set(labels)) < len(labels):  # the same settings twice: add the run directory
        labels = [", ".join(filter(None, [label, t.path.parent.name])) if labels.count(label) > 1
                  else label for label, t in zip(labels, traces)]
    if len(set(labels)) < len(labels):
        labels = [f"{label} #{i + 1}" for i, label in enumerate(labels)]
    return [label or t.path.parent.name for label, t in zip(labels, traces)]


def text(value: Any) -> str:
    """An option's value as a label or table shows it."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "none"
    return str(value)


def _metric(traces: Sequence[Trace]) -> tuple[str, str]:
    """(trace column, label) of the evaluation metric: perplexity when every run is a language
    model (its traces carry ``eval_perplexity``), test accuracy otherwise."""
    if traces and all("eval_perplexity" in trace.columns for trace in traces):
        return "eval_perplexity", "test perplexity"
    return "eval_accuracy", "test accuracy"


def is_pipeline(traces: Sequence[Trace]) -> bool:
    """True for pipeline runs (their traces carry the bubble), False for data-parallel ones;
    HpcoptError for a mix, whose panels would not share axes."""
    kinds = {"bubble" in trace.columns for trace in traces}
    if len(kinds) > 1:
        raise HpcoptError("report compares runs of one kind: pipeline runs (pprs, pipelined_gd, "
                          "pipelined_agd) and data-parallel runs need separate reports")
    return kinds == {True}


def _figure_classes() -> tuple[Any, Any]:
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import FormatStrFormatter
    except ImportError:
        raise HpcoptError("report needs matplotlib: pip install 'hpcopt[plot]'") from None
    return Figure, FormatStrFormatter


#: Line colours (matplotlib's tab10), line styles and markers: a run takes the next of each
#: (``run_style``), so past ten runs the style and the marker tell runs of one colour apart.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # 7: prime to 10, so runs of one colour differ
MARKER_SIZE = 5
#: Markers drawn along a curve of many rows (the accuracy panel's few evaluations get one each).
MARKS_PER_CURVE = 8
#: The figure's size in inches: two panels, and the legend beside them (never over a curve).
FIGURE_SIZE = (11, 7.5)
#: Height of a legend entry at the legend's font size, in inches (measured: 0.188).
LEGEND_ROW_INCHES = 0.19


def run_style(run: int) -> dict[str, Any]:
    """Colour, line style and marker of the ``run``-th run, the same in every panel of a report.

    Each of the three changes from one run to the next (curves that lie on top of each other
    stay apart), and runs of one colour (``run`` apart by a multiple of 10) differ in both line
    style and marker up to 40 runs: the style turns one step further every ten runs, and the
    marker cycle (7) is prime to the colour cycle (10), so (colour, marker) is unique up to 70.
    """
    return {"color": COLOURS[run % len(COLOURS)],
            "linestyle": LINE_STYLES[(run + run // len(COLOURS)) % len(LINE_STYLES)],
            "marker": MARKERS[run % len(MARKERS)], "markersize": MARKER_SIZE}


def figure_size(lines: int) -> tuple[float, float]:
    """``FIGURE_SIZE``, taller where a legend of ``lines`` entries (one column) would not fit
    beside the panels (past about 37 runs)."""
    width, height = FIGURE_SIZE
    return width, max(height, LEGEND_ROW_INCHES * lines + 0.3)  # + the legend's frame, margins


def spaced_marks(run: int, rows: int) -> tuple[int, int]:
    """``markevery`` for the ``run``-th curve of ``rows`` points: about ``MARKS_PER_CURVE``
    markers (one on every point of a shorter curve); on curves of ``2 * MARKS_PER_CURVE`` rows
    or more each run's start a point later than the run before's, so curves that coincide show
    both runs' markers."""
    every = max(1, rows // MARKS_PER_CURVE)
    return run % every, every


def log_labels(axis: Any) -> None:
    """Tick labels of a log ``axis`` that do not collide: the decades, and the ticks between
    them only where the axis spans about one decade or less (a subset of them up to one
    decade, all up to 0.4: matplotlib's ``LogFormatter`` decides which), as plain numbers
    (0.5, 2, 1000)."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:g}" if super().__call__(x, pos) else ""

    axis.set_major_formatter(Plain(labelOnlyBase=False))
    axis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def legend_beside(fig: Any, ax: Any) -> None:
    """The legend of ``ax``'s lines to the right of the panels, outside them; its handles long
    enough to show each line style with the marker on it."""
    if ax.get_lines():
        fig.legend(handles=ax.get_lines(), loc="outside right upper", fontsize="small",
                   handlelength=3.5)


def _panel_figures(axes: Sequence[Axis], runs: int) -> Iterator[tuple[Axis, Any, Any, Any]]:
    """For each x axis: (axis, figure, top panel, bottom panel) for ``runs`` runs, the panels
    sharing x."""
    Figure, _ = _figure_classes()
    for axis in axes:
        fig = Figure(figsize=figure_size(runs), layout="constrained")
        top, bottom = fig.subplots(2, 1, sharex=True)
        yield axis, fig, top, bottom


def figures(traces: Sequence[Trace], labels: Sequence[str]) -> dict[str, Any]:
    """name -> matplotlib Figure: loss and the test metric against one axis, a line per run."""
    if is_pipeline(traces):
        return pipeline_figures(traces, labels)
    column, metric = _metric(traces)
    out = {}
    for axis, fig, loss_ax, acc_ax in _panel_figures(AXES, len(traces)):
        for run, (trace, label) in enumerate(zip(traces, labels)):
            x = axis.rows(trace)
            style = run_style(run)
            loss_ax.plot(x, trace.columns["loss_mean"], label=label, linewidth=1.4,
                         markevery=spaced_marks(run, len(x)), **style)
            evaluated = np.isfinite(trace.columns[column])
            ex = list(x[evaluated])
            ey = list(trace.columns[column][evaluated])
            if trace.summary and isinstance(trace.summary.get(column), float):
                ex.append(axis.final(trace))
                ey.append(trace.summary[column])
            acc_ax.plot(ex, ey, linewidth=1.4, label=label, **style)
        loss_ax.set(ylabel="training loss (mean over ranks)", yscale="log", xscale=axis.scale,
                    title=f"Training loss and {metric} against {axis.label}")
        acc_ax.set(xlabel=axis.label, ylabel=metric)
        if all(len(line.get_xdata()) <= 1 for line in acc_ax.get_lines()):
            acc_ax.text(0.5, 0.5, ONE_POINT_NOTE, transform=acc_ax.transAxes, ha="center",
                        va="center", fontsize="small", alpha=0.7)
        log_labels(loss_ax.yaxis)
        if axis.scale == "log":
            log_labels(acc_ax.xaxis)
        for ax in (loss_ax, acc_ax):
            ax.grid(True, which="both" if ax is loss_ax else "major", alpha=0.3)
        legend_beside(fig, loss_ax)
        out[axis.name] = fig
    return out


def pipeline_figures(traces: Sequence[Trace], labels: Sequence[str]) -> dict[str, Any]:
    """name -> Figure for pipeline runs: the loss f(x) (top) and the measured bubble, with the
    ideal dashed (bottom), against iterations, wall time and modelled pipeline time."""
    positive = all((trace.columns["loss_mean"] > 0).all() for trace in traces)
    out = {}
    for axis, fig, loss_ax, bubble_ax in _panel_figures(PIPELINE_AXES, len(traces)):
        for run, (trace, label) in enumerate(zip(traces, labels)):
            x = axis.rows(trace)
            style, marks = run_style(run), spaced_marks(run, len(x))
            loss_ax.plot(x, trace.columns["loss_mean"], label=label, linewidth=1.4, markevery=marks, **style)
            bubble_ax.plot(x, 100 * trace.columns["bubble"], linewidth=1.4, markevery=marks, **style)
            bubble_ax.plot(x, 100 * trace.columns["bubble_ideal"], color=style["color"],
                           linestyle="--", linewidth=1)
        loss_ax.set(ylabel="loss f(x) (no smoothing)", yscale="log" if positive else "linear",
                    title=f"Loss and pipeline bubble against {axis.label.split(':')[0]}")
        bubble_ax.set(xlabel=axis.label, ylabel="bubble % (measured; ideal dashed)")
        if positive:
            log_labels(loss_ax.yaxis)
        for ax in (loss_ax, bubble_ax):
            ax.grid(True, alpha=0.3)
        legend_beside(fig, loss_ax)
        out[axis.name] = fig
    return out


def interval_figure(traces: Sequence[Trace]) -> Any:
    """Across a study: the final test metric (top) and MB communicated (bottom) against the
    averaging interval, a dot per finished run and a line through the means of the runs that
    share every other setting but the seed."""
    Figure, FormatStrFormatter = _figure_classes()
    column, metric = _metric(traces)
    finished = [t for t in traces if t.summary]
    chosen = [settings(t.config, t.attrs.get("world_size")) for t in finished]
    keys = [k for k in differences(chosen) if k not in ("interval", "seed")]
    groups: dict[str, list[tuple[float, Trace]]] = {}
    for trace, setting in zip(finished, chosen):
        label = ", ".join(f"{k}={text(setting.get(k))}" for k in keys) or "every run"
        groups.setdefault(label, []).append((float(setting.get("interval", math.nan)), trace))
    fig = Figure(figsize=figure_size(len(groups)), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    values = ((top, lambda t: _final(t, column)), (bottom, lambda t: _final(t, "bytes") / MB))
    for group, (label, members) in enumerate(groups.items()):
        intervals = sorted({interval for interval, _ in members})
        style = run_style(group)
        for ax, value in values:
            means = [float(np.mean([value(t) for i, t in members if i == x])) for x in intervals]
            ax.plot(intervals, means, linewidth=1.4, label=label, **style)
            ax.scatter([i for i, _ in members], [value(t) for _, t in members], s=14, alpha=0.5,
                       color=style["color"], marker=style["marker"])
    top.set(ylabel=f"final {metric}", title=f"Final {metric} and bytes against the averaging interval\n"
            f"({len(finished)} finished runs: a dot each; lines: means over seeds)")
    bottom.set(xlabel="averaging interval I (local steps per round)", ylabel="MB communicated (rank 0)",
               yscale="log")
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(sorted({i for members in groups.values() for i, _ in members}))
    bottom.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    log_labels(bottom.yaxis)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    legend_beside(fig, top)
    return fig


def table(traces: Sequence[Trace], labels: Sequence[str]) -> str:
    """A markdown table of each run's final figures."""
    if is_pipeline(traces):
        return pipeline_table(traces, labels)
    column, metric = _metric(traces)
    modelled = any("modelled" in fields for trace in traces for fields in trace.comm.values())
    lines = [f"| run | ranks | steps | rounds | train loss | {metric} | test loss | "
             "MB communicated (rank 0) | wall time (s) | "
             + ("comm s measured | comm s modelled (network) | " if modelled else "") + "trace |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if modelled else "") + "---|"]
    for trace, label in zip(traces, labels):
        summary = trace.summary or {}
        cells = [label, trace.attrs.get("world_size", "?"),
                 _final_value(trace, "step", "-"), _final_value(trace, "rounds", "-"),
                 _number(trace.columns["loss_mean"][-1] if trace.rows else math.nan, 4),
                 _number(summary.get(column, math.nan), 4),
                 _number(summary.get("eval_loss", math.nan), 4),
                 _number(trace.bytes_total()[-1] / MB if trace.rows else math.nan, 2),
                 _number(_final_value(trace, "wall"), 1),
                 *(_comm_seconds(trace) if modelled else ()), _trace_cell(trace)]
        lines.append(_table_row(cells))
    return "\n".join(lines) + "\n"


def pipeline_table(traces: Sequence[Trace], labels: Sequence[str]) -> str:
    """A markdown table of each pipeline run's final figures."""
    lines = ["| run | stages | iterations | final loss | bubble measured | bubble ideal | messages | "
             "wall time (s) | modelled time (s) | trace |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for trace, label in zip(traces, labels):
        last = partial(_final_value, trace)
        cells = [label, trace.attrs.get("world_size", "?"), last("step"),
                 _number((trace.summary or {}).get("final_loss", last("loss_mean")), 5),
                 _number(100 * last("bubble"), 1) + "%", _number(100 * last("bubble_ideal"), 1) + "%",
                 last("messages"), _number(last("wall"), 2), _number(last("modelled_time"), 2),
                 _trace_cell(trace)]
        lines.append(_table_row(cells))
    return "\n".join(lines) + "\n"


def _final_value(trace: Trace, key: str, missing: Any = math.nan) -> Any:
    """The run's end-of-run ``key`` (from its summary), else the last trace row's, else ``missing``."""
    summary = trace.summary or {}
    if key in summary:
        return summary[key]
    return trace.columns[key][-1] if trace.rows else missing


def _trace_cell(trace: Trace) -> str:
    return f"`{trace.path}`" + ("" if trace.summary else " (unfinished)")


def _table_row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _comm_seconds(trace: Trace) -> tuple[str, str]:
    """Rank 0's measured communication seconds at the last row, and the seconds the cost model
    gives for the same calls on the run's ``--network`` profile ("-" without one)."""
    if not trace.rows:
        return "-", "-"
    measured = sum(float(fields["seconds"][-1]) for fields in trace.comm.values())
    if not all("modelled" in fields for fields in trace.comm.values()):
        return _number(measured, 3), "-"
    modelled = sum(float(fields["modelled"][-1]) for fields in trace.comm.values())
    return _number(measured, 3), f"{_number(modelled, 3)} ({trace.attrs.get('network', '?')})"


def _number(value: Any, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def write_report(paths: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Read the traces, write the PNGs and ``report.md`` into ``out``; the files written. For
    a study directory also ``interval.png`` (``interval_figure``)."""
    tick = Ticker("report")
    traces = load_traces(paths)
    if not traces:
        raise HpcoptError(f"no readable trace in {', '.join(map(str, paths))}")
    tick(f"read {len(traces)} traces")
    labels = run_labels(traces)
    figs = figures(traces, labels)
    if any(Path(p).is_dir() and is_study(Path(p)) for p in paths) and not is_pipeline(traces):
        figs["interval"] = interval_figure(traces)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HpcoptError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    written = []
    for name, fig in figs.items():  # each file by rename: a link or FIFO planted there is replaced
        with replacing(out / f"{name}.png", "report plot", "wb") as handle:
            fig.savefig(handle, format="png", dpi=110)
        written.append(out / f"{name}.png")
        tick(f"wrote {len(written)} of {len(figs)} plots")
    md = out / "report.md"
    images = "\n".join(f"![{name}]({name}.png)" for name in figs)
    write_replacing(md, f"# hpcopt report\n\n{table(traces, labels)}\n{images}\n", "report table")
    return [*written, md]
