"""A non-blocking sum over ranks on several nodes, by rails: the node-aware path of a reduction
in flight (Streaming DiLoCo's fragments without a wire, ``--node-round rails``).

``RailsSum`` computes recv <- sum_i send_i over a ``Comm``'s N ranks on M nodes (node j's ranks
R_j, K the fewest ranks a node has) in three stages, each a non-blocking MPI call posted when
the one before it has completed, in the same order on every rank (MPI matches the collectives
of a communicator by their order)::

    1. in-node:  every rank sends slice s of ``send`` (``chunk_bounds(d, K)``) to node rank s
                 (Ialltoallv); node rank s sums its K_j pieces in node-rank order, float32 or
                 float64 as ``send``
    2. rail s:   Iallreduce (SUM) of that node sum over the M ranks of rail s (``Comm.node_rails``)
    3. in-node:  the slices gathered on every rank of the node (Iallgatherv) into ``recv``

A node's link carries each value of the vector twice (2 (M-1)/M of it, in K rails at once),
where one Iallreduce of the whole world sends a rank's whole vector, about 1.6 times the
counted bytes on 2 x 2 ranks (docs/results/clusters.md). The stages move on one at a time when
the rank calls ``advance`` (after each local step, every reduction in flight in the order they
were posted: ``hpcopt.algorithms.streaming``), and all of them in ``Wait``: a rank that posted
the next stage as soon as its own part of the last one had completed would post the
collectives of several reductions in flight in another order than other ranks. MPI progresses
the posted stage meanwhile as its progress mode allows (``comm.core.progress_mode``); a stage
not done when ``advance`` comes waits there. Every rank ends with the same bits: each slice is
summed once, by its rail, and gathered.

Counted by ``Comm.complete`` as one ("iallreduce", label) call of the bytes of this rank's
slice, on its rail of M ranks (``CommStats.ranks``), ``CommStats.rails`` noting the K rails that
share each link; the in-node stages as in-node calls of label ``NODE_LABEL`` with no seconds of
their own (their seconds are the reduction's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from .wire_nodes import NODE_LABEL, chunk_bounds

if TYPE_CHECKING:
    from .core import Comm


class RailsSum:
    """A sum in flight (module docstring); ``Wait`` and ``advance`` move it on."""

    def __init__(self, comm: Comm, send: np.ndarray, recv: np.ndarray, label: str) -> None:
        self.node = comm.node_group(NODE_LABEL)
        rails = comm.rails()
        self.rail = comm.node_rails(label)
        self.recv, self.label = recv, label
        me = self.node.rank
        bounds = chunk_bounds(send.size, rails)
        self.sizes = [hi - lo for lo, hi in bounds] + [0] * (self.node.size - rails)
        width = self.sizes[me] if me < rails else 0
        self.pieces = np.empty(width * self.node.size, dtype=send.dtype)
        self.total = np.empty(width, dtype=send.dtype)
        #: The bytes this rank's rail call moves (its slice): what ``Comm.complete`` counts.
        self.nbytes = self.total.nbytes
        self.stage = 1
        self.request = self.node.mpi.Ialltoallv([send, self.sizes], [self.pieces, [width] * self.node.size])
        self.node.stats.record("alltoall", NODE_LABEL, send.nbytes, 0.0, True)

    def advance(self) -> None:
        """Complete the stage in flight and post the next one (nothing once all are done)."""
        if self.stage <= 3:
            self.request.Wait()
            self._next()

    def Wait(self) -> None:  # noqa: N802 - as MPI.Request's, which ``Comm.complete`` calls
        """Complete every stage."""
        while self.stage <= 3:
            self.request.Wait()
            self._next()

    def _next(self) -> None:
        """The stage in flight has completed: post the next one."""
        self.stage += 1
        if self.stage == 2:
            if self.rail is None:  # a node rank from K up owns no slice: nothing to sum
                self.request = MPI.REQUEST_NULL
                return
            width = self.total.size
            np.copyto(self.total, self.pieces[:width])
            for j in range(1, self.node.size):
                self.total += self.pieces[j * width:(j + 1) * width]
            self.request = self.rail.mpi.Iallreduce(MPI.IN_PLACE, self.total, op=MPI.SUM)
        elif self.stage == 3:
            self.request = self.node.mpi.Iallgatherv(self.total, [self.recv, self.sizes])
            self.node.stats.record("allgather", NODE_LABEL, self.total.nbytes, 0.0, True)
