"""A small serial float64 reference of the algorithms: N workers simulated in one process.

It shares the gradient oracles (whose gradients are checked against finite differences in
tests/unit) and the data order with the distributed code, but implements each update rule on
its own, in the plainest form, from ALGORITHMS.md: the inner optimizers (sgd with momentum,
adamw) in ``Worker``, what a round does to their state in ``round_policies``, the outer
optimizers in ``Outer``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class InnerOptions:
    """The inner optimizer: sgd (momentum mu, nesterov) or adamw, weight decay, and what a round
    does to its state (momentum_policy: b or m; second_moment_policy: v)."""

    inner_optimizer: str = "sgd"
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    momentum_policy: str = "keep"
    second_moment_policy: str = "keep"

    @classmethod
    def of(cls, options) -> InnerOptions:
        """From an object with these attributes (a config's [algorithm] section)."""
        return cls(**{f.name: getattr(options, f.name, f.default) for f in dataclasses.fields(cls)})


def orthogonalized(d):
    """Muon's quintic Newton-Schulz iteration (Jordan et al. 2024), five steps, plainly."""
    a, b, c = 3.4445, -4.7750, 2.0315
    if d.shape[0] > d.shape[1]:
        return orthogonalized(d.T).T
    X = d / (np.sqrt(np.sum(d * d)) + 1e-7)
    for _ in range(5):
        A = X @ X.T
        X = a * X + b * A @ X + c * A @ A @ X
    return X


class Worker:
    """One worker's inner optimizer state, plainly: sgd's (and muon's) b, adamw's m and v, and
    the steps each of adamw's moments has accumulated since it was last zeroed; ``shapes``: the
    parameters' (muon orthogonalises the 2-D ones)."""

    def __init__(self, x, options: InnerOptions, shapes=()):
        self.options, self.shapes = options, shapes
        self.b, self.m, self.v = (np.zeros_like(x) for _ in range(3))
        self.k1 = self.k2 = 0

    def step(self, x, g, lr):
        """x after one inner step with step size lr from the gradient g."""
        o = self.options
        if o.inner_optimizer == "adamw":
            self.k1, self.k2 = self.k1 + 1, self.k2 + 1
            x = x * (1 - lr * o.weight_decay)
            self.m = o.adam_beta1 * self.m + (1 - o.adam_beta1) * g
            self.v = o.adam_beta2 * self.v + (1 - o.adam_beta2) * g * g
            m_hat = self.m / (1 - o.adam_beta1 ** self.k1)
            v_hat = self.v / (1 - o.adam_beta2 ** self.k2)
            return x - lr * m_hat / (np.sqrt(v_hat) + o.adam_eps)
        if o.inner_optimizer == "muon":
            x = x * (1 - lr * o.weight_decay)
            d = g
            if o.momentum:
                self.b = o.momentum * self.b + g
                d = g + o.momentum * self.b if o.nesterov else self.b
            pieces, start = [], 0
            for shape in self.shapes:
                piece = d[start:start + math.prod(shape)]
                if len(shape) == 2:
                    scale = math.sqrt(max(1, shape[0] / shape[1]))
                    piece = (orthogonalized(piece.reshape(shape)) * scale).ravel()
                pieces.append(piece)
                start += math.prod(shape)
            return x - lr * np.concatenate(pieces)
        d = g + o.weight_decay * x
        if o.momentum:
            self.b = o.momentum * self.b + d
            d = d + o.momentum * self.b if o.nesterov else self.b
        return x - lr * d


def round_policies(workers, members=None):
    """At a round: each moment kept, averaged over ``members`` (all workers by default) or
    zeroed, by its policy (b and m: momentum_policy; v: second_moment_policy); a zeroed adamw
    moment starts counting its steps again."""
    members = list(range(len(workers))) if members is None else list(members)
    options = workers[0].options
    for names, count, policy in ((("b", "m"), "k1", options.momentum_policy),
                                 (("v",), "k2", options.second_moment_policy)):
        for name in names:
            if policy == "average":
                mean = sum(getattr(workers[j], name) for j in members) / len(members)
                for w in workers:
                    setattr(w, name, mean.copy())
            elif policy == "reset":
                for w in workers:
                    setattr(w, name, np.zeros_like(getattr(w, name)))
                    setattr(w, count, 0)


class Outer:
    """The outer optimizer on the pseudo-gradient Delta = anchor - mean (average | sgd | nesterov
    | slowmo | fedadam | fedyogi), with its momentum buffer (fedadam, fedyogi: its moments m, v
    from 0 and tau^2, beta1 = momentum; Reddi et al. 2021, Algorithm 2)."""

    def __init__(self, x0, kind="average", lr=1.0, momentum=0.0, beta2=0.99, tau=1e-3):
        self.kind, self.lr, self.momentum, self.beta2, self.tau = kind, lr, momentum, beta2, tau
        self.anchor, self.buffer = x0.copy(), np.zeros_like(x0)
        self.v = np.full_like(x0, tau * tau)

    @classmethod
    def of(cls, x0, options) -> Outer:
        """The outer optimizer of a config's [algorithm] section (slowmo: its slow options)."""
        if options.algorithm == "slowmo":
            return cls(x0, "slowmo", options.slow_lr, options.slow_momentum)
        return cls(x0, options.outer_optimizer, options.outer_lr, options.outer_momentum,
                   options.outer_beta2, options.outer_tau)

    def step(self, mean, eta):
        """The model every worker continues from after a round whose average is ``mean``;
        eta: the base step size at the round's last step (slowmo)."""
        delta = self.anchor - mean
        if self.kind == "average":
            return mean.copy()
        if self.kind in ("fedadam", "fedyogi"):
            self.buffer = self.momentum * self.buffer + (1 - self.momentum) * delta
            if self.kind == "fedadam":
                self.v = self.beta2 * self.v + (1 - self.beta2) * delta ** 2
            else:
                self.v = self.v - (1 - self.beta2) * delta ** 2 * np.sign(self.v - delta ** 2)
            self.anchor = self.anchor - self.lr * self.buffer / (np.sqrt(self.v) + self.tau)
        elif self.kind == "slowmo":
            self.buffer = self.momentum * self.buffer + delta / eta
            self.anchor = self.anchor - self.lr * eta * self.buffer
        elif self.kind == "nesterov":
            self.buffer = self.momentum * self.buffer + delta
            self.anchor = self.anchor - self.lr * (delta + self.momentum * self.buffer)
        else:
            if self.momentum:
                self.buffer = self.momentum * self.buffer + delta
                delta = self.buffer
            self.anchor = self.anchor - self.lr * delta
        return self.anchor.copy()


def wire_decoded(message, wire):
    """What a rank's float64 message arrives as, in float32, through ``wire``: cast, or int8
    with a scale max|m| / 127 per row of 256 values."""
    values = message.astype(np.float32)
    if wire == "int8":
        out = np.empty_like(values)
        for start in range(0, values.size, 256):
            row = values[start:start + 256]
            scale = np.max(np.abs(row)) / np.float32(127)
            q = np.clip(np.rint(row / scale), -127, 127) if scale > 0 else np.zeros_like(row)
            out[start:start + 256] = q.astype(np.float32) * scale
        return out
    return values.astype(_cast_type(wire)).astype(np.float32)


def whole_vector_encode(message, wire):
    """(the bytes sent, D(Q(message)) in float32) by whole-vector casts: the wire's codec as it was
    before hpcopt/comm/codec.py (ml-dtypes' bfloat16 cast; int8 on zero-padded rows), kept as
    the bits that codec must give."""
    values = message.astype(np.float32)
    if wire != "int8":
        cast = values.astype(_cast_type(wire))
        return cast.view(np.uint8), cast.astype(np.float32)
    n = values.size
    padded = np.zeros(-(-n // 256) * 256, dtype=np.float32)
    padded[:n] = values
    rows = padded.reshape(-1, 256)
    scales = np.max(np.abs(rows), axis=1) / np.float32(127)
    safe = np.where(scales > 0, scales, np.float32(1))
    q = np.clip(np.rint(rows / safe[:, None]), -127, 127).astype(np.int8)
    decoded = (q.astype(np.float32) * scales[:, None]).reshape(-1)[:n]
    return np.concatenate([q.reshape(-1)[:n].view(np.uint8), scales.view(np.uint8)]), decoded


def whole_vector_decode(payload, wire, n):
    """D of the bytes ``whole_vector_encode`` sent for ``n`` values, in float32."""
    if wire != "int8":
        return payload.view(_cast_type(wire)).astype(np.float32)
    q = np.zeros(-(-n // 256) * 256, dtype=np.float32)
    q[:n] = payload[:n].view(np.int8)
    scales = payload[n:].view(np.float32)
    return (q.reshape(-1, 256) * scales[:, None]).reshape(-1)[:n]


def _cast_type(wire):
    if wire == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(wire)


def wire_mean(messages, errors, wire):
    """The mean of the messages sent through ``wire`` with error feedback (``errors``, one
    per worker, updated): each message plus its error is sent, what it loses is its new error;
    the decoded messages are summed in float32 in worker order."""
    total = np.zeros(messages[0].size, dtype=np.float32)
    for i, message in enumerate(messages):
        message = message + errors[i]
        decoded = wire_decoded(message, wire)
        errors[i] = message - decoded
        total += decoded
    return (total / np.float32(len(messages))).astype(np.float64)


def hierarchical_wire_mean(messages, errors, wire, nodes, node_round="leader"):
    """The compressed round on several nodes (hpcopt/comm/wire_nodes.py) serially: each node's
    messages summed in float32 in rank order; M chunks, chunk c owned by node c's first rank
    (its leader); every other leader's chunk plus its error sent through ``wire`` (its loss its
    new error), summed with the owner's exact one in node order in float32, / N; the owner's
    result plus its error (the chunk's slot of its own vector) sent through ``wire`` again.
    ``node_round="rails"``: the vector cut into K slices (K the fewest ranks a node has), slice
    s the round above with each node's rank s as its leader, the nodes in the order of those
    ranks (rail s)."""
    workers, n = len(messages), messages[0].size
    members = [[i for i in range(workers) if nodes[i] == node] for node in sorted(set(nodes))]
    rails = min(len(ranks) for ranks in members) if node_round == "rails" else 1
    mean = np.empty(n, dtype=np.float32)
    for s in range(rails):
        lo, hi = s * n // rails, (s + 1) * n // rails
        rail = sorted(members, key=lambda ranks: ranks[s])
        sums = []
        for ranks in rail:
            total = np.zeros(hi - lo, dtype=np.float32)
            for i in ranks:
                total += messages[i][lo:hi].astype(np.float32)
            sums.append(total)
        mean[lo:hi] = _leaders_wire_mean(sums, [errors[ranks[s]][lo:hi] for ranks in rail], wire, workers)
    return mean.astype(np.float64)


def _leaders_wire_mean(sums, errors, wire, workers):
    """The leaders' part of ``hierarchical_wire_mean``: their nodes' ``sums`` (float32, node
    order) and their ``errors`` (views, updated) in, the decoded mean out."""
    n, parts = sums[0].size, len(sums)
    mean = np.empty(n, dtype=np.float32)
    for c in range(parts):
        lo, hi = c * n // parts, (c + 1) * n // parts
        chunk = np.zeros(hi - lo, dtype=np.float32)
        for j, total in enumerate(sums):
            if j == c:
                chunk += total[lo:hi]
                continue
            sent = total[lo:hi] + errors[j][lo:hi]
            chunk += wire_decoded(sent, wire)
            errors[j][lo:hi] = sent - wire_decoded(sent, wire)
        chunk /= np.float32(workers)
        sent = chunk + errors[c][lo:hi]
        mean[lo:hi] = wire_decoded(sent, wire)
        errors[c][lo:hi] = sent - mean[lo:hi]
    return mean


def group_members(workers: int, group, nodes: Sequence[int] = ()) -> list[list[int]]:
    """The ranks of each group: ``group`` consecutive ranks, or ("node") each node's."""
    ranks = range(workers)
    if group == "node":
        return [[i for i in ranks if nodes[i] == node] for node in sorted(set(nodes))]
    return [list(ranks[i:i + group]) for i in range(0, workers, group)]


def group_averaged(x, groups):
    """Each model replaced by its group's mean."""
    x = list(x)
    for members in groups:
        mean = sum(x[i] for i in members) / len(members)
        for i in members:
            x[i] = mean.copy()
    return x


def prsgd_reference(config, workers: int, nodes: Sequence[int] = ()) -> np.ndarray:
    """Final averaged model of PR-SGD, serially: local steps of the inner optimizer (sgd with
    momentum, or adamw), with two-level periods each group's mean every group_interval steps
    between rounds, the mean every I_i steps (with ``wire`` of the pseudo-gradients, or models
    under plain averaging, sent through it: ``wire_mean``), then the outer optimizer's step from the
    round's start (``--outer-optimizer``; for ``--algorithm slowmo`` its slow step:
    u <- beta u + (x_start - mean) / eta, x_start <- x_start - alpha eta u). ``nodes``: each
    rank's node, whose ranks form the groups of ``group_size = "node"`` and, on several nodes,
    take a compressing wire's round in two levels (``hierarchical_wire_mean``, by the leaders or
    the rails as ``node_round`` says; "flat": ``wire_mean``)."""
    parts = worker_parts(config, workers)
    algo = config.algorithm
    schedule = parts[0].algorithm.lr_at
    intervals = list(algo.local_steps) or [algo.interval] * workers
    x = [p.workload.x0.astype(np.float64).copy() for p in parts]
    shapes = tuple(shape for _, shape in parts[0].workload.layout.entries)
    inner = [Worker(x[0], InnerOptions.of(algo), shapes) for _ in parts]
    outer = Outer.of(x[0], algo)
    steps = [p.local_steps for p in parts]
    done = [0] * workers
    total_rounds = parts[0].total_steps // algo.interval
    g = np.zeros_like(x[0])

    def local_step(i):
        parts[i].workload.problem.oracle(x[i], g)
        x[i] = inner[i].step(x[i], g.copy(), schedule(done[i]))
        done[i] += 1

    group, group_interval = getattr(algo, "group_size", 1), getattr(algo, "group_interval", 0)
    wire, errors = getattr(algo, "wire", ""), [np.zeros_like(x[0]) for _ in range(workers)]
    node_round = getattr(algo, "node_round", "leader")

    groups = group_members(workers, group, nodes)

    def group_means():  # two-level periods: each model becomes its group's mean
        nonlocal x
        x = group_averaged(x, groups)

    for r in range(total_rounds):
        for s in range(1, max(intervals) + 1):
            for i in range(workers):
                if s <= intervals[i]:
                    local_step(i)
            if group_interval and s % group_interval == 0 and s < algo.interval:
                group_means()
        members = participants_of(algo, config.run.seed, r, workers)
        if len(members) < workers:  # a subset's round: the flat wire over its members
            mean = subset_round_mean(x, members, errors, wire, outer)
        else:
            mean = sum(x) / workers
            through = (wire_mean if wire == "float32" or len(set(nodes)) < 2 or node_round == "flat"
                       else lambda m, e, w: hierarchical_wire_mean(m, e, w, nodes, node_round))
            if wire and outer.kind == "average":  # the models are sent
                mean = through(x, errors, wire)
            elif wire:  # the pseudo-gradients are sent
                mean = outer.anchor - through([outer.anchor - xi for xi in x], errors, wire)
        mean = outer.step(mean, schedule((r + 1) * algo.interval - 1))
        x = [mean.copy() for _ in range(workers)]
        round_policies(inner, members)
    for s in range(1, max(n - d for n, d in zip(steps, done)) + 1):
        for i in range(workers):
            if done[i] < steps[i]:
                local_step(i)
        if group_interval and s % group_interval == 0:
            group_means()
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


def _clipped_steps(x, grads, norms, inner, t, lr, gamma, base_lr):
    """One clipped inner step on each model: the inner optimizer's step with step size
    min(eta_t, gamma_t/(n + 1e-10)), gamma_t = gamma * eta_t / base_lr (gamma decays with the
    learning rate). The norm is taken on the raw gradient; weight decay and momentum shape only
    the direction. Returns the new models and whether each step was clipped."""
    eta = lr(t)
    gamma_t = gamma * eta / base_lr
    new_x, clipped = [], []
    for xi, gi, ni, worker in zip(x, grads, norms, inner):
        size = min(eta, gamma_t / (ni + 1e-10))
        new_x.append(worker.step(xi, gi, size))
        clipped.append(size < eta)
    return new_x, clipped


def celgc_reference(x0, oracles, steps, interval, lr, gamma, base_lr, participation=1.0, seed=0,
                    clip_norm="local", outer_optimizer="average", outer_lr=1.0, outer_momentum=0.0,
                    finish=False, group_size=1, group_interval=0, **inner):
    """CELGC with N = len(oracles) simulated workers; ``lr(t)`` is eta_t; ``inner``: the
    ``InnerOptions`` (momentum, nesterov, weight_decay, momentum_policy, inner_optimizer, ...).

    Every step t: if t % I == 0, every model becomes the mean over this round's participants S_r
    (all workers, or ceil(p N) of them drawn by ``stream(seed, "participation", r).choice(N, k,
    replace=False)``) and the inner optimizer's moments follow their policies over S_r; after
    t = 0, the outer optimizer steps from the round's start to that mean and every worker
    continues from its result. Then each worker takes its own clipped step. With ``finish``, the
    N models are then averaged over all workers (the training loop's final average), followed by
    the outer step when the last round is complete (I divides T). With two-level periods, at
    steps t % group_interval == 0 that start no round every model becomes its group's mean
    (all of the group's workers). Returns (the N models after T steps, the N counts of clipped
    steps).
    """
    workers = len(oracles)
    x = [np.array(x0, dtype=np.float64) for _ in range(workers)]
    options = InnerOptions(**inner)
    workers_state = [Worker(x[0], options) for _ in range(workers)]
    outer = Outer(x[0], outer_optimizer, outer_lr, outer_momentum)
    counts = [0] * workers
    for t in range(steps):
        if t % interval == 0:
            members = list(range(workers))
            if participation < 1:
                k = math.ceil(round(participation * workers, 9))
                draw = stream(seed, "participation", t // interval)
                members = draw.choice(workers, k, replace=False)
            mean = sum(x[j] for j in members) / len(members)
            if t == 0:
                outer.anchor = mean.copy()
            else:
                mean = outer.step(mean, lr(t - 1))
            x = [mean.copy() for _ in range(workers)]
            round_policies(workers_state, members)
        elif group_interval and t % group_interval == 0:
            x = group_averaged(x, group_members(workers, group_size))
        grads = []
        for i in range(workers):
            g = np.zeros_like(x[i])
            oracles[i](x[i], g)
            grads.append(g)
        norms = [float(np.sqrt(np.sum(g * g))) for g in grads]
        if clip_norm == "global":
            norms = [math.sqrt(sum(n * n for n in norms) / workers)] * workers
        x, clipped = _clipped_steps(x, grads, norms, workers_state, t, lr, gamma, base_lr)
        counts = [c + k for c, k in zip(counts, clipped)]
    if finish:
        mean = sum(x) / workers
        if steps and steps % interval == 0:
            mean = outer.step(mean, lr(steps - 1))
        x = [mean.copy() for _ in range(workers)]
    return x, counts


def naive_clip_reference(x0, oracles, steps, lr, gamma, base_lr, **inner):
    """Naive parallel clipping: one model; each step g = mean_i g_i(x), one clipped step on g
    (``inner``: the ``InnerOptions``). Returns (the model after T steps, the number of clipped
    steps)."""
    x = np.array(x0, dtype=np.float64)
    worker = Worker(x, InnerOptions(**inner))
    count = 0
    for t in range(steps):
        mean = np.zeros_like(x)
        for oracle in oracles:
            g = np.zeros_like(x)
            oracle(x, g)
            mean += g / len(oracles)
        (x,), (clipped,) = _clipped_steps([x], [mean], [float(np.sqrt(np.sum(mean * mean)))],
                                          [worker], t, lr, gamma, base_lr)
        count += clipped
    return x, count


__all__ = ["prsgd_reference", "minibatch_sgd_reference", "worker_parts", "celgc_reference",
           "naive_clip_reference", "InnerOptions", "Worker", "Outer", "round_policies"]


def participants_of(algo, seed: int, round_index: int, workers: int) -> list[int]:
    """Round ``round_index``'s participants: every worker, or with ``participation`` p < 1 the
    ceil(p N) that ``stream(seed, "participation", r).choice(N, k, replace=False)`` draws."""
    p = getattr(algo, "participation", 1.0)
    if p == 1:
        return list(range(workers))
    k = math.ceil(round(p * workers, 9))
    drawn = stream(seed, "participation", round_index).choice(workers, k, replace=False)
    return sorted(int(j) for j in drawn)


def subset_round_mean(x, members, errors, wire, outer):
    """A round's mean over ``members`` only: plain, or through ``wire`` (the members' messages,
    the pseudo-gradients when the outer optimizer keeps an anchor, with their errors; the
    others' errors untouched)."""
    if not wire:
        return sum(x[j] for j in members) / len(members)
    sent = [errors[j] for j in members]
    if outer.kind == "average":
        mean = wire_mean([x[j] for j in members], sent, wire)
    else:
        mean = outer.anchor - wire_mean([outer.anchor - x[j] for j in members], sent, wire)
    for j, error in zip(members, sent):
        errors[j] = error
    return mean


def celgc_pieces_reference(config, workers: int):
    """CELGC as a config composes it, serially, from ALGORITHMS.md's rule: worker i averages
    before its step t when t % I_i == 0 (t = 0 included: the mean of the common x_0, which
    becomes the outer optimizer's anchor), over round r's participants (``participants_of``),
    through the ``wire`` when one is set (``subset_round_mean``); after the first, the outer step
    from the round's start with eta at the previous round's last nominal step, r I - 1; the
    moments by their policies over the participants. Each step is clipped by
    min(eta_t, gamma_t / (||g_i|| + 1e-10)) (the global norm: sqrt(mean_j ||g_j||^2)). The run
    ends with the plain mean over every worker, and the outer step when its last round is
    complete. Returns (the final model, each worker's count of clipped steps)."""
    parts = worker_parts(config, workers)
    algo = config.algorithm
    schedule = parts[0].algorithm.lr_at
    intervals = list(algo.local_steps) or [algo.interval] * workers
    steps = [p.local_steps for p in parts]
    x = [p.workload.x0.astype(np.float64).copy() for p in parts]
    inner = [Worker(x[0], InnerOptions.of(algo)) for _ in parts]
    outer = Outer.of(x[0], algo)
    errors = [np.zeros_like(x[0]) for _ in range(workers)]
    counts, done, rounds = [0] * workers, [0] * workers, 0
    g = np.zeros_like(x[0])

    def round_(first: bool):
        nonlocal x, rounds
        members = participants_of(algo, config.run.seed, rounds, workers)
        mean = subset_round_mean(x, members, errors, algo.wire, outer)
        if first:
            if outer.kind != "average":
                outer.anchor = mean.copy()
        else:
            mean = outer.step(mean, schedule(rounds * algo.interval - 1))
        x = [mean.copy() for _ in range(workers)]
        round_policies(inner, members)
        rounds += 1

    round_(first=True)
    while True:
        chunk = [min(k, n - d) for k, n, d in zip(intervals, steps, done)]
        for s in range(1, max(chunk) + 1):
            active = [i for i in range(workers) if s <= chunk[i]]
            grads = []
            for i in active:
                parts[i].workload.problem.oracle(x[i], g)
                grads.append(g.copy())
            norms = [float(np.sqrt(np.sum(gi * gi))) for gi in grads]
            if algo.clip_norm == "global":
                norms = [math.sqrt(sum(n * n for n in norms) / workers)] * len(active)
            for i, gi, ni in zip(active, grads, norms):
                (x[i],), (clipped,) = _clipped_steps([x[i]], [gi], [ni], [inner[i]], done[i],
                                                     schedule, algo.gamma, algo.lr)
                counts[i] += clipped
                done[i] += 1
        if done == steps:
            break
        round_(first=False)
    mean = sum(x) / workers
    if chunk == intervals:  # the last round is complete: the final average takes its outer step
        mean = outer.step(mean, schedule(rounds * algo.interval - 1))
    return mean, counts


def fragment_cuts(sizes, fragments):
    """Streaming's fragments, plainly: cut the parameters (``sizes``, in order) at the boundary
    nearest to each share p d / P, leaving at least one parameter to every fragment."""
    ends = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
    cuts = [0]
    for p in range(1, fragments):
        allowed = range(cuts[-1] + 1, len(sizes) - (fragments - p) + 1)
        cuts.append(min(allowed, key=lambda k: (abs(ends[k] - p * ends[-1] / fragments), k)))
    cuts.append(len(sizes))
    return [(ends[a], ends[b]) for a, b in zip(cuts, cuts[1:])]


def streaming_reference(config, workers: int, outer_of=None) -> np.ndarray:
    """Final averaged model of Streaming DiLoCo, serially: fragment p's mean taken after steps
    s = p H // P (mod H), its outer step (own anchor and buffer) and the mix
    x_p <- (1 - alpha) x_p + alpha x0_p (``overlap_rule`` delayed: x_i,p <- x_i,p + alpha (x0_p -
    send_i,p), send_i,p the fragment rank i sent) applied tau steps later; the means still due at the
    end are applied then, and the run ends with the plain average. With a ``wire`` the
    fragment's mean is taken through it (``wire_mean``, each fragment with its slice of the
    errors; tau = 0). With two-level periods, each
    model becomes its group's mean after steps s % group_interval == 0, s % H != 0, before the
    fragments' turn. ``outer_of(x0_p)``: each fragment's outer optimizer (default: ``Outer.of``
    the config's). With celgc's options, each step clipped (``_clipped_steps``: gamma, the
    local or global norm), and each fragment's mean over the participants of the round it is
    sent in (``participants_of``, round (s - 1) // H)."""
    parts = worker_parts(config, workers)
    algo = config.algorithm
    interval, fragments, overlap, alpha = algo.interval, algo.fragments, algo.overlap, algo.fragment_mix
    delayed = algo.overlap_rule == "delayed"  # x_i,p <- x_i,p + alpha (x0_p - send_i,p)
    schedule = parts[0].algorithm.lr_at
    sizes = [math.prod(shape) for _, shape in parts[0].workload.layout.entries]
    bounds = fragment_cuts(sizes, fragments)
    x = [p.workload.x0.astype(np.float64).copy() for p in parts]
    inner = [Worker(x[0], InnerOptions.of(algo)) for _ in parts]
    outer_of = outer_of or (lambda x0: Outer.of(x0, algo))
    outers = [outer_of(x[0][a:b]) for a, b in bounds]
    wire = algo.wire  # a fragment's round through it: of anchor_p - x_i,p (average: x_i,p)
    errors = [[np.zeros(b - a) for _ in range(workers)] for a, b in bounds]

    def fragment_mean(p, step):
        (a, b), outer = bounds[p], outers[p]
        members = participants_of(algo, config.run.seed, (step - 1) // interval, workers)
        return subset_round_mean([xi[a:b] for xi in x], members, errors[p], wire, outer)

    g = np.zeros_like(x[0])
    due = {}  # fragment -> (the step its mean was taken, the mean)
    clipped = [0] * workers if hasattr(algo, "gamma") and algo.algorithm == "celgc" else None

    def apply(p):
        sent, mean, sends = due.pop(p)
        (a, b), new = bounds[p], outers[p].step(mean, schedule(sent - 1))
        for xi, send in zip(x, sends):
            xi[a:b] = xi[a:b] + alpha * (new - send) if delayed else (1 - alpha) * xi[a:b] + alpha * new

    groups, group_interval = group_members(workers, algo.group_size), algo.group_interval
    for step in range(1, parts[0].total_steps + 1):
        grads = []
        for i, part in enumerate(parts):
            part.workload.problem.oracle(x[i], g)
            grads.append(g.copy())
        if clipped is None:
            x = [inner[i].step(x[i], grads[i], schedule(step - 1)) for i in range(workers)]
        else:
            norms = [float(np.sqrt(np.sum(gi * gi))) for gi in grads]
            if algo.clip_norm == "global":
                norms = [math.sqrt(sum(n * n for n in norms) / workers)] * workers
            x, fired = _clipped_steps(x, grads, norms, inner, step - 1, schedule, algo.gamma, algo.lr)
            clipped = [c + k for c, k in zip(clipped, fired)]
        if group_interval and step % group_interval == 0 and step % interval != 0:
            x = group_averaged(x, groups)
        for p in range(fragments):
            if (step - p * interval // fragments) % interval == 0:
                a, b = bounds[p]
                due[p] = (step, fragment_mean(p, step), [xi[a:b].copy() for xi in x])
        for p in [p for p, (sent, *_) in due.items() if sent + overlap == step]:
            apply(p)
    for p in sorted(due, key=lambda p: due[p][0]):
        apply(p)
    return sum(x) / workers
