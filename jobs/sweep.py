"""Write one batch job per combination of a sweep file's lists (Slurm or PBS).

    python jobs/sweep.py SWEEP.toml [--out DIR] [--site FILE] [--dry-run]

The sweep file has three tables: ``[job]`` (scheduler, name, time, ranks_per_node,
cpus_per_rank, gpus_per_node), ``[train]`` (fixed ``hpcopt train`` options) and ``[sweep]``
(lists; every combination becomes one job; ``ranks`` is the number of MPI ranks). Options are
checked against hpcopt's own, so a typo fails here and not after a day in the queue. Scripts are
rendered from ``jobs/templates/<scheduler>.sh``; site specifics come from the site file the
scripts source (``jobs/site.sh`` unless ``--site`` or ``$HPCOPT_SITE`` says otherwise).
"""

from __future__ import annotations

import argparse
import itertools
import math
import shlex
import string
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
SCHEDULERS = ("slurm", "pbs")
JOB_DEFAULTS = {"scheduler": "slurm", "name": "hpcopt", "time": "01:00:00", "ranks_per_node": 1,
                "cpus_per_rank": 1, "gpus_per_node": 0}


class SweepError(ValueError):
    """A sweep file that cannot produce valid jobs."""


@dataclass(frozen=True)
class Job:
    name: str
    path: Path
    script: str


def hpcopt_options() -> set[str]:
    from hpcopt.config import option_index

    return set(option_index())


def load_sweep(path: Path) -> tuple[dict, dict, dict]:
    """(job, train, sweep) tables of a sweep file, validated."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SweepError(f"cannot read sweep file {path}: {exc}") from None
    unknown = set(data) - {"job", "train", "sweep"}
    if unknown:
        raise SweepError(f"unknown table(s) {sorted(unknown)}: use [job], [train], [sweep]")
    job = dict(JOB_DEFAULTS)
    for key, value in data.get("job", {}).items():
        if key not in JOB_DEFAULTS:
            raise SweepError(f"unknown [job] key {key!r} (keys: {', '.join(JOB_DEFAULTS)})")
        job[key] = value
    if job["scheduler"] not in SCHEDULERS:
        raise SweepError(f"scheduler must be one of {SCHEDULERS}, got {job['scheduler']!r}")
    for key in ("ranks_per_node", "cpus_per_rank"):
        if not isinstance(job[key], int) or job[key] < 1:
            raise SweepError(f"[job] {key} must be a positive integer")
    if job["gpus_per_node"] and job["gpus_per_node"] != job["ranks_per_node"]:
        raise SweepError("with GPUs, ranks_per_node must equal gpus_per_node (one rank per GPU)")
    train, sweep = data.get("train", {}), data.get("sweep", {})
    known = hpcopt_options()
    for table, values in (("train", train), ("sweep", sweep)):
        for key in values:
            if key not in known and not (table == "sweep" and key == "ranks"):
                raise SweepError(f"[{table}] {key!r} is not an hpcopt train option")
            if key in ("out", "resume"):
                raise SweepError(f"[{table}] {key!r} is set by the sweep (one run directory per job)")
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"[sweep] {key} must be a non-empty list")
    ranks = sweep.get("ranks", [1])
    if any(not isinstance(r, int) or r < 1 for r in ranks):
        raise SweepError(f"[sweep] ranks must be positive integers, got {ranks}")
    return job, train, sweep


def _flag_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _short(key: str, value: object) -> str:
    abbreviations = {"ranks": "n", "interval": "I", "seed": "s"}
    return f"{abbreviations.get(key, key)}{_flag_value(value).replace(',', '_')}"


def expand(job: dict, train: dict, sweep: dict, out: Path, site: Path) -> list[Job]:
    """One rendered script per combination of the sweep lists."""
    template = string.Template((TEMPLATES / f"{job['scheduler']}.sh").read_text())
    keys = list(sweep) if "ranks" in sweep else ["ranks", *sweep]
    lists = [sweep.get(k, [1]) for k in keys]
    jobs = []
    for combo in itertools.product(*lists):
        chosen = dict(zip(keys, combo))
        ranks = chosen.pop("ranks")
        name = "-".join([job["name"], _short("ranks", ranks),
                         *(_short(k, v) for k, v in chosen.items() if len(sweep[k]) > 1)])
        options = {**train, **chosen}
        gpus = job["gpus_per_node"]
        if gpus:
            options["device"] = "gpu"
        run_dir = out / "runs" / name
        args = " ".join(f"--{k.replace('_', '-')} {shlex.quote(_flag_value(v))}"
                        for k, v in options.items())
        resume_args = f"--model {shlex.quote(str(options['model']))}" if "model" in options else ""
        per_node = min(ranks, job["ranks_per_node"])
        values = {
            "name": name, "ranks": ranks, "nodes": math.ceil(ranks / job["ranks_per_node"]),
            "ranks_per_node": per_node, "cpus_per_rank": job["cpus_per_rank"],
            "cpus_per_node": per_node * job["cpus_per_rank"], "time": job["time"],
            "log": out / "logs" / f"{name}.log", "site": site, "out": run_dir, "args": args,
            "resume_args": resume_args,
            "gpu_directives": f"#SBATCH --gpus-per-node={gpus}" if gpus else "",
            "pbs_gpus": f":ngpus={gpus}" if gpus else "",
            "launcher_flags": _launcher_flags(job["scheduler"], gpus),
        }
        jobs.append(Job(name, out / f"{name}.sh", template.substitute(values)))
    return jobs


def _launcher_flags(scheduler: str, gpus: int) -> str:
    """One rank per GPU: Slurm binds each task to its closest GPU; hpcopt then selects the GPU
    by node-local rank. PBS sites bind through their own mpiexec wrappers (site file)."""
    if scheduler == "slurm" and gpus:
        return "--gpus-per-task=1 --gpu-bind=closest"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="sweep file (TOML)")
    parser.add_argument("--out", type=Path, default=Path("jobs/generated"),
                        help="where scripts (and, when they run, logs and run directories) go")
    parser.add_argument("--site", type=Path, default=HERE / "site.sh", help="site file to source")
    parser.add_argument("--dry-run", action="store_true", help="list the jobs, write nothing")
    args = parser.parse_args(argv)
    try:
        jobs = expand(*load_sweep(args.sweep), args.out.resolve(), args.site.resolve())
    except SweepError as exc:
        print(f"sweep: error: {exc}", file=sys.stderr)
        return 2
    if not args.dry_run:  # schedulers do not create the directory of a job's log file
        (args.out / "logs").mkdir(parents=True, exist_ok=True)
    for job in jobs:
        if not args.dry_run:
            job.path.write_text(job.script)
            job.path.chmod(0o755)
        print(job.path)
    verb = "would write" if args.dry_run else "wrote"
    print(f"{verb} {len(jobs)} job script(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
