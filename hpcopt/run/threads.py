"""Threads per rank: BLAS/OpenMP threads = cores available per rank on the node.

``mpiexec`` sets no thread counts, so N ranks on a node each start one BLAS thread per core and
fight over the cores (measured: 2 ranks x 2 threads on 2 cores ran an MLP step 27-40x slower
than 2 ranks x 1 thread). Unless the user set a thread variable, hpcopt limits each rank to
``max(1, cores // ranks_on_node)`` threads through threadpoolctl at start-up.
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


def threads_per_rank(cores: int, ranks_on_node: int) -> int:
    return max(1, cores // max(1, ranks_on_node))


def configure_threads(ranks_on_node: int) -> ThreadChoice:
    """Apply the threads-per-rank rule (or respect the user's variable) and say what was chosen."""
    user = user_thread_setting()
    if user is not None:
        name, value = user
        return ThreadChoice(value, f"set by the user: {name}={value}")
    cores = available_cores()
    threads = threads_per_rank(cores, ranks_on_node)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)
    return ThreadChoice(threads, f"{cores} core(s) / {ranks_on_node} rank(s) on this node")
