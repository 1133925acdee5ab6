"""One task of a study: ``python -m hpcopt.study.task INDEX LAUNCHER...``, in the study directory.

The job array runs it as task INDEX (``SLURM_ARRAY_TASK_ID``, ``PBS_ARRAY_INDEX``), and
``hpcopt sweep --local`` the same way. It reads line INDEX of ``manifest.tsv`` and runs, under
LAUNCHER (``srun ...`` or ``mpiexec -n R``), with this Python:

- nothing, when the run directory holds a finished trace (a resubmitted task);
- ``hpcopt resume RUN`` when it holds checkpoints (a requeued task continues where it stopped),
  with ``--ranks-changed`` when LAUNCHER starts another number of ranks than wrote the newest
  checkpoint (a task requeued onto fewer or more nodes);
- ``hpcopt train OPTIONS --out RUN`` otherwise.

A task with ``--on-rank-loss continue`` goes on without a lost rank only under Open MPI's ULFM:
an Open MPI ``mpiexec`` or ``mpirun`` LAUNCHER gets ``--with-ft ulfm`` (unless it has it); any
other launcher runs as given, and the run says in one line why it cannot continue.

While the run goes, the task's record (``logs/task-INDEX.json``) is locked; at the end it
gets the exit status, which is also this process's. SIGTERM, SIGINT and SIGUSR1 reach the ranks
from the scheduler, the terminal or ``sweep --local``; this process only waits for them and
records how the run ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import HpcoptError
from ..run.signals import SIGNALS
from .layout import Entry, TaskRecord, read_manifest


def finished(run: Path) -> bool:
    """Whether ``run`` holds a trace with its end-of-run summary (read in a child first)."""
    from ..io.report import read_each
    from ..io.trace import FILE_NAME, Trace

    trace = run / FILE_NAME
    if not trace.is_file():
        return False
    [read] = read_each([trace])
    return isinstance(read, Trace) and read.summary is not None


def command(study: Path, entry: Entry, launcher: Sequence[str]) -> list[str] | None:
    """The command that carries the task on (None: it has finished)."""
    run = study / entry.run
    launcher = fault_tolerant(entry, launcher)
    hpcopt = [*launcher, sys.executable, "-m", "hpcopt"]
    train = [*hpcopt, "train", *entry.args, "--out", entry.run.as_posix()]
    if not run.exists():  # a first start: nothing to read (and no reader to import)
        return train
    from ..io.data_parallel_checkpoint import has_checkpoints

    if finished(run):
        return None
    if not has_checkpoints(run):
        return train
    changed = ["--ranks-changed"] if _ranks_changed(run, launcher) else []
    return [*hpcopt, "resume", entry.run.as_posix(), *changed, *_named_model(entry.args)]


def fault_tolerant(entry: Entry, launcher: Sequence[str]) -> list[str]:
    """``launcher``, with ``--with-ft ulfm`` after the program when the task goes on without a
    lost rank (``--on-rank-loss continue`` needs ULFM: hpcopt.comm.ulfm), the program is
    ``mpiexec`` or ``mpirun`` and the MPI is Open MPI, and ``--with-ft`` is not given yet; else
    as given (``srun``, MPICH: the run refuses ``continue`` in one line, saying why)."""
    options = dict(zip(entry.args[::2], entry.args[1::2]))
    if (options.get("--on-rank-loss") != "continue" or not launcher
            or Path(launcher[0]).name not in ("mpiexec", "mpirun")
            or any(word.split("=")[0] == "--with-ft" for word in launcher)):
        return list(launcher)
    from ..comm.mpi_support import open_mpi

    return [launcher[0], "--with-ft", "ulfm", *launcher[1:]] if open_mpi() else list(launcher)


def launched_ranks(launcher: Sequence[str]) -> int | None:
    """The number of ranks ``launcher`` starts: its ``-n``/``-np`` (``mpiexec -n 4``, ``srun -n 2``,
    ``-n=4``), else Slurm's ``SLURM_NTASKS`` for ``srun`` (the array's ``--ntasks``, or a
    resubmission's); None when it cannot be told."""
    for i, word in enumerate(launcher):
        flag, equals, value = word.partition("=")
        if flag in ("-n", "-np", "--np", "--ntasks"):
            value = value if equals else (launcher[i + 1] if i + 1 < len(launcher) else "")
            return int(value) if value.isdigit() else None
    if launcher and Path(launcher[0]).name == "srun":
        ntasks = os.environ.get("SLURM_NTASKS", "")
        return int(ntasks) if ntasks.isdigit() else None
    return None


def _ranks_changed(run: Path, launcher: Sequence[str]) -> bool:
    """Whether the newest checkpoint of ``run`` was written by another number of ranks than
    ``launcher`` starts (a task requeued onto fewer or more nodes): its resume then needs
    ``--ranks-changed``. The checkpoint is read in a child first (hpcopt.io.vet); one that cannot
    be read is left to ``hpcopt resume`` to report."""
    from ..io.data_parallel_checkpoint import checkpoint_world_size

    ranks = launched_ranks(launcher)
    try:
        return ranks is not None and checkpoint_world_size(run) != ranks
    except HpcoptError:
        return False


def _named_model(args: Sequence[str]) -> list[str]:
    """``--model SPEC`` when the task trains a torch model (a resume imports one only when the
    command line names it again), else nothing."""
    model = next((value for flag, value in zip(args, args[1:]) if flag == "--model"), "")
    return ["--model", model] if model.startswith("torch:") else []


def _wait(process: subprocess.Popen) -> int:
    """The process's exit status as a shell gives it (128 + N when killed by signal N)."""
    code = process.wait()
    return 128 - code if code < 0 else code


def run_task(study: Path, index: int, launcher: Sequence[str]) -> int:
    """Run task ``index`` of ``study`` under ``launcher``, recording it; its exit status."""
    entries = read_manifest(study)
    if not 0 <= index < len(entries):
        raise HpcoptError(f"task {index} is not in {study}/manifest.tsv (tasks 0 to {len(entries) - 1})")
    record = TaskRecord(study, entries[index])
    record.start()
    code = 1
    try:
        code = _carry_on(study, entries[index], launcher)
    except HpcoptError:
        code = 2
        raise
    finally:
        record.end(code)
    return code


def _carry_on(study: Path, entry: Entry, launcher: Sequence[str]) -> int:
    argv = command(study, entry, launcher)
    if argv is None:
        print(f"task {entry.index}: {entry.run} has finished; nothing to do", flush=True)
        return 0
    print(f"task {entry.index}: {' '.join(argv)}", flush=True)
    previous = {s: signal.signal(s, lambda *_: None) for s in SIGNALS}
    try:  # caught, not ignored: the launcher starts with the default handlers
        code = _wait(subprocess.Popen(argv, cwd=study, stdin=subprocess.DEVNULL))
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    print(f"task {entry.index}: exit {code}", flush=True)
    return code


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m hpcopt.study.task INDEX LAUNCHER... (in the study directory)",
              file=sys.stderr)
        return 2
    try:
        return run_task(Path.cwd(), int(argv[0]), argv[1:])
    except HpcoptError as exc:
        print(f"hpcopt: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    import mpi4py

    mpi4py.rc.initialize = mpi4py.rc.finalize = False  # the readers import mpi4py; no MPI here
    sys.exit(main(sys.argv[1:]))
