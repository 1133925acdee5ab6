"""A study's tasks as job steps of one Slurm allocation: ``python -m hpcopt.study.pack``, run by
``packed.sh`` (``[job] pack_nodes``) in the study directory.

Each unfinished task runs exactly as its array task would (``python -m hpcopt.study.task INDEX
srun --exact --ntasks=R``: the same run directory, record, log and resume), as many at once as
the allocation's tasks (``SLURM_NTASKS``) hold, the next one starting as soon as one ends: many
small runs share one allocation instead of waiting in the queue one by one. A task that asks for
more ranks than the allocation has fails with a note.

A stop signal to the batch shell (``--signal=B:TERM@N``, ``scancel --batch``) reaches this
process: no task starts after it, every running task's runner passes it on to its srun and stops
at a checkpoint. Exit 143 then (130 for SIGINT), 0 when every task finished, 1 when one failed;
after 143 the allocation requeues itself (``--requeue N``, as ``hpcopt.study.task``), and the
next attempt resumes the stopped tasks and leaves the finished ones alone (after a lost node
too: ``hpcopt.study.task.requeue_job``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import HpcoptError
from .layout import Entry, read_manifest
from .local import run_local
from .outcome import STOP_SIGNALS
from .task import attempt, requeue_job, requeue_option


def step_command(entry: Entry) -> list[str]:
    """Task ``entry`` as a job step that takes exactly its ranks from the allocation."""
    return [sys.executable, "-m", "hpcopt.study.task", str(entry.index), "srun", "--exact",
            f"--ntasks={entry.ranks}"]


def run_packed(study: Path, requeue: int) -> int:
    """Run the study's tasks inside this allocation (module docstring); the exit status."""
    ranks = os.environ.get("SLURM_NTASKS", "")
    if not ranks.isdigit():
        raise HpcoptError("python -m hpcopt.study.pack runs inside a Slurm allocation (sbatch packed.sh); "
                          "SLURM_NTASKS is not set")
    entries = read_manifest(study)
    too_big = [e for e in entries if e.ranks > int(ranks)]
    print(f"packed: {attempt()}; {len(entries)} task(s) on {ranks} task slot(s)", flush=True)
    code = run_local(study, [e for e in entries if e not in too_big], len(entries), step_command, int(ranks))
    for entry in too_big:
        print(f"task {entry.index}: not started: it needs {entry.ranks} ranks, the allocation has {ranks}",
              flush=True)
    code = code if code or not too_big else 1
    if requeue:  # a stop signal reached this batch shell: the time limit's (B:TERM), or a scancel
        requeue_job("packed", code, requeue, code in STOP_SIGNALS)
    return code


def main(argv: list[str]) -> int:
    parsed = requeue_option(argv)
    if parsed is None or parsed[1]:
        print("usage: python -m hpcopt.study.pack [--requeue N] (in the study directory, inside a Slurm "
              "allocation)", file=sys.stderr)
        return 2
    try:
        return run_packed(Path.cwd(), parsed[0])
    except HpcoptError as exc:
        print(f"hpcopt: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    import mpi4py

    mpi4py.rc.initialize = mpi4py.rc.finalize = False  # the readers import mpi4py; no MPI here
    sys.exit(main(sys.argv[1:]))
