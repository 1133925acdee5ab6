"""A small serial float64 reference of the algorithms: N workers simulated in one process.

It shares the gradient oracles (whose gradients are checked against finite differences in
tests/unit) and the data order with the distributed code, but implements each update rule on
its own, in the plainest form, from ALGORITHMS.md.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np

from hpcopt.algorithms.schedules import Schedule
from hpcopt.build import build_run
from hpcopt.rng import stream


def options_of(schedule: Schedule) -> dict:
    """The step-size options of an algorithm class that give ``schedule``."""
    return {"lr": schedule.lr, "schedule": schedule.kind, "decay": schedule.decay,
            "milestones": schedule.milestones}


def worker_parts(config, workers: int):
    """The RunParts of every rank 0..N-1, built on the CPU (whatever the config's device) and
    without MPI (a stand-in comm gives rank/size)."""
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, device="cpu"))
    return [build_run(config, SimpleNamespace(rank=i, size=workers)) for i in range(workers)]


def prsgd_reference(config, workers: int) -> np.ndarray:
    """Final averaged model of PR-SGD, serially: local (momentum) steps, mean every I_i steps.
    For SlowMo (``--algorithm slowmo``), each mean is followed by the slow step from the round's
    start: u <- beta u + (x_start - mean) / eta, x_start <- x_start - alpha eta u."""
    parts = worker_parts(config, workers)
    algo = config.algorithm
    schedule = parts[0].algorithm.lr_at
    intervals = list(algo.local_steps) or [algo.interval] * workers
    x = [p.workload.x0.astype(np.float64).copy() for p in parts]
    b = [np.zeros_like(x[0]) for _ in parts]
    steps = [p.local_steps for p in parts]
    done = [0] * workers
    total_rounds = parts[0].total_steps // algo.interval
    g = np.zeros_like(x[0])
    anchor, slow = x[0].copy(), np.zeros_like(x[0])

    def local_step(i):
        parts[i].workload.problem.oracle(x[i], g)
        if algo.momentum:
            b[i] = algo.momentum * b[i] + g
            d = g + algo.momentum * b[i] if algo.nesterov else b[i]
        else:
            d = g
        x[i] = x[i] - schedule(done[i]) * d
        done[i] += 1

    for r in range(total_rounds):
        for i in range(workers):
            for _ in range(intervals[i]):
                local_step(i)
        mean = sum(x) / workers
        if algo.algorithm == "slowmo":
            eta = schedule((r + 1) * algo.interval - 1)
            slow = algo.slow_momentum * slow + (anchor - mean) / eta
            anchor = anchor - algo.slow_lr * eta * slow
            mean = anchor.copy()
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
    schedule = parts[0].algorithm.lr_at
    x = parts[0].workload.x0.astype(np.float64).copy()
    g = np.zeros_like(x)
    for t in range(parts[0].total_steps):
        mean = np.zeros_like(x)
        for p in parts:
            p.workload.problem.oracle(x, g)
            mean += g
        x = x - schedule(t) * mean / workers
    return x


def _clipped_steps(x, grads, norms, b, t, lr, gamma, base_lr, momentum, nesterov, weight_decay):
    """One clipped (momentum) step on each model: x <- x - min(eta_t, gamma_t/(n + 1e-10)) d,
    gamma_t = gamma * eta_t / base_lr (gamma decays with the learning rate).

    The norm is taken on the raw gradient; weight decay and momentum shape only the direction.
    Returns the new models, the new momentum buffers and whether each step was clipped.
    """
    eta = lr(t)
    gamma_t = gamma * eta / base_lr
    new_x, new_b, clipped = [], [], []
    for xi, gi, ni, bi in zip(x, grads, norms, b):
        d = gi + weight_decay * xi
        if momentum:
            bi = momentum * bi + d
            d = d + momentum * bi if nesterov else bi
        size = min(eta, gamma_t / (ni + 1e-10))
        new_x.append(xi - size * d)
        new_b.append(bi)
        clipped.append(size < eta)
    return new_x, new_b, clipped


def celgc_reference(x0, oracles, steps, interval, lr, gamma, base_lr, momentum=0.0,
                    nesterov=False, weight_decay=0.0, momentum_policy="keep", participation=1.0,
                    seed=0, clip_norm="local"):
    """CELGC with N = len(oracles) simulated workers; ``lr(t)`` is eta_t.

    Every step t: if t % I == 0, every model (and with policy "average" every momentum buffer)
    becomes the mean over this round's participants S_r (all workers, or ceil(p N) of them drawn
    by ``stream(seed, "participation", r).choice(N, k, replace=False)``); "reset" zeroes the
    buffers. Then each worker takes its own clipped step. Returns (the N models after T steps,
    the N counts of clipped steps).
    """
    workers = len(oracles)
    x = [np.array(x0, dtype=np.float64) for _ in range(workers)]
    b = [np.zeros_like(x[0]) for _ in range(workers)]
    counts = [0] * workers
    for t in range(steps):
        if t % interval == 0:
            members = list(range(workers))
            if participation < 1:
                k = math.ceil(round(participation * workers, 9))
                draw = stream(seed, "participation", t // interval)
                members = draw.choice(workers, k, replace=False)
            mean = sum(x[j] for j in members) / len(members)
            x = [mean.copy() for _ in range(workers)]
            if momentum_policy == "average":
                mean_b = sum(b[j] for j in members) / len(members)
                b = [mean_b.copy() for _ in range(workers)]
            elif momentum_policy == "reset":
                b = [np.zeros_like(bi) for bi in b]
        grads = []
        for i in range(workers):
            g = np.zeros_like(x[i])
            oracles[i](x[i], g)
            grads.append(g)
        norms = [float(np.sqrt(np.sum(g * g))) for g in grads]
        if clip_norm == "global":
            norms = [math.sqrt(sum(n * n for n in norms) / workers)] * workers
        x, b, clipped = _clipped_steps(x, grads, norms, b, t, lr, gamma, base_lr, momentum,
                                       nesterov, weight_decay)
        counts = [c + k for c, k in zip(counts, clipped)]
    return x, counts


def naive_clip_reference(x0, oracles, steps, lr, gamma, base_lr, momentum=0.0, nesterov=False,
                         weight_decay=0.0):
    """Naive parallel clipping: one model; each step g = mean_i g_i(x), one clipped step on g.
    Returns (the model after T steps, the number of clipped steps)."""
    x = np.array(x0, dtype=np.float64)
    b = np.zeros_like(x)
    count = 0
    for t in range(steps):
        mean = np.zeros_like(x)
        for oracle in oracles:
            g = np.zeros_like(x)
            oracle(x, g)
            mean += g / len(oracles)
        (x,), (b,), (clipped,) = _clipped_steps([x], [mean], [float(np.sqrt(np.sum(mean * mean)))],
                                                [b], t, lr, gamma, base_lr, momentum, nesterov,
                                                weight_decay)
        count += clipped
    return x, count


__all__ = ["prsgd_reference", "minibatch_sgd_reference", "worker_parts", "celgc_reference",
           "naive_clip_reference"]
