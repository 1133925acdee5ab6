"""``hpcopt export RUN... --format csv|tensorboard|chrome [--out DIR]``: traces in files other
tools read.

Each run's files go into ``DIR/<run directory name>/`` (default DIR: ``export``), so one
``tensorboard --logdir DIR`` shows every exported run side by side:

- ``csv``: ``rows.csv``, the trace rows (a column per trace column, empty where the trace has
  NaN) and ``comm.csv``, the per-label communication table (step, label, operation, calls,
  bytes, seconds and, with ``--network``, modelled seconds, then where traces count them the
  calls and bytes within a node; rank 0's, cumulative);
- ``tensorboard``: an event file written by tensorboardX (the optional ``tensorboard`` extra:
  ``pip install 'hpcopt[tensorboard]'``) with the trace's scalars at their steps: ``train/``
  losses, gradient norms, learning rate (and clipped fraction), ``eval/`` test loss and metric
  (the end-of-run evaluation included), ``comm/bytes/<label>``, ``comm/seconds/<label>`` (and
  ``comm/modelled/<label>``), ``run/`` the other columns (rounds; a pipeline's bubble, ...).
  Wall time: the trace's start (``created``) plus its ``wall`` column;
- ``chrome``: ``timeline.json``, the run's timeline (``--timeline true``, hpcopt.io.timeline) in
  the Trace Event Format that Perfetto (ui.perfetto.dev) and chrome://tracing open: a process
  per rank ("rank N"), a complete event per span (name, category, start and duration in
  microseconds, the step in ``args``). A trace without a timeline is refused.

Traces are read by a child process first (hpcopt.io.vet), as ``report`` does. A run's folder is
named after its directory (a run given as ``..`` too), and must be a plain folder of DIR (a link
planted there is refused); each file is written under a temporary name in it and renamed
(``hpcopt.io.safe_files.replacing``), so a link planted at a file's name is replaced, never
written through.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HpcoptError
from ..io import safe_files
from ..io.safe_files import publish

TRAIN = ("loss_mean", "loss_max", "grad_norm", "grad_norm_max", "lr", "clip_fraction")
EVAL = {"eval_loss": "eval/loss", "eval_accuracy": "eval/accuracy", "eval_perplexity": "eval/perplexity"}
TIME = ("step", "wall")
EVENT_FILES = "events.out.tfevents.*"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="trace files (trace.h5), run directories or study directories (their runs)")
    parser.add_argument("--format", required=True, choices=sorted(FORMATS),
                        help="csv: rows.csv and comm.csv; tensorboard: event files (needs tensorboardX); "
                        "chrome: timeline.json (a run with --timeline true) for Perfetto")
    parser.add_argument("--out", default="export",
                        help="directory for one folder per run (default: export)")


def _cell(value: Any) -> Any:
    return "" if isinstance(value, float) and not math.isfinite(value) else value


def write_csv(trace: Any, out: Path) -> list[Path]:
    """``rows.csv`` and ``comm.csv`` of ``trace`` in ``out``."""
    names = list(trace.columns)
    rows_path, comm_path = out / "rows.csv", out / "comm.csv"
    with safe_files.replacing(rows_path, "export") as handle:
        writer = csv.writer(handle)
        writer.writerow(names)
        for i in range(trace.rows):
            writer.writerow([_cell(trace.columns[name][i].item()) for name in names])
    counters = sorted({name for fields in trace.comm.values() for name in fields},
                      key=("calls", "bytes", "seconds", "modelled", "in_node_calls", "in_node_bytes").index)
    with safe_files.replacing(comm_path, "export") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "label", "op", *counters])
        for i in range(trace.rows):
            step = trace.columns["step"][i].item()
            for label, fields in trace.comm.items():
                writer.writerow([step, label, (trace.ops or {}).get(label, ""),
                                 *(_cell(fields[name][i].item()) for name in counters)])
    return [rows_path, comm_path]


def scalars(trace: Any) -> list[tuple[str, int, float, float]]:
    """(tag, step, wall time, value) of every finite scalar of ``trace``, in row order."""
    try:
        start = datetime.datetime.fromisoformat(str(trace.attrs.get("created"))).timestamp()
    except ValueError:
        start = 0.0
    series: dict[str, Any] = {}
    for name, column in trace.columns.items():
        if name not in TIME:
            series[f"train/{name}" if name in TRAIN else EVAL.get(name, f"run/{name}")] = column
    for label, fields in trace.comm.items():
        series.update({f"comm/{name}/{label}": fields[name] for name in ("bytes", "seconds", "modelled")
                       if name in fields})
    steps, walls = trace.columns["step"], trace.columns["wall"]
    out = [(tag, int(steps[i]), start + float(walls[i]), float(column[i]))
           for i in range(trace.rows) for tag, column in series.items() if math.isfinite(column[i])]
    summary = trace.summary or {}
    if isinstance(summary.get("step"), int):  # the end-of-run evaluation is not a row
        wall = start + float(summary.get("wall", walls[-1] if trace.rows else 0.0))
        out += [(tag, summary["step"], wall, float(summary[name])) for name, tag in EVAL.items()
                if isinstance(summary.get(name), float) and math.isfinite(summary[name])]
    return out


def write_tensorboard(trace: Any, out: Path) -> list[Path]:
    """An event file of ``trace``'s scalars in ``out`` (refused if ``out`` holds one already)."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise HpcoptError("export --format tensorboard needs tensorboardX: "
                          "pip install 'hpcopt[tensorboard]'") from None
    if any(out.glob(EVENT_FILES)):
        raise HpcoptError(f"{out} holds TensorBoard event files already: remove them or choose another --out")
    with tempfile.TemporaryDirectory(dir=out, prefix=".export-") as fresh:  # nothing planted in it
        writer = SummaryWriter(logdir=fresh, flush_secs=3600)
        try:
            for tag, step, wall, value in scalars(trace):
                writer.add_scalar(tag, value, global_step=step, walltime=wall)
        finally:
            writer.close()
        for made in sorted(Path(fresh).glob(EVENT_FILES)):
            publish(made, out / made.name, "export")
    return sorted(out.glob(EVENT_FILES))


def write_chrome(trace: Any, out: Path) -> list[Path]:
    """``timeline.json`` in ``out``: ``trace``'s timeline as Trace Event Format JSON."""
    from ..io.timeline import chrome_events, dropped_note, read_timeline

    timeline = read_timeline(trace.path)  # vetted with the trace (hpcopt.io.vet)
    if timeline is None:
        raise HpcoptError(f"{trace.path} has no timeline: record one with --timeline true")
    note = dropped_note(timeline)
    if note:
        print(f"export: {note}", file=sys.stderr, flush=True)
    path = out / "timeline.json"
    with safe_files.replacing(path, "export") as handle:  # an event at a time, never all in memory
        handle.write('{"displayTimeUnit": "ms", "traceEvents": [')
        for i, event in enumerate(chrome_events(timeline)):
            handle.write(("," if i else "") + "\n" + json.dumps(event))
        handle.write("\n]}\n")
    return [path]


FORMATS: dict[str, Callable[[Any, Path], list[Path]]] = {"csv": write_csv, "tensorboard": write_tensorboard,
                                                         "chrome": write_chrome}


def export(runs: list[str], kind: str, out: str | Path) -> list[Path]:
    """Export each run's trace as ``kind`` into ``out/<run name>/``; the files written."""
    from ..report import load_traces

    traces = load_traces(runs)
    written: list[Path] = []
    used: set[str] = set()
    for trace in traces:
        name = trace.path.resolve().parent.name or "run"  # a name, never ".." (out of --out)
        unique, n = name, 1
        while unique in used:
            n += 1
            unique = f"{name}-{n}"
        used.add(unique)
        folder = Path(out) / unique
        try:
            folder.mkdir(parents=True, exist_ok=True)
            mode = folder.lstat().st_mode
            if not stat.S_ISDIR(mode):  # a link planted there leads out of --out
                raise HpcoptError(f"{folder} is {safe_files.kind(mode)}, not a folder of {out}: "
                                  "remove it or choose another --out")
            written += FORMATS[kind](trace, folder)
        except OSError as exc:
            raise HpcoptError(f"cannot write into {folder}: {exc.strerror or exc}") from None
    return written


def run(args: argparse.Namespace) -> int:
    for path in export(args.runs, args.format, args.out):
        print(f"wrote {path}", flush=True)
    return 0
