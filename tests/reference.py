"""A small serial float64 reference of the algorithms: N workers simulated in one process.

It shares the gradient oracles (whose gradients are checked against finite differences in
tests/unit) and the data order with the distributed code, but implements each update rule on
its own, in the plainest form, from ALGORITHMS.md.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from hpcopt.build import build_run


def worker_parts(config, workers: int):
    """The RunParts of every rank 0..N-1, built without MPI (a stand-in comm gives rank/size)."""
    return [build_run(config, SimpleNamespace(rank=i, size=workers)) for i in range(workers)]


def prsgd_reference(config, workers: int) -> np.ndarray:
    """Final averaged model of PR-SGD, serially: local (momentum) steps, mean every I_i steps."""
    parts = worker_parts(config, workers)
    algo = config.algorithm
    schedule = parts[0].algorithm.schedule
    intervals = list(algo.local_steps) or [algo.interval] * workers
    x = [p.x0.astype(np.float64).copy() for p in parts]
    b = [np.zeros_like(x[0]) for _ in parts]
    steps = [p.local_steps for p in parts]
    done = [0] * workers
    total_rounds = parts[0].total_steps // algo.interval
    g = np.zeros_like(x[0])

    def local_step(i):
        parts[i].problem.oracle(x[i], g)
        if algo.momentum:
            b[i] = algo.momentum * b[i] + g
            d = g + algo.momentum * b[i] if algo.nesterov else b[i]
        else:
            d = g
        x[i] = x[i] - schedule(done[i]) * d
        done[i] += 1

    for _ in range(total_rounds):
        for i in range(workers):
            for _ in range(intervals[i]):
                local_step(i)
        mean = sum(x) / workers
        x = [mean.copy() for _ in range(workers)]
        if algo.momentum and algo.momentum_policy == "average":
            mb = sum(b) / workers
            b = [mb.copy() for _ in range(workers)]
        elif algo.momentum and algo.momentum_policy == "reset":
            b = [np.zeros_like(mb_) for mb_ in b]
    for i in range(workers):
        while done[i] < steps[i]:
            local_step(i)
    return sum(x) / workers


def minibatch_sgd_reference(config, workers: int) -> np.ndarray:
    """Parallel mini-batch SGD: x <- x - lr * mean_i g_i(x), one common model."""
    parts = worker_parts(config, workers)
    schedule = parts[0].algorithm.schedule
    x = parts[0].x0.astype(np.float64).copy()
    g = np.zeros_like(x)
    for t in range(parts[0].total_steps):
        mean = np.zeros_like(x)
        for p in parts:
            p.problem.oracle(x, g)
            mean += g
        x = x - schedule(t) * mean / workers
    return x


__all__ = ["prsgd_reference", "minibatch_sgd_reference", "worker_parts"]
