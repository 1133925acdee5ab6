"""A reproduction's grid of ``hpcopt train`` runs as a study: the sweep file written from the
script's options, run by ``python -m hpcopt sweep FILE --local -j K --out DIR``, gathered by
``python -m hpcopt collect DIR --out DIR``, and its table (``DIR/study.csv``) read back, one row
per run with the run's ``hpcopt train`` options from the manifest.

The same study runs on a cluster (``hpcopt sweep FILE --out DIR``, then the arrays); the script
then only reads it (``--study DIR``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common.launch import ROOT


def toml_value(value: Any) -> str:
    """``value`` (bool, int, float, str or a list of them) written as TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for the plain text of an option
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def sweep_file(job: dict[str, Any], train: dict[str, Any], grids: list[dict[str, list[Any]]],
               comment: str = "") -> str:
    """A sweep file: ``[job]``, ``[train]``, then one ``[[sweep]]`` per grid (docs/studies.md)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    for name, table in (("job", job), ("train", train)):
        lines += [f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items()), ""]
    for grid in grids:
        lines += ["[[sweep]]", *(f"{k} = {toml_value(v)}" for k, v in grid.items()), ""]
    return "\n".join(lines)


@dataclass
class Run:
    """One row of the study's table, with its task's ranks and ``hpcopt train`` options."""

    path: Path                # the run directory
    ranks: int
    options: dict[str, str]   # as in the manifest: option name (underscores) -> value
    row: dict[str, str]       # the study.csv row ("" where not known)

    def number(self, column: str, default: float | None = None) -> float:
        """A numeric cell (``default`` where it is empty, e.g. a label the run never used)."""
        cell = self.row.get(column, "")
        if cell == "":
            if default is None:
                raise KeyError(f"{self.path.name}: no {column} in the study's table")
            return default
        return float(cell)


def _hpcopt(*args: str, env: dict[str, str]) -> None:
    """``python -m hpcopt ARGS`` in the checkout, its output shown as it comes."""
    done = subprocess.run([sys.executable, "-m", "hpcopt", *args], cwd=ROOT, env=env)
    if done.returncode:
        raise SystemExit(f"python -m hpcopt {' '.join(args)} failed ({done.returncode})")


def run_study(text: str, out: Path, jobs: int = 1, mpiexec: str = "mpiexec") -> list[Run]:
    """Write the study ``text`` into ``out`` and run its tasks here, ``jobs`` at a time (a task
    that finished before is left alone, a stopped one resumed); collect it; its table. A
    directory holding another study (made with other options) is refused."""
    held = out / "study.toml"
    if held.is_file() and held.read_text() != text:
        raise SystemExit(f"{out} holds another study, made with other options: give the script "
                         "another run directory, or remove this one to start afresh")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    if os.sep in mpiexec:  # the tasks start ``mpiexec``: this one, first on the PATH
        env["PATH"] = os.pathsep.join([str(Path(mpiexec).resolve().parent), env.get("PATH", "")])
    out = out.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "study.toml"
        sweep.write_text(text)
        _hpcopt("sweep", str(sweep), "--local", "-j", str(jobs), "--out", str(out), env=env)
    _hpcopt("collect", str(out), "--out", str(out), env=env)
    return read_study(out)


def add_study_options(parser: argparse.ArgumentParser, runs: Path | None = None) -> None:
    """A reproduction's study options: ``--jobs``, ``--study`` and ``--write-study``; with
    ``runs``, ``--runs`` (that default) and ``--reuse`` (without it the study starts afresh)."""
    if runs is not None:
        parser.add_argument("--runs", type=Path, default=runs,
                            help="the study directory (it holds the study of one set of options)")
        parser.add_argument("--reuse", action="store_true",
                            help="keep the finished runs already in --runs (else it starts afresh)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (hpcopt sweep --local -j)")
    parser.add_argument("--study", type=Path,
                        help="only read this study (run and collected elsewhere, e.g. on a cluster), "
                        "which must be the one these options make")
    parser.add_argument("--write-study", type=Path, metavar="FILE",
                        help="only write the sweep file of these options (for hpcopt sweep)")


def study_runs(text: str, args: argparse.Namespace, afresh: bool) -> list[Run] | None:
    """The runs of the study ``text`` as ``add_study_options`` chose: None after writing it to
    ``--write-study``; the table of ``--study`` (refused if it holds another study); else the
    study run into ``--runs`` (emptied first when ``afresh``) and collected."""
    if args.write_study:
        args.write_study.write_text(text)
        return None
    if args.study:
        if (args.study / "study.toml").read_text() != text:
            raise SystemExit(f"{args.study} holds another study than these options make "
                             "(compare its study.toml with --write-study FILE)")
        return read_study(args.study)
    if afresh:
        shutil.rmtree(args.runs, ignore_errors=True)
    return run_study(text, args.runs, args.jobs, args.mpiexec)


def read_study(study: Path) -> list[Run]:
    """The table ``hpcopt collect`` wrote into the study directory ``study``, in task order."""
    from hpcopt.study.layout import read_manifest

    with open(study / "study.csv", newline="") as handle:
        rows = {row["run"]: row for row in csv.DictReader(handle)}
    runs = []
    for entry in read_manifest(study):
        names = (flag.removeprefix("--").replace("-", "_") for flag in entry.args[::2])
        row = rows.get(entry.run.as_posix())
        if row is None or row["state"] != "finished":
            state = row["state"] if row else "not in study.csv"
            raise SystemExit(f"{study / entry.run}: {state} (run the study to its end, then collect)")
        runs.append(Run(study / entry.run, entry.ranks, dict(zip(names, entry.args[1::2])), row))
    return runs


def find_run(runs: list[Run], ranks: int, **options: Any) -> Run:
    """The run on ``ranks`` ranks whose options have these values (None: the option not given)."""
    from hpcopt.study.spec import flag_value

    def matches(run: Run) -> bool:
        return run.ranks == ranks and all(
            run.options.get(k) == (None if v is None else flag_value(v)) for k, v in options.items())

    found = [run for run in runs if matches(run)]
    if len(found) != 1:
        raise SystemExit(f"{len(found)} runs of the study on {ranks} ranks with {options}")
    return found[0]
