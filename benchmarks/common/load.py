"""A controlled load for benchmarks: a stated number of busy processes on the measurement's cores.

Users train on shared, busy nodes (the rank's own data loading, other jobs on the same cores), so
a benchmark that compares rounds measures them idle and under a known load, and states the load of
each figure. ``busy(n)`` starts ``n`` processes that spin on the cores this process may run on
(their affinity is inherited) for as long as its ``with`` block lasts::

    with busy(2) as load:
        ...measure...
    print(load.describe())    # "2 busy processes, load average 3.41 at the end"

They stop surely: the block's exit (also on an exception or Ctrl-C) terminates and reaps them,
``atexit`` does so for an interpreter that exits otherwise, and each of them also ends by itself
within about a tenth of a second once its parent is gone (a SIGKILL of the benchmark included),
since it checks its parent between bursts of spinning.

Command line options: ``add_load_option`` gives a script ``--load N [N ...]`` (default: 0 and 2,
idle and under two busy processes), one measurement per level.
"""

from __future__ import annotations

import argparse
import atexit
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

#: What a busy process runs: spin, and end once the parent that started it (its argument: a
#: parent gone before it started is noticed too) has gone.
SPIN = ("import os, sys\n"
        "parent = int(sys.argv[1])\n"
        "while os.getppid() == parent:\n"
        "    for _ in range(200_000):\n"
        "        pass\n")
#: The load levels a script measures by default: idle, and two busy processes.
DEFAULT_LEVELS = (0, 2)


@dataclass
class Load:
    """The load of one measurement: ``processes`` busy processes, and the machine's 1-minute load
    average when it started and when it ended (``os.getloadavg``: every runnable process counts,
    the measurement's own and other users' too)."""

    processes: int
    load_before: float = field(default_factory=lambda: os.getloadavg()[0])
    load_after: float | None = None

    def describe(self) -> str:
        """The load as a table cell or a sentence states it."""
        plural = "es" if self.processes > 1 else ""
        busy_text = "idle" if self.processes == 0 else f"{self.processes} busy process{plural}"
        after = self.load_before if self.load_after is None else self.load_after
        return f"{busy_text}, load average {after:.2f} at the end"

    def as_dict(self) -> dict[str, float | int | None]:
        return {"busy": self.processes, "load_before": self.load_before, "load_after": self.load_after}


def start_busy(processes: int) -> list[subprocess.Popen]:
    """Start ``processes`` spinning processes (see the module docstring); the caller stops them
    with ``stop_busy``."""
    if processes < 0:
        raise ValueError(f"the number of busy processes must be >= 0, got {processes}")
    started: list[subprocess.Popen] = []
    try:
        for _ in range(processes):
            started.append(subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
    except BaseException:
        stop_busy(started)
        raise
    return started


def stop_busy(started: list[subprocess.Popen], grace: float = 2.0) -> None:
    """Terminate the busy processes, kill any still there after ``grace`` seconds, and reap them."""
    for process in started:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace
    for process in started:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def busy(processes: int) -> Iterator[Load]:
    """``processes`` busy processes for the duration of the ``with`` block; its ``Load`` (the load
    average at the end is filled in as the block ends, before they stop)."""
    load = Load(processes)
    started = start_busy(processes)

    def stop() -> None:
        stop_busy(started)

    atexit.register(stop)
    try:
        if started:
            time.sleep(0.2)  # running, not still starting the interpreter, when the block starts
        yield load
    finally:
        load.load_after = os.getloadavg()[0]
        stop()
        atexit.unregister(stop)


def add_load_option(parser: argparse.ArgumentParser) -> None:
    """``--load N [N ...]``: the busy processes of each measurement (``busy``)."""
    parser.add_argument("--load", type=int, nargs="+", default=list(DEFAULT_LEVELS), metavar="N",
                        help="measure once per level with N busy processes on the same cores (0: idle); "
                             f"default {' '.join(map(str, DEFAULT_LEVELS))}")
