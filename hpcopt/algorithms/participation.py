"""Partial participation: a round's mean over a subset of the ranks, for any reducer.

CELGC's partial participation (Liu et al., NeurIPS 2022; the sampling rule is not in the paper's
text, so the fraction is a parameter): round r's mean is taken over S_r, ceil(p N) ranks drawn
without replacement from ``stream(seed, "participation", r)`` (the same on every rank; r =
``state.rounds``), and every rank continues from it::

    plain  x <- (1/|S_r|) sum_{j in S_r} x_j       one allreduce; the others send zeros
    wire   the wire's mean (hpcopt.comm.wire) of the members' messages m_j + e_j, summed in
           float32 in rank order, / |S_r|: one Allgatherv in which the others send nothing
           and keep their error feedback e_i; float32: one Allreduce, the others send zeros

A compressing wire's subset round is that flat Allgatherv on any number of nodes (the
hierarchical round of hpcopt/comm/wire_nodes.py sums whole nodes). At p = 1 (``participating``
returns the reducer itself) nothing changes. The momentum policies' averages at a round are
plain means over the same S_r (``members_mean_``). A subset's round is blocking, so a streamed
fragment's round through it is too (``in_flight`` False: overlap 0 only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from ..comm.wire import wire_average_
from ..errors import HpcoptError
from ..rng import stream
from .reducers import PlainMean, Reducer, WireMean
from .state import Declared

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any


def check_participation(participation: float) -> None:
    if not 0 < participation <= 1:
        raise HpcoptError(f"participation fraction must be in (0, 1], got {participation}")


def participants(participation: float, seed: int, round_index: int, size: int) -> np.ndarray:
    """The sorted ranks whose models form round ``round_index``'s mean: all of them, or ceil(p N)
    drawn without replacement from ``stream(seed, "participation", round)``."""
    if participation == 1:
        return np.arange(size)
    count = max(1, math.ceil(participation * size - 1e-9))  # 0.7 * 10 is 7.000000000000001
    chosen = stream(seed, "participation", round_index).choice(size, count, replace=False)
    return np.sort(chosen)


@dataclass(frozen=True)
class Participating:
    """``reducer`` (plain or a wire) over round ``state.rounds``'s participants (module
    docstring); its state is the reducer's."""

    reducer: Reducer
    participation: float
    seed: int

    @property
    def declared(self) -> tuple[Declared, ...]:
        return self.reducer.declared

    @property
    def in_flight(self) -> bool:
        return False

    def new_state(self, x: Array) -> dict[str, Array]:
        return self.reducer.new_state(x)

    def participants(self, round_index: int, size: int) -> np.ndarray:
        return participants(self.participation, self.seed, round_index, size)

    def mean_(self, x: Array, state: Any, part: slice, comm: Comm, label: str) -> None:
        """``x`` (``part`` of the model) <- the mean over this round's participants."""
        members = self.participants(state.rounds, comm.size)
        if members.size == comm.size:
            self.reducer.mean_(x, state, part, comm, label)
        elif isinstance(self.reducer, WireMean):
            anchor = None if state.anchor is None else state.anchor[part]
            wire_average_(x, anchor, state.wire_error[part], self.reducer.wire, comm, label,
                          members=members)
        else:
            _subset_sum_(x, comm, label, members)

    def members_mean_(self, buffer: Array, state: Any, comm: Comm, label: str) -> None:
        """``buffer`` (like x: a moment) <- its plain mean over this round's participants."""
        members = self.participants(state.rounds, comm.size)
        if members.size == comm.size:
            comm.average_(buffer, label=label)
        else:
            _subset_sum_(buffer, comm, label, members)


def _subset_sum_(x: Array, comm: Comm, label: str, members: np.ndarray) -> None:
    """x <- the members' mean by one allreduce in which the others send zeros."""
    if comm.rank not in members:
        x[...] = 0
    comm.allreduce_(x, MPI.SUM, label=label)
    x /= members.size


def participating(reducer: Reducer, participation: float, seed: int) -> Reducer:
    """``reducer`` itself at participation 1, else over each round's participants (the plain
    mean and the wires; a registered reducer of one's own takes its mean over every rank)."""
    if participation == 1:
        return reducer
    if not isinstance(reducer, (PlainMean, WireMean)):
        raise HpcoptError("participation applies only to the plain mean and the wires, not to a "
                          "registered reducer (it takes its mean over every rank)")
    return Participating(reducer, participation, seed)


def members_mean_(reducer: Reducer, buffer: Array, state: Any, comm: Comm, label: str) -> None:
    """A round's plain mean of ``buffer`` over the ranks ``reducer`` takes the round's mean over
    (all of them unless ``Participating``)."""
    if isinstance(reducer, Participating):
        reducer.members_mean_(buffer, state, comm, label)
    else:
        comm.average_(buffer, label=label)
