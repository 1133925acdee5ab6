"""``hpcopt report``: compare runs from their trace files, without rerunning anything.

For runs R1..Rk it writes, into one directory:

- ``steps.png``, ``rounds.png``, ``bytes.png``, ``wall.png``: training loss (top) and test
  accuracy (bottom) against local steps, averaging rounds, megabytes communicated (rank 0, all
  labels) and wall time; one line per run in every panel, labelled by the settings that differ
  between the runs (``interval=8, lr=0.05``), or by run directory when none do;
- ``report.md``: a markdown table of the final figures of every run.

Pipeline runs (``--algorithm pprs|pipelined_gd|pipelined_agd``) get their own set:
``steps.png``, ``wall.png`` and ``modelled.png`` (modelled pipeline time) with the loss f(x)
(top) and the measured bubble against the ideal (Delta-1)/(K+Delta-1) (bottom), and a table of
loss, bubble, messages and times. One report compares runs of one kind.

matplotlib (the ``plot`` extra) is imported only here, and only its object-oriented API is used
(no pyplot, no global backend change).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HpcoptError
from .trace import FILE_NAME, Trace, read_trace
from .vet import vet_traces

#: Options that do not change what a run computes; never used to tell runs apart.
NOT_DIFFERENCES = ("out", "progress", "checkpoint_every", "keep_checkpoints", "trace", "trace_every",
                   "network")
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


def _final(trace: Trace, key: str) -> float:
    value = (trace.summary or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan


def load_traces(paths: Sequence[str | Path]) -> list[Trace]:
    """Read each trace (a trace file, or a run directory holding ``trace.h5``), after a child
    process has read them all (hpcopt.io.vet: a trace HDF5 crashes on becomes one line)."""
    files = [path / FILE_NAME if path.is_dir() else path for path in map(Path, paths)]
    vet_traces(files)
    return [read_trace(path) for path in files]


def run_labels(traces: Sequence[Trace]) -> list[str]:
    """One label per run: the options whose values differ between the runs (world size
    included), else the run directory names; made unique when runs share them."""
    settings = [{"ranks": t.attrs.get("world_size"),
                 **{k: v for section in t.config.to_dict().values() for k, v in section.items()
                    if k not in NOT_DIFFERENCES}} for t in traces]
    keys = [k for k in settings[0] if len({repr(s.get(k)) for s in settings}) > 1]
    labels = [", ".join(f"{k}={_text(s.get(k))}" for k in keys) for s in settings]
    if len(set(labels)) < len(labels):  # the same settings twice: add the run directory
        labels = [", ".join(filter(None, [label, t.path.parent.name])) if labels.count(label) > 1
                  else label for label, t in zip(labels, traces)]
    if len(set(labels)) < len(labels):
        labels = [f"{label} #{i + 1}" for i, label in enumerate(labels)]
    return [label or t.path.parent.name for label, t in zip(labels, traces)]


def _text(value: Any) -> str:
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


def _panel_figures(axes: Sequence[Axis]) -> Iterator[tuple[Axis, Any, Any, Any]]:
    """For each x axis: (axis, figure, top panel, bottom panel), the panels sharing x."""
    Figure, _ = _figure_classes()
    for axis in axes:
        fig = Figure(figsize=(8, 7.5), layout="constrained")
        top, bottom = fig.subplots(2, 1, sharex=True)
        yield axis, fig, top, bottom


def figures(traces: Sequence[Trace], labels: Sequence[str]) -> dict[str, Any]:
    """name -> matplotlib Figure: loss and the test metric against one axis, a line per run."""
    if is_pipeline(traces):
        return pipeline_figures(traces, labels)
    _, FormatStrFormatter = _figure_classes()
    column, metric = _metric(traces)
    out = {}
    for axis, fig, loss_ax, acc_ax in _panel_figures(AXES):
        for trace, label in zip(traces, labels):
            x = axis.rows(trace)
            loss_ax.plot(x, trace.columns["loss_mean"], label=label, linewidth=1.4)
            evaluated = np.isfinite(trace.columns[column])
            ex = list(x[evaluated])
            ey = list(trace.columns[column][evaluated])
            if trace.summary and isinstance(trace.summary.get(column), float):
                ex.append(axis.final(trace))
                ey.append(trace.summary[column])
            acc_ax.plot(ex, ey, marker="o", markersize=4, linewidth=1.4, label=label)
        loss_ax.set(ylabel="training loss (mean over ranks)", yscale="log", xscale=axis.scale,
                    title=f"Training loss and {metric} against {axis.label}")
        acc_ax.set(xlabel=axis.label, ylabel=metric)
        for which in (loss_ax.yaxis.set_major_formatter, loss_ax.yaxis.set_minor_formatter):
            which(FormatStrFormatter("%g"))
        for ax in (loss_ax, acc_ax):
            ax.grid(True, which="both" if ax is loss_ax else "major", alpha=0.3)
        loss_ax.legend(fontsize="small")
        out[axis.name] = fig
    return out


def pipeline_figures(traces: Sequence[Trace], labels: Sequence[str]) -> dict[str, Any]:
    """name -> Figure for pipeline runs: the loss f(x) (top) and the measured bubble, with the
    ideal dashed (bottom), against iterations, wall time and modelled pipeline time."""
    positive = all((trace.columns["loss_mean"] > 0).all() for trace in traces)
    out = {}
    for axis, fig, loss_ax, bubble_ax in _panel_figures(PIPELINE_AXES):
        for trace, label in zip(traces, labels):
            x = axis.rows(trace)
            line, = loss_ax.plot(x, trace.columns["loss_mean"], label=label, linewidth=1.4)
            bubble_ax.plot(x, 100 * trace.columns["bubble"], color=line.get_color(), linewidth=1.4)
            bubble_ax.plot(x, 100 * trace.columns["bubble_ideal"], color=line.get_color(),
                           linestyle="--", linewidth=1)
        loss_ax.set(ylabel="loss f(x) (no smoothing)", yscale="log" if positive else "linear",
                    title=f"Loss and pipeline bubble against {axis.label.split(':')[0]}")
        bubble_ax.set(xlabel=axis.label, ylabel="bubble % (measured; ideal dashed)")
        for ax in (loss_ax, bubble_ax):
            ax.grid(True, alpha=0.3)
        loss_ax.legend(fontsize="small")
        out[axis.name] = fig
    return out


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
    """Read the traces, write the PNGs and ``report.md`` into ``out``; the files written."""
    traces = load_traces(paths)
    labels = run_labels(traces)
    figs = figures(traces, labels)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name, fig in figs.items():
            fig.savefig(out / f"{name}.png", dpi=110)
            written.append(out / f"{name}.png")
        md = out / "report.md"
        images = "\n".join(f"![{name}]({name}.png)" for name in figs)
        md.write_text(f"# hpcopt report\n\n{table(traces, labels)}\n{images}\n")
    except OSError as exc:
        raise HpcoptError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    return [*written, md]
