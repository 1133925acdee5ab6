"""``hpcopt sweep --local -j K``: a study's tasks on this machine, K at a time.

Each task runs exactly as its array task would (``python -m hpcopt.study.task INDEX mpiexec -n
R``, in the study directory, output to ``logs/task-INDEX.log``; a task with ``--on-rank-loss
continue`` gets Open MPI's ``--with-ft ulfm`` from ``task.py``), so the run directories,
records and resume are the same as on a cluster: running the same study again resumes the
tasks that stopped and leaves the finished ones alone. A task finished when it exited 0, or 5
(the survivors of a lost rank finished it), and its run's trace holds the end-of-run record
(hpcopt.study.outcome: an exit 0 without it failed); the line of its end says so.

Each task runs in a session (a process group) of its own, so that a terminal's Ctrl-C reaches this
process only. SIGINT or SIGTERM stops the study: no task starts after it, the running tasks get the
signal (the first of each kind; SIGUSR1 under Open MPI, whose ``mpirun`` kills the ranks for the
other two), stop at a checkpoint and record it, and once they have ended this process exits 130
or 143 (128 + the signal, the higher where both came).

A task's log is written only as a regular file in the study's own ``logs/``: a symbolic link
(at the log's name or at ``logs/``), a FIFO or a device there is refused in one line (exit 2)
before any task starts; one planted while the study runs fails only the task it was for.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..comm.mpi_support import launcher_stop_signal
from ..errors import HpcoptError
from ..io import safe_files
from ..run.signals import exit_code, handled_by, signal_name
from .layout import LOGS, Entry, log_path, logs_folder
from .outcome import FINISHED, NO_END_RECORD, ended
from .task import finished

POLL_SECONDS = 0.2
LOG_KIND = "task log"


@dataclass
class _Running:
    entry: Entry
    process: subprocess.Popen
    log: IO[bytes]
    started: float


class _Stop:
    """The signals that stop the study, and the process groups of the running tasks they reach:
    launching and forwarding hold one lock, so no task starts after a signal or misses one."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.groups: set[int] = set()
        self._lock = threading.Lock()

    def receive(self, signum: int) -> None:
        with self._lock:
            if signum in self.received:
                return  # forwarded once: a second Ctrl-C would end mpiexec before its ranks
            self.received.append(signum)
            forwarded = launcher_stop_signal(signum)  # SIGUSR1 for Open MPI's mpirun
            for group in self.groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, forwarded)

    def launch(self, start: Callable[[], _Running]) -> _Running | None:
        """``start()``'s task, its group reached by the signals from now on; None once stopped."""
        with self._lock:
            if self.received:
                return None
            task = start()
            self.groups.add(task.process.pid)
            return task

    def ended(self, process: subprocess.Popen) -> None:
        with self._lock:
            self.groups.discard(process.pid)


def run_local(study: Path, entries: Sequence[Entry], jobs: int,
              launch: Callable[[Entry], list[str]] | None = None, ranks: int = 0) -> int:
    """Run ``entries`` of ``study``, ``jobs`` at a time (and, with ``ranks``, while their ranks
    add up to at most ``ranks``), each as ``launch(entry)`` (default: ``task_command``), with a
    line as each starts and ends; 0 when every task finished (exit 0, or 5 on the survivors of a
    lost rank, and its trace holds the end-of-run record), else 1 (the others are listed); 130
    or 143 when a signal stopped the study (see the module's docstring)."""
    _check_logs(study, entries)
    stop = _Stop()
    with handled_by(stop.receive):
        failed, not_started, start = _run(study, list(entries), Slots(jobs, ranks), stop,
                                          launch or task_command)
    total = len(entries)
    if stop.received:
        signum = max(stop.received)
        print(f"hpcopt: {signal_name(signum)}: stopped the study; {not_started} of {total} task(s) "
              f"not started (exit code {exit_code(signum)})", flush=True)
        return exit_code(signum)
    if failed:
        print(f"{len(failed)} of {total} task(s) did not finish: {'; '.join(failed)}", flush=True)
        return 1
    print(f"all {total} task(s) finished in {time.monotonic() - start:.0f} s", flush=True)
    return 0


def task_command(entry: Entry) -> list[str]:
    """How task ``entry`` runs here: as its array task would, under ``mpiexec -n R``."""
    return [sys.executable, "-m", "hpcopt.study.task", str(entry.index), "mpiexec", "-n", str(entry.ranks)]


def _lacks(run: Path) -> str:
    """What ``run`` lacks to have finished: "" when its trace holds the end-of-run record."""
    return "" if finished(run) else NO_END_RECORD


def _check_logs(study: Path, entries: Sequence[Entry]) -> None:
    """HpcoptError (one line, exit 2) before any task starts when ``logs/`` or a task's log is a
    symbolic link, a FIFO or anything else that is not a regular file (module docstring)."""
    with logs_folder(study / LOGS, create=True) as folder:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                safe_files.open_regular(log_path(study, entry.index), LOG_KIND, folder=folder).close()


@dataclass(frozen=True)
class Slots:
    """How many tasks run at once: at most ``tasks``, and (``ranks`` > 0) while their ranks add
    up to at most ``ranks`` (an allocation's tasks)."""

    tasks: int
    ranks: int = 0

    def free(self, running: Sequence[_Running], entry: Entry) -> bool:
        return len(running) < self.tasks and (
            not self.ranks or sum(t.entry.ranks for t in running) + entry.ranks <= self.ranks)


def _start(study: Path, entry: Entry, env: dict[str, str], command: list[str]) -> _Running:
    """Task ``entry`` in a session (so a process group) of its own, its output appended to its log."""
    path = log_path(study, entry.index)
    with logs_folder(path.parent, create=True) as folder:  # a planted link, at logs/ too, or FIFO: one line
        fd = safe_files.open_writable(path, LOG_KIND, create=True, folder=folder)
    os.lseek(fd, 0, os.SEEK_END)
    log = os.fdopen(fd, "wb")
    process = subprocess.Popen(command, cwd=study, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    return _Running(entry, process, log, time.monotonic())


def _run(study: Path, pending: list[Entry], slots: Slots, stop: _Stop,
         launch: Callable[[Entry], list[str]]) -> tuple[list[str], int, float]:
    """Run the tasks until every one has ended, or a signal stopped the launching and the running
    ones have ended; the failed tasks, the number not started and the start time."""
    from ..algorithms.registration import child_variables
    from ..child import child_environment
    from ..comm.mpi_support import singleton_environment

    env = child_environment(singleton_environment(), child_variables())  # tasks read configs
    running, failed = list[_Running](), list[str]()
    total, done, start = len(pending), 0, time.monotonic()
    while (pending and not stop.received) or running:
        while pending and slots.free(running, pending[0]):
            try:
                started = stop.launch(lambda: _start(study, pending[0], env, launch(pending[0])))
            except HpcoptError as exc:  # planted at its log since _check_logs: this task fails
                failed.append(f"task {pending.pop(0).index} (not started: {exc})")
                done += 1
                continue
            if started is None:
                break
            pending.pop(0)
            running.append(started)
            print(f"task {started.entry.index} started: {started.entry.run} on {started.entry.ranks} "
                  "rank(s)", flush=True)
        time.sleep(POLL_SECONDS)
        for task in [t for t in running if t.process.poll() is not None]:
            running.remove(task)
            stop.ended(task.process)
            task.log.close()
            done += 1
            code = task.process.returncode
            state, note = ended(code, functools.partial(_lacks, study / task.entry.run))
            note = note or f"exit {code}"
            if state != FINISHED:
                failed.append(f"task {task.entry.index} ({note}, "
                              f"{log_path(study, task.entry.index).relative_to(study)})")
            print(f"task {task.entry.index} ended ({note}) after "
                  f"{time.monotonic() - task.started:.1f} s; {done}/{total} done, "
                  f"{time.monotonic() - start:.0f} s so far", flush=True)
    return failed, len(pending), start
