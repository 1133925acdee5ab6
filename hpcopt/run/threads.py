"""Threads per rank: 1 BLAS/OpenMP thread per rank unless the user set a thread variable.

``mpiexec`` sets no thread counts, so N ranks on a node would each start one BLAS thread per
core and fight over the cores. hpcopt limits each rank to one thread through threadpoolctl at
start-up, and says how many a rank's share of the cores would be (``OMP_NUM_THREADS=K`` sets
them). Chosen from ``benchmarks/speed/blas_threads.py`` (docs/results/scaling.md, "BLAS threads
per rank"): on 2 cores shared with other jobs (load average 9-16) 2 threads per rank ran the
default job at 0.05-0.22x the steps/s of 1 thread, at 1 rank and at 2, batch 32 and 256; on the
idle machine a lone rank gained about 1.15x from its second thread. One thread is what holds
on a shared node; a rank that has its cores to itself gets more by asking.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS")


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str

    def describe(self) -> str:
        return f"{self.threads} BLAS thread(s) per rank ({self.reason})"


def available_cores() -> int:
    """Cores this process may run on (its affinity mask), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def user_thread_setting() -> tuple[str, int] | None:
    """The first thread variable the user set, with its value, if any."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return name, max(1, int(value))
            except ValueError:
                return name, 1
    return None


#: BLAS threads per rank when the user set none (module docstring).
DEFAULT_THREADS = 1


def threads_per_rank(cores: int, ranks_on_node: int) -> int:
    """A rank's share of the node's cores."""
    return max(1, cores // max(1, ranks_on_node))


def configure_threads(ranks_on_node: int) -> ThreadChoice:
    """Limit the rank to ``DEFAULT_THREADS`` (or respect the user's variable) and say what was
    chosen, with the rank's share of the cores where that is more."""
    user = user_thread_setting()
    if user is not None:
        name, value = user
        return ThreadChoice(value, f"set by the user: {name}={value}")
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=DEFAULT_THREADS)
    cores = available_cores()
    share = threads_per_rank(cores, ranks_on_node)
    more = f"; OMP_NUM_THREADS={share} would give each rank its share" if share > DEFAULT_THREADS else ""
    return ThreadChoice(DEFAULT_THREADS, f"hpcopt's default; {cores} core(s) / {ranks_on_node} rank(s) "
                                         f"on this node{more}")
