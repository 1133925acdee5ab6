"""One task of a study: ``python -m hpcopt.study.task INDEX LAUNCHER...``, in the study directory.

The job array runs it as task INDEX (``SLURM_ARRAY_TASK_ID``, ``PBS_ARRAY_INDEX``), and
``hpcopt sweep --local`` the same way. It reads line INDEX of ``manifest.tsv`` and runs, under
LAUNCHER (``srun ...`` or ``mpiexec -n R``), with this Python:

- nothing, when the run directory holds a finished trace (a resubmitted task);
- ``hpcopt resume RUN`` when it holds checkpoints (a requeued task continues where it stopped),
  with ``--ranks-changed`` when LAUNCHER starts another number of ranks than wrote the newest
  checkpoint (a task requeued onto fewer or more nodes);
- ``hpcopt train OPTIONS --out RUN`` otherwise, with ``TASK_DEFAULTS`` for what OPTIONS leave out.

A task with ``--on-rank-loss continue`` goes on without a lost rank only under Open MPI's ULFM:
an Open MPI ``mpiexec`` or ``mpirun`` LAUNCHER gets ``--with-ft ulfm`` (unless it has it); any
other launcher runs as given, and the run says in one line why it cannot continue.

While the run goes, the task's record (``logs/task-INDEX.json``) is locked; at the end it
gets the exit status, which is also this process's: the launcher's, but 1 where it said 0 (or 5)
and the run's trace holds no end-of-run record.

Stop signals: LAUNCHER runs in a session of its own, and this process passes the first SIGTERM,
SIGINT or SIGUSR1 of each kind on to it (``scancel --signal=USR1 --batch`` reaches only the batch
shell, which this process is; a group signal from ``sweep --local`` or a terminal reaches only
this process, so a launcher never gets one twice): SIGINT as SIGTERM to ``srun`` (whose first
SIGINT only reports status), SIGUSR1 for SIGTERM or SIGINT to Open MPI's ``mpirun``. A signal
before the launcher starts stops the task before it starts (exit 143 or 130, nothing lost), and
so does one that the launcher reports killed a process (the launcher itself, or a rank that had
not reached hpcopt's first line: ``_Forward.killed_before_start``).
Slurm's own ``--signal=TERM@N`` and ``scancel --signal`` reach the ranks directly.

``--requeue N`` (the Slurm arrays): a run that stopped at a checkpoint (exit 143) or lost a rank
or node (any exit but ``FINAL_EXITS``) requeues its job (``scontrol requeue``) while the job
still runs (not after ``scancel``) and has been requeued fewer than N times
(``SLURM_RESTART_COUNT``); finished runs, bad input (2) and NaN (3) are final. Each attempt's
first line names it.
"""

from __future__ import annotations

import signal

#: The stop signals that came before ``run_task`` took them over: ``python -m hpcopt.study.task``
#: notes them from its first line, before its imports (half a second on a loaded node, in which
#: a batch shell's SIGUSR1 once killed it), and ``run_task`` acts on them.
EARLY: list[int] = []
if __name__ == "__main__":
    for _signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):  # run.signals.SIGNALS, not yet imported
        signal.signal(_signum, lambda signum, _: EARLY.append(signum))

import contextlib  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from ..errors import EXIT_CONTINUED, HpcoptError  # noqa: E402
from ..run.signals import SIGNALS, exit_code, signal_name  # noqa: E402
from .layout import Entry, TaskRecord, read_manifest  # noqa: E402

#: A run stopped at a checkpoint by SIGTERM (or SIGUSR1): hpcopt's exit status, and srun's.
EXIT_STOPPED = exit_code(signal.SIGTERM)
#: hpcopt's exits of a run stopped by a signal (SIGTERM or SIGUSR1, SIGINT).
STOP_EXITS = (EXIT_STOPPED, exit_code(signal.SIGINT))
#: What a study's run does unless its sweep file says otherwise (flag: value, and the flags that
#: stand in for it): a collective stuck 300 s (a node lost without an MPI error: its link cut, its
#: power gone) ends the job, with a line naming the ranks, instead of waiting minutes for the
#: scheduler to declare the node down (hpcopt.run.watchdog) ...
TASK_DEFAULTS = {"--stall-timeout": ("300", ()),
                 # and a checkpoint every 10 minutes of wall time, unless it checkpoints already:
                 # a lost node, rank 0 or an Open MPI Ctrl-C then costs at most that much
                 "--checkpoint-minutes": ("10", ("--checkpoint-every",))}
#: Exits a requeue cannot mend: finished (0; 5 on the survivors of a lost rank), bad input (2),
#: NaN or Inf (3). Any other (143: stopped at a checkpoint; a lost rank or node: 1, 4, 6 or the
#: launcher's own code) requeues a task that may be requeued.
FINAL_EXITS = (0, EXIT_CONTINUED, 2, 3)
#: This process's exit when the launcher said 0 (or 5) but the run's trace holds no end-of-run
#: record (MPICH's Hydra can exit 0 after a double Ctrl-C): not finished, so it may be requeued.
UNFINISHED = 1


def finished(run: Path) -> bool:
    """Whether ``run`` holds a trace with its end-of-run summary (read in a child first)."""
    from ..io.trace import FILE_NAME, Trace
    from ..report import read_each

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
    train = [*hpcopt, "train", *task_defaults(entry.args), *entry.args, "--out", entry.run.as_posix()]
    if not run.exists():  # a first start: nothing to read (and no reader to import)
        return train
    from ..run.directory import has_checkpoints

    if finished(run):
        return None
    if not has_checkpoints(run):
        return train
    changed = ["--ranks-changed"] if _ranks_changed(run, launcher) else []
    return [*hpcopt, "resume", entry.run.as_posix(), *changed, *_named_model(entry.args)]


def task_defaults(args: Sequence[str]) -> list[str]:
    """The flags of ``TASK_DEFAULTS`` that the task's own ``args`` do not set (nor a flag that
    stands in for one)."""
    given = set(args[::2])
    return [part for flag, (value, instead) in TASK_DEFAULTS.items()
            if flag not in given and given.isdisjoint(instead) for part in (flag, value)]


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
    ``--ranks-changed``. The checkpoint is read in a child first (hpcopt.run.vetting); one that
    cannot be read is left to ``hpcopt resume`` to report."""
    from ..io.data_parallel_checkpoint import checkpoint_world_size
    from ..run.vetting import vet_checkpoint

    ranks = launched_ranks(launcher)
    try:
        return ranks is not None and checkpoint_world_size(vet_checkpoint(run)) != ranks
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


class _Forward:
    """The stop signals this process receives, passed on to the launcher once it runs (the
    first of each kind; see the module docstring)."""

    def __init__(self, launcher: Sequence[str]) -> None:
        self.srun = bool(launcher) and Path(launcher[0]).name == "srun"
        self.received: list[int] = []
        self.passed: list[tuple[int, int]] = []  # (received, the signal sent the launcher for it)
        self.process: subprocess.Popen | None = None

    def receive(self, signum: int, frame: object = None) -> None:
        if signum not in self.received:
            self.received.append(signum)
            self._pass_on(signum)

    def started(self, process: subprocess.Popen) -> None:
        self.process = process
        for signum in self.received:  # one that came while it was being started
            self._pass_on(signum)

    def _pass_on(self, signum: int) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if self.srun:
            forwarded = signal.SIGTERM if signum == signal.SIGINT else signum
        else:
            from ..comm.mpi_support import launcher_stop_signal

            forwarded = launcher_stop_signal(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, forwarded)
            self.passed.append((signum, forwarded))

    def killed_before_start(self, code: int) -> int | None:
        """The stop signal received whose passing on ended the run before hpcopt took it over, as
        the launcher's exit ``code`` says; None where it says otherwise. hpcopt takes the stop
        signals over from the first line of ``python -m hpcopt``, so a process that died of one
        had not reached it, and nothing of this attempt was written (docs/failures.md,
        "Launchers"). A launcher reports that death as 128 + the signal (itself killed by it; a
        rank under Open MPI's ``mpirun``) or as the signal | 9 (a rank under MPICH's Hydra, which
        ORs its ranks' statuses, its SIGKILL of the others included); hpcopt's own stop codes
        (143, 130) keep their meaning."""
        for received, forwarded in self.passed:
            if code in (128 + forwarded, forwarded | signal.SIGKILL) and code not in STOP_EXITS:
                return received
        return None


def run_task(study: Path, index: int, launcher: Sequence[str], requeue: int = 0) -> int:
    """Run task ``index`` of ``study`` under ``launcher``, recording it, and requeue its Slurm
    job where it may be (``requeue``: see ``requeue_job``); its exit status. A stop signal
    until the end, the requeue included, is taken as the launcher's (never this process's end)."""
    entries = read_manifest(study)
    if not 0 <= index < len(entries):
        raise HpcoptError(f"task {index} is not in {study}/manifest.tsv (tasks 0 to {len(entries) - 1})")
    forward = _Forward(launcher)
    previous = {s: signal.signal(s, forward.receive) for s in SIGNALS}
    for signum in tuple(EARLY):  # one that came while the handlers were being installed: noted twice
        forward.receive(signum)
    try:
        record = TaskRecord(study, entries[index])
        record.start()
        code = 1
        try:
            code = _carry_on(study, entries[index], launcher, forward)
        except HpcoptError:
            code = 2
            raise
        finally:
            record.end(code)
        if requeue:
            requeue_job(f"task {index}", code, requeue, signal.SIGTERM in forward.received)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    return code


def _carry_on(study: Path, entry: Entry, launcher: Sequence[str], forward: _Forward) -> int:
    print(f"task {entry.index}: {attempt()}", flush=True)
    argv = command(study, entry, launcher)
    if argv is None:
        print(f"task {entry.index}: {entry.run} has finished; nothing to do", flush=True)
        return 0
    if forward.received:
        signum = forward.received[0]
        print(f"task {entry.index}: {signal_name(signum)} before the run started; stopped, nothing "
              "lost", flush=True)
        return exit_code(signum)
    print(f"task {entry.index}: {' '.join(argv)}", flush=True)
    process = subprocess.Popen(argv, cwd=study, stdin=subprocess.DEVNULL, start_new_session=True)
    forward.started(process)
    code = _wait(process)
    print(f"task {entry.index}: exit {code}", flush=True)
    stopped = forward.killed_before_start(code)
    if stopped is not None:
        print(f"task {entry.index}: {signal_name(stopped)} killed a process of the run before hpcopt "
              f"started; stopped, nothing lost (exit {exit_code(stopped)})", flush=True)
        return exit_code(stopped)
    if code in (0, EXIT_CONTINUED) and not finished(study / entry.run):
        print(f"task {entry.index}: the run has no end-of-run record, so it did not finish whatever "
              f"its launcher says (exit {UNFINISHED})", flush=True)
        return UNFINISHED
    return code


def attempt() -> str:
    """Which attempt this is, where: the Slurm job and how often it was requeued, the host."""
    host = socket.gethostname()
    job = slurm_job()
    return f"attempt {_requeued() + 1} (Slurm job {job}) on {host}" if job else f"started on {host}"


def _requeued() -> int:
    """How often Slurm has requeued this job (``SLURM_RESTART_COUNT``; 0 when unset)."""
    count = os.environ.get("SLURM_RESTART_COUNT", "")
    return int(count) if count.isdigit() else 0


def slurm_job() -> str:
    """The Slurm job this task is ("ARRAY_TASK" for an array's task; "" outside Slurm)."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID", ""), os.environ.get("SLURM_ARRAY_TASK_ID", "")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")


def requeue_job(who: str, code: int, most: int, terminated: bool) -> None:
    """Requeue this Slurm job (``scontrol requeue``) after exit ``code`` unless the code is final
    (``FINAL_EXITS``), the job was cancelled, or it was requeued ``most`` times already; a line
    says which. ``who`` names the task (or the packed allocation) in that line.

    A job still RUNNING is requeued. One COMPLETING is requeued only when this process got no
    SIGTERM (``terminated``): ``scancel JOB`` sends the batch shell SIGTERM and leaves the job
    COMPLETING, which must not be undone; Slurm's own node failure handling (COMPLETING, no
    SIGTERM here) and the time limit's ``--signal`` (to the steps) may be."""
    job = slurm_job()
    if not job or code in FINAL_EXITS:
        return
    done = _requeued()
    why = f"exit {code}" + (" (stopped at a checkpoint)" if code == EXIT_STOPPED else "")
    state = _job_state(job)
    if not (state == "RUNNING" or (state == "COMPLETING" and not terminated)):
        print(f"{who}: {why}; not requeued: the job is {state or 'not known to squeue'} "
              "(cancelled, or Slurm requeues it itself)", flush=True)
        return
    if done >= most:
        print(f"{who}: {why}; not requeued: requeued {done} time(s) already, the most [job] requeue "
              "allows", flush=True)
        return
    print(f"{who}: {why}; requeueing Slurm job {job} (requeue {done + 1} of at most {most})", flush=True)
    try:
        failed = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True).returncode
    except OSError as exc:
        failed, reason = 1, str(exc)
    else:
        reason = "scontrol requeue failed"
    if failed:
        print(f"{who}: not requeued: {reason}; submit the script again to resume", flush=True)


def _job_state(job: str) -> str:
    """``job``'s state as squeue tells it ("" when it cannot)."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


USAGE = "usage: python -m hpcopt.study.task INDEX [--requeue N] LAUNCHER... (in the study directory)"


def requeue_option(argv: list[str]) -> tuple[int, list[str]] | None:
    """``--requeue N`` at the head of ``argv``: (N, the rest); (0, argv) without it; None when N
    is not a count."""
    if argv[:1] != ["--requeue"]:
        return 0, argv
    if len(argv) < 2 or not argv[1].isdigit():
        return None
    return int(argv[1]), argv[2:]


def main(argv: list[str]) -> int:
    parsed = requeue_option(argv[1:])
    if parsed is None or not parsed[1] or not argv[0].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    requeue, launcher = parsed
    try:
        return run_task(Path.cwd(), int(argv[0]), launcher, requeue)
    except HpcoptError as exc:
        print(f"hpcopt: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    import mpi4py

    mpi4py.rc.initialize = mpi4py.rc.finalize = False  # the readers import mpi4py; no MPI here
    sys.exit(main(sys.argv[1:]))
