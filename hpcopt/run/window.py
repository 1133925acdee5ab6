"""A trace row's window: each rank's statistics since the previous row, reduced over the ranks.

Each rank keeps its per-step losses on the device and reduces one window per row in one small
non-blocking collective (an Iallgather of 3 numbers a rank, 5 with clipping, finished at the
next row; label "trace"; the third, the stop value, also carries a checkpoint request:
``stop_value``), only at ticks of the algorithm's clock. Rank 0 writes the finished rows
(``hpcopt.io.trace.TraceWriter``), with its communication counters (``comm_totals``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Backend
from ..comm import UNSPENT, Comm

LABEL = "trace"
#: A rank's stop value in a row's reduction is its stop signal (0: none) plus this mark when it
#: asks for a checkpoint (``--checkpoint-minutes``: rank 0's wall clock, hpcopt.run.runner), so
#: the ranks agree on both at the one finished row that shows them, with no byte or collective
#: more: the signal is the integer part of the highest value, as before the mark existed.
CHECKPOINT_MARK = 0.5

Oracle = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class WindowStats:
    """A window reduced over ranks: means and maxima of each rank's value, the stop signal
    (the highest number any rank sent; 0: none) and whether a rank asked for a checkpoint."""

    loss_mean: float
    loss_max: float
    grad_norm: float
    grad_norm_max: float
    stop: int
    clip_fraction: float = math.nan  # clipped steps / steps over all ranks (clipping runs only)
    checkpoint: bool = False  # a rank's stop value carried CHECKPOINT_MARK

    def columns(self, clipping: bool = False) -> dict[str, float]:
        """The trace row's columns of these statistics (with ``clip_fraction`` when clipping)."""
        values = {"loss_mean": self.loss_mean, "loss_max": self.loss_max,
                  "grad_norm": self.grad_norm, "grad_norm_max": self.grad_norm_max}
        return {**values, "clip_fraction": self.clip_fraction} if clipping else values


def stop_value(stop: int, checkpoint: bool) -> float:
    """What a rank sends in a row's reduction: its stop signal ``stop`` (0: none), marked when
    it asks for a ``checkpoint`` (``CHECKPOINT_MARK``)."""
    return stop + (CHECKPOINT_MARK if checkpoint else 0.0)


def read_stop(values: np.ndarray) -> tuple[int, bool]:
    """(stop signal, checkpoint asked for) of every rank's ``stop_value``: the highest signal,
    and whether any value carries the mark."""
    return int(values.max()), bool((values % 1 != 0).any())


@dataclass
class Row:
    """A trace row: what is known at its tick, and the window's statistics once reduced."""

    tick: int
    fields: dict[str, Any]                   # COLUMNS except the window statistics
    comm: dict[str, tuple]                   # rank 0's ``comm_totals`` at its tick
    stats: WindowStats | None = None


@dataclass
class _Posted:
    row: Row
    request: Any
    mine: np.ndarray
    everyone: np.ndarray


class Window:
    """This rank's statistics since the last row, and the rows whose reduction is in flight.

    Every step adds its minibatch loss, a 0-d device array kept until the row (no per-step
    transfer). While ``armed`` the traced oracle keeps ||g||^2 of the newest stochastic
    gradient (one dot product on the device); the loop arms it for the steps that lead to a
    row tick, so a row's gradient norm is the one of the row's last step. The loss sum is a
    left fold in float64 over the steps in order: folding at a checkpoint and continuing
    after a resume gives the same bits as one fold.

    A row's reduction over ranks is one non-blocking collective (label "trace"): ``post``
    starts an Iallgather of each rank's (mean loss, gradient norm, stop value), 24 bytes a
    rank (with ``clipping`` also the window's clipped steps and steps: 40 bytes), and
    ``complete`` finishes it, normally at the next row tick, so no rank ever waits
    for it on the step path. Every rank then takes means and maxima in rank order: the same
    bits everywhere, and in every run on as many ranks.
    """

    def __init__(self, backend: Backend, clipping: bool = False) -> None:
        self.backend = backend
        self.clipping = clipping  # also count clipped steps (reduced as a 4th value)
        self.losses: list[Any] = []
        self.loss_sum = 0.0
        self.steps = 0
        self.clips = 0
        self.armed = False
        self._grad_sq: Any = None
        self._posted: list[_Posted] = []

    def traced(self, oracle: Oracle) -> Oracle:
        """``oracle`` that also keeps ||g||^2 when armed."""
        dot = self.backend.xp.dot

        def run(x: Any, grad: Any) -> Any:
            loss = oracle(x, grad)
            if self.armed:
                self._grad_sq = dot(grad, grad)
            return loss

        return run

    def add(self, loss: Any, clipped: bool = False) -> None:
        self.losses.append(loss)
        self.clips += clipped

    def fold(self) -> np.ndarray:
        """Fold the kept losses into the sum; ``[loss_sum, steps]`` (and ``clips`` when
        clipping). On the GPU the losses, the clip count and ||g||^2 come over in one copy."""
        kept = len(self.losses)
        pending = [*self.losses, self.clips]
        if self._grad_sq is not None:
            pending.append(self._grad_sq)
        values = self.backend.floats_to_host(pending)
        for value in values[:kept]:
            self.loss_sum += value
        self.steps += kept
        self.losses.clear()
        self.clips = int(values[kept])
        if self._grad_sq is not None:
            self._grad_sq = values[-1]
        extra = [self.clips] if self.clipping else []
        return np.array([self.loss_sum, self.steps, *extra], dtype=np.float64)

    def restore(self, folded: np.ndarray) -> None:
        """Continue from ``fold()``'s result (saved in a checkpoint)."""
        self.loss_sum, self.steps = float(folded[0]), int(folded[1])
        self.clips = int(folded[2]) if self.clipping else 0

    def post(self, comm: Comm, stop: float, row: Row) -> None:
        """End the window: start its reduction over ranks (collective) for ``row``, with this
        rank's ``stop_value``."""
        self.fold()
        mean = self.loss_sum / self.steps if self.steps else math.nan
        norm = math.sqrt(self._grad_sq) if self._grad_sq is not None else math.nan
        values = [mean, norm, float(stop)]
        if self.clipping:  # clipped steps and steps: the fraction over all ranks is their ratio
            values += [float(self.clips), float(self.steps)]
        mine = np.array(values)
        request, everyone = comm.iallgather(mine, LABEL)
        self._posted.append(_Posted(row, request, mine, everyone))
        self.loss_sum, self.steps, self.clips, self._grad_sq = 0.0, 0, 0, None

    def complete(self, comm: Comm) -> list[Row]:
        """Finish every posted reduction (collective); their rows, oldest first, with stats."""
        if not self._posted:
            return []
        posted, self._posted = self._posted, []
        comm.waitall([p.request for p in posted], label=LABEL)
        for p in posted:
            means, maxima = p.everyone.sum(axis=0) / comm.size, p.everyone.max(axis=0)
            clip_fraction = math.nan
            if self.clipping:
                totals = p.everyone.sum(axis=0)
                clip_fraction = totals[3] / totals[4] if totals[4] else math.nan
            stop, checkpoint = read_stop(p.everyone[:, 2])
            p.row.stats = WindowStats(means[0], maxima[0], means[1], maxima[1], stop, clip_fraction,
                                      checkpoint)
        return [p.row for p in posted]


def comm_totals(comm: Comm, network: Any = None, layout: Any = None, hidden: float = 1.0) -> dict[str, tuple]:
    """label -> (calls, bytes, seconds, in-node calls, in-node bytes) of this rank, summed over
    operations (not the seconds in flight of non-blocking reductions, nor their own seconds,
    ``UNSPENT``: they overlap computation); with a ``costmodel.NetworkProfile`` also the
    modelled seconds on it (on the nodes of ``layout``, a ``costmodel.NodeLayout``, when given;
    non-blocking reductions hidden at most the fraction ``hidden``), as a sixth value
    (``hpcopt.io.trace.TOTALS``)."""
    totals: dict[str, list] = {}
    for (op, label), counter in comm.stats.counters.items():
        entry = totals.setdefault(label, [0, 0, 0.0, 0, 0])
        entry[0] += counter.calls
        entry[1] += counter.bytes
        entry[2] += counter.seconds if op not in UNSPENT else 0.0  # overlapped computation
        entry[3] += counter.in_node_calls
        entry[4] += counter.in_node_bytes
    if network is not None:
        from ..comm.costmodel import comm_modelled

        modelled = comm_modelled(comm.stats.counters, comm.size, network, label_ranks=comm.stats.ranks,
                                 label_rails=comm.stats.rails, layout=layout, hidden=hidden)
        for label, seconds in modelled.items():
            totals[label].append(seconds)
    return {label: tuple(entry) for label, entry in totals.items()}
