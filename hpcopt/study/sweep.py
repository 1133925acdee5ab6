"""``hpcopt sweep STUDY.toml``: a study directory with one job array per rank count.

The tasks of a sweep file (``spec.py``) go into ``manifest.tsv``; the tasks that run on R ranks
(contiguous in the manifest) become one array, ``array-n<R>.sh``: ``#SBATCH --array=A-B%K``
under Slurm or ``#PBS -J A-B`` under PBS (K = ``[job] throttle``), rendered from
``templates/<scheduler>.sh``. An array's tasks share one resource request, hence one array per
rank count. Each task runs ``python -m hpcopt.study.task`` (``task.py``). ``--dry-run`` lists
the tasks and writes nothing; ``--local -j K`` runs them here, K at a time (``local.py``).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shlex
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HpcoptError
from ..io.safe_files import replacing, write_replacing
from .layout import (
    LOGS,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    SITE,
    SPEC,
    logs_folder,
    manifest_text,
    read_manifest,
    stored_manifest,
)
from .spec import Study, Task, command_line, load_study, task_seconds, tasks

TEMPLATES = Path(__file__).resolve().parent / "templates"
#: Seconds before the time limit that a Slurm task is asked to stop (``--signal=TERM@LEAD``).
LEAD = 120
#: The script of a packed study (``[job] pack_nodes``).
PACKED = "packed.sh"
#: A task time under this many seconds gets a warning: stopping takes a large part of it.
SHORT_TASK_SECONDS = 600
DEFAULT_SITE = Path("jobs/site.sh")
SITE_STUB = ("# Site file: sourced by every array script of this study before hpcopt starts\n"
             "# (module loads, the virtual environment, MPI variables). None was given.\n:\n")


@dataclass(frozen=True)
class Script:
    """An array script: its file name, text, and the tasks it runs."""

    name: str
    text: str
    first: int
    last: int
    ranks: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", metavar="STUDY.toml",
                        help="sweep file: [job], [train] and [sweep] tables, or [[sweep]] once per grid "
                        "(see jobs/README.md)")
    parser.add_argument("--out", default="study", help="the study directory (default: study)")
    parser.add_argument("--site", help="site file the arrays source, copied into the study as "
                        f"site.sh (default: {DEFAULT_SITE} when it exists)")
    parser.add_argument("--dry-run", action="store_true", help="list the tasks; write nothing")
    parser.add_argument("--local", action="store_true",
                        help="run the tasks on this machine (mpiexec), with the same run "
                        "directories and resume as the arrays")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="K",
                        help="with --local: tasks at a time (default: 1)")


def _array(scheduler: str, first: int, last: int, throttle: int) -> str:
    if scheduler == "pbs":  # PBS ranges need two indices: the step 2 leaves only the first
        return f"{first}-{last}" if last > first else f"{first}-{first + 1}:2"
    return (f"{first}-{last}" if last > first else str(first)) + (f"%{throttle}" if throttle else "")


def scripts(study: Study, found: list[Task]) -> list[Script]:
    """One array script per rank count."""
    job = study.job
    template = string.Template((TEMPLATES / f"{job['scheduler']}.sh").read_text())
    rendered = []
    for ranks, group in itertools.groupby(found, key=lambda t: t.ranks):
        members = list(group)
        first, last = members[0].index, members[-1].index
        per_node, gpus = min(ranks, job["ranks_per_node"]), job["gpus_per_node"]
        name = f"array-n{ranks}.sh"
        values = {
            **_shared_values(job, task_seconds(job["time"])),
            "name": f"{job['name']}-n{ranks}",
            "pbs_memory": f":mem={job['memory']}" if job["memory"] else "",
            "array": _array(job["scheduler"], first, last, job["throttle"]),
            "first": first, "last": last, "script": name, "ranks": ranks,
            "nodes": math.ceil(ranks / job["ranks_per_node"]), "ranks_per_node": per_node,
            "cpus_per_node": per_node * job["cpus_per_rank"], "time": job["time"],
            "pbs_gpus": f":ngpus={gpus}" if gpus else "",
            # PBS Pro 2020 and later; older servers reject the line (remove it there)
            "pbs_throttle": f"#PBS -W max_run_subjobs={job['throttle']}" if job["throttle"] else "",
            # one rank per GPU: Slurm binds each task to its closest GPU and hpcopt picks it by
            # node-local rank; PBS sites bind through their own mpiexec wrappers (site file)
            "launcher_flags": "--gpus-per-task=1 --gpu-bind=closest" if job["scheduler"] == "slurm" and gpus
            else "",
        }
        rendered.append(Script(name, template.substitute(values), first, last, ranks))
    if job["pack_nodes"]:
        rendered.append(packed_script(study, found))
    return rendered


def packed_script(study: Study, found: list[Task]) -> Script:
    """``packed.sh``: every task as job steps of one allocation of ``[job] pack_nodes`` nodes,
    for ``[job] pack_time`` (default: a task's time for each round of tasks the allocation
    holds at once, at most 7 days)."""
    job = study.job
    slots = job["pack_nodes"] * job["ranks_per_node"]
    rounds = math.ceil(sum(t.ranks for t in found) / slots)
    seconds = task_seconds(job["pack_time"]) if job["pack_time"] else min(
        rounds * task_seconds(job["time"]), 7 * 86400)
    hours, minutes = seconds % 86400 // 3600, seconds % 3600 // 60
    time = job["pack_time"] or f"{seconds // 86400}-{hours:02d}:{minutes:02d}:00"
    values = {**_shared_values(job, seconds), "name": f"{job['name']}-packed", "nodes": job["pack_nodes"],
              "ranks": slots, "ranks_per_node": job["ranks_per_node"], "time": time, "script": PACKED}
    text = string.Template((TEMPLATES / "packed.sh").read_text()).substitute(values)
    return Script(PACKED, text, found[0].index, found[-1].index, slots)


def _shared_values(job: dict[str, Any], seconds: int) -> dict[str, Any]:
    """What every script of a study fills in alike, for a time limit of ``seconds``: the stop
    signal's lead, the requeue budget, the site's directives, CPUs and GPUs per rank."""
    gpus = job["gpus_per_node"]
    return {"lead": stop_lead(seconds), "requeue": job["requeue"], "directives": _directives(job),
            "cpus_per_rank": job["cpus_per_rank"],
            "gpu_directives": f"#SBATCH --gpus-per-node={gpus}" if gpus else ""}


def stop_lead(seconds: int) -> int:
    """Seconds before a task's time limit that Slurm is asked to send SIGTERM (``--signal``):
    ``LEAD`` (room for a checkpoint), but at most a quarter of a short task's time, which Slurm
    would otherwise stop almost at once (it sends the signal up to 30 s early, every attempt)."""
    return min(LEAD, seconds // 4)


def _directives(job: dict[str, Any]) -> str:
    """The scheduler lines of ``[job]``'s site keys and ``directives`` (none: "")."""
    if job["scheduler"] == "pbs":
        lines = [f"-A {job['account']}" if job["account"] else "",
                 f"-q {job['partition']}" if job["partition"] else ""]
    else:
        lines = [f"--{flag}={job[key]}" for key, flag in (("account", "account"), ("partition", "partition"),
                                                          ("qos", "qos"), ("memory", "mem")) if job[key]]
    prefix = "#PBS" if job["scheduler"] == "pbs" else "#SBATCH"
    return "\n".join(f"{prefix} {line}" for line in [*lines, *job["directives"]] if line)


def _site_text(site: str | None) -> str:
    """The study's site file: what this machine's Python environment needs in a job (``site_
    preamble``), then the user's site file (``--site``, else jobs/site.sh where it exists)."""
    path = Path(site) if site else DEFAULT_SITE
    if not site and not path.is_file():
        return site_preamble() + SITE_STUB
    try:
        return site_preamble() + path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise HpcoptError(f"cannot read the site file {path}: {exc}") from None


def site_preamble() -> str:
    """Lines that make a job's environment this one's: the virtual environment ``hpcopt sweep``
    runs in (activated where it exists on the node: neither Slurm under ``--export=NONE`` nor PBS
    passes the submitting shell's on), and srun's MPI plugin for the MPI library mpi4py uses
    (``SLURM_MPI_TYPE``, unless the site sets one: with ``MpiDefault=none`` a bare srun starts
    singletons, which ``hpcopt train`` refuses)."""
    from ..comm.launcher import SRUN_MPI_TYPES
    from ..comm.mpi_support import mpi_library

    lines = ["# Written by hpcopt sweep: this machine's Python environment, then the site file."]
    if sys.prefix != sys.base_prefix:
        activate = shlex.quote(str(Path(sys.prefix) / "bin" / "activate"))
        lines.append(f"if [ -f {activate} ]; then source {activate}; fi")
    library = mpi_library()
    family = next((family for family in SRUN_MPI_TYPES if family in library), "")
    if family:
        lines.append(f'export SLURM_MPI_TYPE="${{SLURM_MPI_TYPE:-{SRUN_MPI_TYPES[family]}}}"   '
                     f'# srun --mpi for {family}')
    return "\n".join(lines) + "\n"


def write_study(out: Path, study: Study, found: list[Task], arrays: list[Script], site: str) -> None:
    """Write the study directory; HpcoptError if it holds a different study."""
    manifest = manifest_text(found)
    if len(manifest.encode()) > MAX_MANIFEST_BYTES:
        raise HpcoptError(f"the sweep's {len(found)} tasks would make a {MANIFEST} larger than "
                          f"{MAX_MANIFEST_BYTES >> 20} MB: split it into several sweep files")
    stored = stored_manifest(out)  # a link or FIFO planted at its name: refused, never read
    if stored is not None and stored != manifest:
        raise HpcoptError(f"{out} holds another study (its {MANIFEST} lists other tasks): "
                          "choose another --out")
    with logs_folder(out / LOGS, create=True):  # a link planted at logs/: refused
        pass
    # each file by rename (safe_files.replacing): a link or FIFO planted at its name is replaced
    for script in arrays:
        with replacing(out / script.name, "array script") as handle:
            os.fchmod(handle.fileno(), 0o755)
            handle.write(script.text)
    write_replacing(out / SITE, site, "site file")
    write_replacing(out / SPEC, study.text, "sweep file")
    write_replacing(out / MANIFEST, manifest, "manifest")


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1 or (args.jobs != 1 and not args.local):
        raise HpcoptError("-j K needs --local and K >= 1")
    study = load_study(args.sweep)
    found = tasks(study)
    arrays = scripts(study, found)
    out = Path(args.out)
    width = max(len(t.run.as_posix()) for t in found)
    for task in found:
        run = task.run.as_posix()
        print(f"{task.index:>4}  {task.ranks:>3} rank(s)  {run:<{width}}  {command_line(task)}")
    described = ", ".join(f"{a.name} (tasks {a.first}-{a.last}, {a.ranks} rank(s))" for a in arrays
                          if a.name != PACKED)
    described += f", {PACKED} (every task in one allocation)" if study.job["pack_nodes"] else ""
    seconds = task_seconds(study.job["time"])
    if seconds < SHORT_TASK_SECONDS and study.job["scheduler"] == "slurm":
        print(f"hpcopt: warning: [job] time {study.job['time']} is short: each attempt is asked to stop "
              f"{stop_lead(seconds)} s before its limit and Slurm may signal up to 30 s earlier still",
              flush=True)
    if args.dry_run:
        print(f"would write {len(found)} task(s) into {out}: {MANIFEST}, {described}")
        return 0
    site = _site_text(args.site)
    write_study(out, study, found, arrays, site)
    print(f"wrote {len(found)} task(s) into {out}: {MANIFEST}, {described}", flush=True)
    if args.local:
        from .local import run_local

        return run_local(out, read_manifest(out), args.jobs)
    submit = "qsub" if study.job["scheduler"] == "pbs" else "sbatch"
    submitted = [a.name for a in arrays if a.name != PACKED]
    packed = f" (or, every task in one allocation: {submit} {PACKED})" if study.job["pack_nodes"] else ""
    print(f"submit from the study directory: cd {out}; "
          + "; ".join(f"{submit} {name}" for name in submitted) + packed)
    return 0
