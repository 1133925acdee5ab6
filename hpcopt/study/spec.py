"""The sweep file and the tasks it makes.

A sweep file has three tables: ``[job]`` (scheduler, name, time, ranks_per_node, cpus_per_rank,
gpus_per_node, throttle, requeue; the site's account, partition, qos and memory; and
``directives``, any other lines for the scheduler), ``[train]`` (``hpcopt train`` options
every task shares) and ``[sweep]`` (lists: every combination is one task; ``ranks`` is the
number of MPI ranks). A study that is several grids writes ``[[sweep]]`` once per grid: its
tasks are those of every grid, each grid's values on top of ``[train]``.
Every key is checked against ``hpcopt train``'s own options and every task's options are
resolved as ``hpcopt train`` would resolve them, so a typo or a bad value fails here and not
after a day in the queue.
"""

from __future__ import annotations

import itertools
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HpcoptError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SCHEDULERS = ("slurm", "pbs")
JOB_DEFAULTS: dict[str, Any] = {"scheduler": "slurm", "name": "hpcopt", "time": "01:00:00",
                                "ranks_per_node": 1, "cpus_per_rank": 1, "gpus_per_node": 0,
                                "throttle": 0, "requeue": 5, "account": "", "partition": "",
                                "qos": "", "memory": "", "directives": [], "pack_nodes": 0,
                                "pack_time": ""}
#: The [job] integers' ranges (beyond any machine: a typo, not a request to pass to the scheduler).
JOB_RANGES = {"ranks_per_node": (1, 4096), "cpus_per_rank": (1, 4096), "gpus_per_node": (0, 64),
              "throttle": (0, 1_000_000), "requeue": (0, 1000), "pack_nodes": (0, 200_000)}
#: The [job] words the scheduler's site needs ("": not asked for): the account to charge, the
#: partition (PBS: queue), the QoS (Slurm only), the memory per node ("16G").
SITE_KEYS = ("account", "partition", "qos", "memory")
#: The most ranks and nodes a task may ask for (more nodes than the largest machines have).
MAX_RANKS, MAX_NODES = 10_000_000, 200_000
#: Options the study sets itself: each task's run directory.
RESERVED = ("out", "resume")
ABBREVIATIONS = {"ranks": "n", "interval": "I", "seed": "s"}
UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]")  # replaced by "_" in run directory names
WORD = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class Task:
    """One run of the study: its place in the array, run directory name, ranks and options."""

    index: int
    name: str
    ranks: int
    args: tuple[str, ...]  # ``hpcopt train`` flags, without --out

    @property
    def run(self) -> Path:
        """The run directory, relative to the study directory."""
        return Path("runs") / self.name


@dataclass(frozen=True)
class Study:
    """A sweep file read and checked."""

    job: dict[str, Any]
    train: dict[str, Any]
    sweep: list[dict[str, list[Any]]]  # the grids: one ``[sweep]`` table, or each ``[[sweep]]``
    text: str  # the file as written, kept in the study directory


def load_study(path: str | Path) -> Study:
    """The sweep file ``path``, validated (HpcoptError naming the problem otherwise)."""
    path = Path(path)
    try:
        text = path.read_text()
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise HpcoptError(f"sweep file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HpcoptError(f"cannot read sweep file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise HpcoptError(f"sweep file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - {"job", "train", "sweep"}
    if unknown:
        raise HpcoptError(f"unknown table(s) {sorted(unknown)} in {path}: use [job], [train], [sweep]")
    job = _job(data.get("job", {}))
    train, sweep = data.get("train", {}), data.get("sweep", {})
    grids = sweep if isinstance(sweep, list) else [sweep]
    from ..config import option_index

    known = option_index()
    for table, values in (("train", train), *(("sweep", grid) for grid in grids)):
        for key in values:
            if key not in known and not (table == "sweep" and key == "ranks"):
                raise HpcoptError(f"[{table}] {key!r} is not an hpcopt train option")
            if key in RESERVED:
                raise HpcoptError(f"[{table}] {key!r} is set by the sweep (one run directory per task)")
    for grid in grids:
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise HpcoptError(f"[sweep] {key} must be a non-empty list")
        ranks = grid.get("ranks", [1])
        if any(not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= MAX_RANKS for r in ranks):
            raise HpcoptError(f"[sweep] ranks must be integers from 1 to {MAX_RANKS}, got {ranks}")
        nodes = -(-max(ranks) // job["ranks_per_node"])
        if nodes > MAX_NODES:
            raise HpcoptError(f"[sweep] ranks {max(ranks)} at ranks_per_node {job['ranks_per_node']} "
                              f"would ask for {nodes} nodes (at most {MAX_NODES})")
    return Study(job, train, grids, text)


def _job(table: dict[str, Any]) -> dict[str, Any]:
    job = dict(JOB_DEFAULTS)
    for key, value in table.items():
        if key not in JOB_DEFAULTS:
            raise HpcoptError(f"unknown [job] key {key!r} (keys: {', '.join(JOB_DEFAULTS)})")
        job[key] = value
    if job["scheduler"] not in SCHEDULERS:
        raise HpcoptError(f"scheduler must be one of {SCHEDULERS}, got {job['scheduler']!r}")
    for key, (least, most) in JOB_RANGES.items():
        if not isinstance(job[key], int) or isinstance(job[key], bool) or not least <= job[key] <= most:
            raise HpcoptError(f"[job] {key} must be an integer from {least} to {most}")
    if job["gpus_per_node"] and job["gpus_per_node"] != job["ranks_per_node"]:
        raise HpcoptError("with GPUs, ranks_per_node must equal gpus_per_node (one rank per GPU)")
    for key in ("name", "time", *SITE_KEYS):
        if not isinstance(job[key], str) or (job[key] or key in ("name", "time")) and not WORD.match(
                job[key].replace(":", "")):
            raise HpcoptError(f"[job] {key} must be a word of letters, digits and . _ - (got {job[key]!r})")
    task_seconds(job["time"])  # HpcoptError for a time the scheduler would not read
    if job["pack_nodes"] and job["scheduler"] != "slurm":
        raise HpcoptError("[job] pack_nodes runs tasks as Slurm job steps: Slurm only")
    if job["pack_time"]:
        if not isinstance(job["pack_time"], str):
            raise HpcoptError("[job] pack_time must be a time like 04:00:00")
        task_seconds(job["pack_time"])
    if job["qos"] and job["scheduler"] == "pbs":
        raise HpcoptError("[job] qos is Slurm's: PBS has none (use partition for the queue, or directives)")
    directives = job["directives"]
    if not isinstance(directives, list) or not all(
            isinstance(d, str) and d.startswith("-") and d.isprintable() for d in directives):
        raise HpcoptError('[job] directives must be a list of scheduler options, each one line starting '
                          'with "-" (e.g. ["--exclusive", "--mail-type=END"])')
    return job


def task_seconds(time: str) -> int:
    """The seconds of a task's time limit in Slurm's forms (``MM``, ``MM:SS``, ``HH:MM:SS``,
    ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``; PBS's ``HH:MM:SS``); HpcoptError for anything else,
    or under a minute."""
    days, dash, clock = time.rpartition("-")
    parts = clock.split(":")
    if (dash and not days.isdigit()) or not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise HpcoptError(f"[job] time must be MM, MM:SS, HH:MM:SS or D-HH[:MM[:SS]], got {time!r}")
    numbers = [int(p) for p in parts]
    # after the days: hours, minutes, seconds; else minutes; minutes:seconds; hours:minutes:seconds
    units: tuple[int, ...] = (3600, 60, 1) if dash else {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(numbers)]
    seconds = int(days or 0) * 86400 + sum(n * u for n, u in zip(numbers, units))
    if seconds < 60:
        raise HpcoptError(f"[job] time {time!r} is under a minute (schedulers count whole minutes)")
    return seconds


def flag_value(value: Any) -> str:
    """A TOML value as ``hpcopt train`` reads it from the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _short(key: str, value: Any) -> str:
    return UNSAFE.sub("_", f"{ABBREVIATIONS.get(key, key)}{flag_value(value).replace(',', '_')}")


def _combinations(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of one grid's lists, ``ranks`` first (1 when the grid has none)."""
    keys = ["ranks", *(k for k in grid if k != "ranks")]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid.get(k, [1]) for k in keys))]


def _differing_keys(combos: list[dict[str, Any]]) -> set[str]:
    """The keys whose value (as a flag; absent: "None") is not the same in every combination:
    one pass over the combinations, not one per combination."""
    keys = {key for combo in combos for key in combo}
    seen: dict[str, set[str]] = {key: set() for key in keys}
    for combo in combos:
        for key in keys:
            seen[key].add(flag_value(combo.get(key)))
    return {key for key, values in seen.items() if len(values) > 1}


def tasks(study: Study) -> list[Task]:
    """One task per combination of each grid's lists, ``ranks`` outermost (so the tasks of one
    rank count are contiguous: one array each), each resolved as ``hpcopt train`` would. A run
    directory's name holds the values of the keys its grid sweeps or that differ between grids."""
    from ..config import build_config
    from ..run.fault_schedule import check_ranks

    combos = sorted(((grid, c) for grid in study.sweep for c in _combinations(grid)),
                    key=lambda pair: pair[1]["ranks"])
    between = _differing_keys([c for _, c in combos])
    found: list[Task] = []
    names: dict[str, int] = {}
    for grid, chosen in combos:
        ranks = chosen.pop("ranks")
        name = "-".join([study.job["name"], _short("ranks", ranks),
                         *(_short(k, v) for k, v in chosen.items() if len(grid[k]) > 1 or k in between)])
        options = {k: flag_value(v) for k, v in {**study.train, **chosen}.items()}
        if study.job["gpus_per_node"]:
            options["device"] = "gpu"
        try:
            check_ranks(build_config(None, options).run, ranks)  # --fault, --straggler name ranks
        except HpcoptError as exc:
            raise HpcoptError(f"task {name}: {exc}") from None
        if name in names:
            raise HpcoptError(f"tasks {names[name]} and {len(found)} would share the run directory "
                              f"runs/{name}: give the sweep values that differ in their names")
        names[name] = len(found)
        args = tuple(part for k, v in options.items() for part in (f"--{k.replace('_', '-')}", v))
        found.append(Task(len(found), name, ranks, args))
    return found


def command_line(task: Task) -> str:
    """The task's ``hpcopt train`` flags as one shell-quoted line (the manifest's column)."""
    return shlex.join(task.args)
