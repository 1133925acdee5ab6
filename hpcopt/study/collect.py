"""``hpcopt collect DIR... --out STUDY``: one row per run, ``study.csv`` and ``study.md``.

A DIR is a study directory (its tasks, in manifest order, started or not), a run directory, or
a directory of run directories. Every trace is read by a child process first, as ``report``
does (hpcopt.io.vet); a trace it refuses becomes a note in its run's row. A run's state:

- ``finished``: its trace holds the end-of-run summary (its task exited 0, or 5: finished on the
  survivors of a lost rank, ``--on-rank-loss continue``); an exit code alone never makes a run
  finished (hpcopt.study.outcome);
- ``wrong``: its trace's ``world_size`` (the ranks its first job trained on: a resume with
  ``--ranks-changed`` and survivors that went on keep it) is not the ranks its task asks for,
  as when a launcher started the task's ranks as single-rank copies (``srun`` without
  ``--mpi=pmi2`` or ``pmix``); the note says so, and how the run went otherwise;
- ``stopped``: its task exited 143 (SIGTERM: a checkpoint was written) or 130 (SIGINT);
- ``failed``: its task exited otherwise (the note has the log's last error line; 6: a rank was
  lost and the survivors could not go on), or exited 0 or 5 with no end-of-run summary in its
  trace (MPICH's Hydra can exit 0 after a double Ctrl-C with the run unfinished);
- ``interrupted``: its task ended without recording its exit (its record is no longer locked:
  killed, or its node died);
- ``running``: its task's process holds the lock on its record;
- ``not started``: a task of the study with no run directory and no record yet;
- ``incomplete``: anything else that has not finished (a run outside a study, or on a file
  system without locks): whether it still runs cannot be told from its files.

The columns: the run directory, the state, its task's exit code (empty where none is recorded),
the options whose values differ between the runs (world size included), steps, rounds, the last
training loss, the final (else the latest) evaluation, bytes communicated in all (and of them,
when the traces count it, those within a node and those across nodes) and per label (rank 0),
the peak bytes in flight (when a run's trace has that column: Streaming DiLoCo's fragments),
wall seconds, measured and, with ``--network``, modelled communication seconds, (where a run
lost a rank) the ranks lost, the steps lost and the seconds to recover (hpcopt.study.recovery),
the newest checkpoint (to resume from), a note (where the survivors of a lost rank went on: at
how many ranks, without which). Paths inside the output directory are written relative to it.
Without a study or ``--out``, the main columns are printed (``main_columns``) and nothing is
written.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import Any

from ..errors import HpcoptError
from ..io.safe_files import open_regular, write_replacing
from ..io.trace import PEAK_COLUMN as PEAK
from .layout import Entry, is_study, lock_held, log_path, logs_folder, read_manifest, read_record, record_path
from .outcome import FAILED, FINISHED, INTERRUPTED, NO_END_RECORD, WRONG, ended
from .recovery import COLUMNS as RECOVERY
from .recovery import Recovery, recovery

#: Bytes read from the end of a task's log for the note of a failed run.
LOG_TAIL = 8192


@dataclass
class Found:
    """A run directory and, when it is one of a study's tasks, the study and its entry."""

    run: Path
    study: Path | None = None
    entry: Entry | None = None


@dataclass
class Row:
    found: Found
    state: str = ""
    note: str = ""
    trace: Any = None  # a Trace, when readable
    settings: dict[str, Any] = field(default_factory=dict)
    checkpoint: Path | None = None
    unread: str = ""  # why its trace could not be read
    exit_code: int | None = None  # its task's, once recorded
    recovery: Recovery | None = None  # its lost ranks and what they cost (hpcopt.study.recovery)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", metavar="DIR",
                        help="study directories, run directories, or directories of run directories")
    parser.add_argument("--out", help="where study.csv and study.md go (default: the study "
                        "directory, when DIR is one; else the main columns of study.md's table are "
                        "printed)")


def is_run(path: Path) -> bool:
    from ..io.data_parallel_checkpoint import SUBDIR
    from ..io.trace import FILE_NAME

    return (path / FILE_NAME).is_file() or (path / SUBDIR).is_dir()


def find_runs(paths: Sequence[Path]) -> list[Found]:
    """The runs ``paths`` name, in order (HpcoptError for a path that names none)."""
    manifests: dict[Path, list[Entry]] = {}

    def entries(study: Path) -> list[Entry]:
        if study not in manifests:
            manifests[study] = read_manifest(study)
        return manifests[study]

    def with_study(run: Path) -> Found:
        study = run.parent.parent
        if is_study(study):
            for entry in entries(study):
                if (study / entry.run).resolve() == run.resolve():
                    return Found(run, study, entry)
        return Found(run)

    found: list[Found] = []
    for path in paths:
        if is_study(path):
            found += [Found(path / entry.run, path, entry) for entry in entries(path)]
        elif is_run(path):
            found.append(with_study(path))
        elif path.is_dir() and (runs := sorted(p for p in path.iterdir() if p.is_dir() and is_run(p))):
            found += [with_study(run) for run in runs]
        else:
            raise HpcoptError(f"{path} is not a study, a run directory or a directory of runs")
    return found


def _log_line(path: Path) -> str:
    """The last error line of a log (else its last line), for a note; HpcoptError for a log that
    is no regular file (a link included, at its name or at ``logs/``)."""
    try:
        with logs_folder(path.parent) as folder, open_regular(path, "task log", folder=folder) as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - LOG_TAIL))
            lines = [line.strip() for line in handle.read(LOG_TAIL).decode("utf-8", "replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith(("hpcopt: error", "[rank"))]
    return (errors or lines or [""])[-1][:240]


def task_record(found: Found) -> dict[str, Any] | None:
    """The record of the study task ``found`` names; None for a run outside a study, or a task
    with no readable record yet."""
    if found.study is None or found.entry is None:
        return None
    return read_record(record_path(found.study, found.entry.index))


def recorded_exit(record: dict[str, Any] | None) -> int | None:
    """The exit code a task record holds (None: none recorded yet)."""
    code = (record or {}).get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def state(row: Row, record: dict[str, Any] | None) -> tuple[str, str]:
    """(state, note) of a run: from its trace, its task's ``record`` (``task_record``) and the
    record's lock; ``wrong`` where its trace's world size is not the ranks its task asks for
    (the note then says how the run went otherwise)."""
    name, note = _progress(row, record)
    trained, asked = _world_size(row.trace), row.found.entry.ranks if row.found.entry else None
    if trained is None or asked is None or trained == asked:
        return name, note
    return WRONG, f"{wrong_size(trained, asked)}; otherwise {name}" + (f" ({note})" if note else "")


def wrong_size(trained: int, asked: int) -> str:
    """The note of a run trained on ``trained`` ranks whose task asks for ``asked``."""
    why = ("usually a launcher that started single-rank copies, not one world (srun without "
           "--mpi=pmi2 or --mpi=pmix)" if trained == 1 else "its launcher started another number of ranks")
    return (f"trained on {trained} rank(s), the task asks for {asked}: {why}; move the run directory "
            "away and run the task again")


def _progress(row: Row, record: dict[str, Any] | None) -> tuple[str, str]:
    """(state, note) of a run as far as it went, whatever its world size (``state``)."""
    trace, found = row.trace, row.found
    if trace is not None and trace.summary is not None:
        return FINISHED, ""
    if record is None:
        if found.entry is not None and not found.run.exists():
            return "not started", ""
        return "incomplete", "no end-of-run summary, and no task record to tell running from ended"
    assert found.study is not None and found.entry is not None
    log = log_path(found.study, found.entry.index)
    code = recorded_exit(record)
    if code is not None:  # its trace has no end-of-run record here: an exit 0 did not finish it
        name, note = ended(code, lambda: NO_END_RECORD if trace is not None else "no readable trace")
        return name, _with_log_line(note, log) if name == FAILED else note
    held = lock_held(record_path(found.study, found.entry.index)) if record.get("locked") else None
    if held:
        return "running", f"on {record.get('host', '?')} since {record.get('started', '?')}"
    if held is False:
        return INTERRUPTED, _with_log_line("its task ended without recording its exit (killed, or its "
                                           "node died)", log)
    return "incomplete", "started, and this file system has no locks to tell whether it still runs"


def _with_log_line(note: str, log: Path) -> str:
    """``note`` and the last error line of the task's ``log`` (when it has a line)."""
    line = _log_line(log)
    return f"{note}: {line}" if line else note


def gather(paths: Sequence[Path]) -> list[Row]:
    """Every run's row (the columns are made by ``columns``)."""
    from ..config import build_config
    from ..io.data_parallel_checkpoint import find_checkpoint
    from ..io.trace import FILE_NAME, Trace
    from ..report import read_each, settings
    from ..run.progress import Ticker

    tick = Ticker("collect")
    rows = [Row(found) for found in find_runs(paths)]
    with_trace = [row for row in rows if (row.found.run / FILE_NAME).is_file()]
    tick(f"reading the traces of {len(with_trace)} of {len(rows)} runs")
    reads = read_each([row.found.run / FILE_NAME for row in with_trace])
    for row, read in zip(with_trace, reads):
        if isinstance(read, Trace):
            row.trace = read
            row.settings = settings(read.config, read.attrs.get("world_size"))
        else:
            row.unread = f"trace not read: {read}"
    readable = sum(row.trace is not None for row in rows)
    tick(f"read {readable} of {len(with_trace)} traces; gathering {len(rows)} runs")
    for i, row in enumerate(rows):
        record = task_record(row.found)
        row.exit_code = recorded_exit(record)
        row.state, row.note = state(row, record)
        row.note = "; ".join(filter(None, [row.note, row.unread]))
        entry = row.found.entry
        if not row.settings and entry is not None:
            names = (flag.removeprefix("--").replace("-", "_") for flag in entry.args[::2])
            options = dict(zip(names, entry.args[1::2]))
            try:
                row.settings = settings(build_config(None, options), entry.ranks)
            except HpcoptError:
                pass
        try:
            row.checkpoint = find_checkpoint(row.found.run) if row.found.run.is_dir() else None
        except HpcoptError:
            row.checkpoint = None
        try:
            row.recovery = recovery(row.found.run, row.found.run / FILE_NAME if row.trace else None)
        except HpcoptError as exc:
            row.note = "; ".join(filter(None, [row.note, str(exc)]))
        if row.recovery is not None and (went_on := row.recovery.survivors_note(_started(row.trace))):
            went_on = f"{'finished' if row.state == FINISHED else 'went on'} {went_on}"
            row.note = "; ".join(filter(None, [went_on, row.note]))
        tick(f"gathered {i + 1} of {len(rows)} runs")
    tick.done(f"gathered {len(rows)} runs, {readable} of them with a readable trace")
    return rows


def _world_size(trace: Any) -> int | None:
    """The trace's ``world_size``: the ranks its first job trained on (a resume on another number,
    ``--ranks-changed``, and survivors that went on without a lost rank leave it as it is); None
    where not known."""
    size = None if trace is None else trace.attrs.get("world_size")
    return int(size) if isinstance(size, Integral) and not isinstance(size, bool) else None


def _started(trace: Any) -> int | None:
    """The ranks the run's job started with: its trace's ``world_size``, unless the run was
    resumed (a resume may start another number); None where not known."""
    if trace is None or trace.attrs.get("resumed_at", "[]") != "[]":
        return None
    return _world_size(trace)


def _final(trace: Any, key: str) -> Any:
    """The run's end-of-run ``key``, else its last row's (``column`` of the trace)."""
    summary = trace.summary or {}
    if key in summary:
        return summary[key]
    return trace.columns[key][-1].item() if key in trace.columns and trace.rows else None


def _latest(trace: Any, key: str) -> Any:
    """The final evaluation ``key``, else the latest row's that has one."""
    summary = trace.summary or {}
    if isinstance(summary.get(key), (int, float)):
        return summary[key]
    import numpy as np

    column = trace.columns.get(key)
    if column is None:
        return None
    finite = column[np.isfinite(column)]
    return finite[-1].item() if finite.size else None


def _last(trace: Any, name: str) -> float | None:
    """The sum over labels of the last row's ``name`` counter (None when absent)."""
    if not trace.rows or not trace.comm or not all(name in f for f in trace.comm.values()):
        return None
    return sum(f[name][-1].item() for f in trace.comm.values())


def options(rows: Sequence[Row]) -> list[str]:
    """The options whose values differ between the runs (world size included), in order."""
    from ..report import differences

    return differences([row.settings for row in rows if row.settings])


def columns(rows: Sequence[Row], out: Path) -> list[dict[str, Any]]:
    """One dict per row, the same keys in every one (the table's columns)."""
    keys = options(rows)
    traces = [row.trace for row in rows if row.trace is not None]
    metrics = ["eval_loss", *(m for m in ("eval_accuracy", "eval_perplexity")
                              if any(m in t.columns for t in traces))]
    labels = sorted({label for t in traces for label in t.comm})
    peak = [PEAK] if any(PEAK in t.columns for t in traces) else []
    lost = list(RECOVERY) if any(row.recovery for row in rows) else []
    split = (["in_node_bytes", "across_nodes_bytes"]
             if any("in_node_bytes" in f for t in traces for f in t.comm.values()) else [])
    table = []
    for row in rows:
        trace = row.trace
        values: dict[str, Any] = {"run": _shown(row.found.run, out), "state": row.state,
                                  "exit_code": row.exit_code}
        values.update({k: row.settings.get(k) for k in keys})
        values.update({"steps": None, "rounds": None, "train_loss": None, **{m: None for m in metrics},
                       "bytes": None, **{name: None for name in split},
                       **{f"bytes_{label}": None for label in labels},
                       **{name: None for name in peak}, "wall_seconds": None, "comm_seconds": None,
                       "modelled_comm_seconds": None,
                       "network": None, **{name: None for name in lost}})
        if trace is not None:
            values.update(steps=_final(trace, "step"), rounds=_final(trace, "rounds"),
                          train_loss=trace.columns["loss_mean"][-1].item() if trace.rows else None,
                          bytes=_last(trace, "bytes"), wall_seconds=_final(trace, "wall"),
                          comm_seconds=_last(trace, "seconds"),
                          modelled_comm_seconds=_last(trace, "modelled"), network=trace.attrs.get("network"))
            values.update({m: _latest(trace, m) for m in metrics})
            in_node = _last(trace, "in_node_bytes")
            if split and in_node is not None and values["bytes"] is not None:
                values.update(in_node_bytes=in_node, across_nodes_bytes=values["bytes"] - in_node)
            if PEAK in trace.columns and trace.rows:  # the run's most bytes in flight at once
                values[PEAK] = int(trace.columns[PEAK].max())
            values.update({f"bytes_{label}": f["bytes"][-1].item() for label, f in trace.comm.items()
                           if trace.rows})
        if lost:
            values.update(row.recovery.columns() if row.recovery else {"rank_losses": 0})
        values["checkpoint"] = _shown(row.checkpoint, out) if row.checkpoint else None
        values["note"] = row.note
        table.append(values)
    return table


def _shown(path: Path, out: Path) -> str:
    """``path`` relative to ``out`` when it lies inside, else as found."""
    try:
        return path.resolve().relative_to(out.resolve()).as_posix()
    except ValueError:
        return str(path)


def _csv_value(value: Any) -> str:
    from ..report import text

    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return repr(value) if isinstance(value, float) else text(value)


def csv_text(table: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table[0])
    writer.writerows([_csv_value(v) for v in values.values()] for values in table)
    return buffer.getvalue()


def _md_value(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        digits = 2 if key.endswith("seconds") else 4
        return f"{value:.{digits}f}"
    return _csv_value(value).replace("|", "\\|").replace("\n", " ")


def markdown(table: Sequence[dict[str, Any]]) -> str:
    header = list(table[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_md_value(k, v) for k, v in values.items()) + " |" for values in table]
    counts: dict[str, int] = {}
    for values in table:
        counts[values["state"]] = counts.get(values["state"], 0) + 1
    summary = ", ".join(f"{n} {name}" for name, n in counts.items())
    return f"# hpcopt study\n\n{len(table)} runs: {summary}.\n\n" + "\n".join(lines) + "\n"


def collect(paths: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Gather the runs, write ``study.csv`` and ``study.md`` into ``out`` (each a new file renamed
    over the old: a link planted at their names is replaced, never written through); the files
    written."""
    out = Path(out)
    table = columns(gather([Path(p) for p in paths]), out)
    written = [out / "study.csv", out / "study.md"]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HpcoptError(f"cannot write into {out}: {exc.strerror or exc}") from None
    write_replacing(written[0], csv_text(table), "study table")
    write_replacing(written[1], markdown(table), "study table")
    return written


def main_columns(table: Sequence[dict[str, Any]], differing: Sequence[str]) -> list[dict[str, Any]]:
    """``table`` cut to what a terminal shows: the run, its state, the ``differing`` options,
    steps, the last training loss, the final evaluation and the note."""
    shown = ["run", "state", *differing, "steps", "train_loss",
             *(key for key in table[0] if key.startswith("eval_")), "note"]
    return [{key: values[key] for key in shown} for values in table]


def _printed(dirs: Sequence[str]) -> str:
    """The main columns of the runs ``dirs`` as study.md shows them, and how to get them all."""
    rows = gather([Path(p) for p in dirs])
    table = columns(rows, Path.cwd())
    return (markdown(main_columns(table, options(rows))) + f"\nAll {len(table[0])} columns (bytes, "
            "seconds, exit codes, checkpoints) go to study.csv and study.md with: "
            f"hpcopt collect {shlex.join(dirs)} --out DIR\n")


def run(args: argparse.Namespace) -> int:
    out = args.out
    if out is None:
        if len(args.dirs) != 1 or not is_study(Path(args.dirs[0])):  # runs, no study: the table here
            print(_printed(args.dirs), end="", flush=True)
            return 0
        out = args.dirs[0]
    for path in collect(args.dirs, out):
        print(f"wrote {path}", flush=True)
    return 0
