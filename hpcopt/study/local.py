"""``hpcopt sweep --local -j K``: a study's tasks on this machine, K at a time.

Each task runs exactly as its array task would (``python -m hpcopt.study.task INDEX mpiexec -n
R``, in the study directory, output to ``logs/task-INDEX.log``), so the run directories,
records and resume are the same as on a cluster: running the same study again resumes the
tasks that stopped and leaves the finished ones alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .layout import Entry, log_path

POLL_SECONDS = 0.2


@dataclass
class _Running:
    entry: Entry
    process: subprocess.Popen
    log: IO[bytes]
    started: float


def run_local(study: Path, entries: Sequence[Entry], jobs: int) -> int:
    """Run ``entries`` of ``study``, ``jobs`` at a time, with a line as each starts and ends;
    0 when every task exited 0, else 1 (the failed tasks are listed)."""
    from ..child import child_environment

    env = child_environment()
    pending, running, failed = list(entries), list[_Running](), list[str]()
    total, done, start = len(pending), 0, time.monotonic()
    try:
        while pending or running:
            while pending and len(running) < jobs:
                entry = pending.pop(0)
                log_path(study, entry.index).parent.mkdir(parents=True, exist_ok=True)
                log = open(log_path(study, entry.index), "wb")
                command = [sys.executable, "-m", "hpcopt.study.task", str(entry.index),
                           "mpiexec", "-n", str(entry.ranks)]
                process = subprocess.Popen(command, cwd=study, env=env, stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                running.append(_Running(entry, process, log, time.monotonic()))
                print(f"task {entry.index} started: {entry.run} on {entry.ranks} rank(s)", flush=True)
            time.sleep(POLL_SECONDS)
            for task in [t for t in running if t.process.poll() is not None]:
                running.remove(task)
                task.log.close()
                done += 1
                code = task.process.returncode
                if code != 0:
                    failed.append(f"task {task.entry.index} (exit {code}, "
                                  f"{log_path(study, task.entry.index).relative_to(study)})")
                print(f"task {task.entry.index} ended (exit {code}) after "
                      f"{time.monotonic() - task.started:.1f} s; {done}/{total} done, "
                      f"{time.monotonic() - start:.0f} s so far", flush=True)
    except KeyboardInterrupt:  # the tasks got the SIGINT too: let them record how they ended
        for task in running:
            task.process.wait()
            task.log.close()
        raise
    if failed:
        print(f"{len(failed)} of {total} task(s) did not exit 0: {'; '.join(failed)}", flush=True)
        return 1
    print(f"all {total} task(s) exited 0 in {time.monotonic() - start:.0f} s", flush=True)
    return 0
