"""The compressed round on several nodes: float32 within each node, compressed between nodes.

When a round's ranks sit on M > 1 nodes (``Comm.in_node`` is false), ``hierarchical_mean``
takes the mean of the messages m_i of hpcopt/comm/wire.py in three steps (N ranks, node j's
ranks R_j, its first rank its leader, leaders in rank order; Q and D: hpcopt/comm/codec.py)::

    1. in-node:   s_j = sum_{i in R_j} m_i                          float32, label NODE_LABEL
    2. leaders:   s_j cut into M chunks (chunk c: values [c d / M, (c+1) d / M)), owned by leader c
       reduce-scatter:  leader j sends q = Q(s_j[c] + e_j[c]) to leader c, c != j, and keeps
                        e_j[c] <- s_j[c] + e_j[c] - D(q)            (one alltoall of the payloads)
                        r_c = (1/N) (D(q_0) + ... + s_c[c] + ... + D(q_{M-1}))   float32, leader
                        order; the owner's own chunk exact
       allgather:       leader c sends q = Q(r_c + e_c[c]), keeps e_c[c] <- r_c + e_c[c] - D(q);
                        every leader's mean is D of every chunk's q (its own chunk's too)
    3. in-node:   the leader's mean broadcast to its node               label NODE_LABEL

Every rank ends with the same bits: the owner of a chunk computes it once, in a fixed order,
and every rank decodes the same payloads. Error feedback sits where each quantization happens:
at a leader, chunk c != j of its error vector carries the reduce-scatter's error of what it sent
to c, and chunk j the allgather's of its own chunk; the other ranks quantize nothing (their
error vector stays 0). A leader sends (M-1)/M of a message to the other leaders and its 1/M
chunk to each of them, 2 (M-1)/M of a message's bytes in all, about twice one message however
many nodes there are (the flat allgather sends a rank's message to all N-1 others). The
in-node steps move float32 through shared memory; the cross-node calls count under the
round's label, whose ranks are the M leaders (``CommStats.ranks``).

Who does the leaders' work is the run's ``node_round`` (``NODE_ROUNDS``):

- ``leader``: as above, each node's first rank, while the node's other ranks wait in the
  broadcast;
- ``rails``: every rank of a node owns 1/K of the vector (K the fewest ranks a node has; a
  node's ranks from K up own none). The vector is cut into K slices (``chunk_bounds(d, K)``);
  rail s, the ranks that are rank s of their node (``Comm.node_rails``; the nodes in the order
  of those ranks), runs steps 2 above on slice s, step 1 becoming a reduce-scatter and step 3
  an allgather in the node::

    1. in-node:   t_j[s] = sum_{i in R_j} m_i[s], by node rank s     float32, node-rank order
                  (every rank sends slice s of its message to node rank s: one alltoall)
    2. rail s:    steps 2 above on t_j[s], the M ranks of rail s as the leaders, their error
                  vectors' slice s as the leaders' errors
    3. in-node:   the mean's slices gathered on every rank of the node (one allgather)

  The bits are those of another algorithm than ``leader``'s (K slices cut into M chunks each,
  the error feedback spread over the ranks), defined as above and the same on every rank; a
  rank of rail s sends 2 (M-1)/M of a slice's bytes, d/K values, across, and the K rails share
  one link: a node's link carries what a leader's carries (``CommStats.rails``, the cost
  model's ``NodeLayout``). With K = 1 it is the ``leader`` round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from .codec import codec_for, message_bytes

if TYPE_CHECKING:
    from .core import Comm

#: The label of a hierarchical round's in-node steps (the sum and the broadcast).
NODE_LABEL = "average_node"
#: Who exchanges the compressed chunks across nodes (module docstring); "flat": nobody, the
#: round of one node (one Allgather of every rank's payload, hpcopt/comm/wire.py) across nodes.
#: A run's ``node_round`` '' is "leader" here.
NODE_ROUNDS = ("leader", "rails", "flat")


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """The ``parts`` contiguous chunks [c n / parts, (c+1) n / parts) of ``n`` values."""
    return [(c * n // parts, (c + 1) * n // parts) for c in range(parts)]


def hierarchical_mean(message: np.ndarray, error: np.ndarray, wire: str, comm: Comm,
                      label: str) -> np.ndarray:
    """The mean over ``comm``'s ranks of the messages (module docstring), in float32, the same
    bits on every rank; at a leader ``message`` (flat) is overwritten with what it quantized
    and ``error`` with its new errors (elsewhere both are left as they are)."""
    node = comm.node_group(NODE_LABEL)
    leaders = comm.node_leaders(label)
    total = node.allreduce_(message.astype(np.float32), MPI.SUM, NODE_LABEL)
    mean = np.empty(message.size, dtype=np.float32)
    if leaders is not None:
        _leaders_mean(total, message, error, wire, leaders, comm.size, label, mean)
    return node.bcast_(mean, root=0, label=NODE_LABEL)


def rails_mean(message: np.ndarray, error: np.ndarray, wire: str, comm: Comm,
               label: str) -> np.ndarray:
    """``hierarchical_mean`` with the leaders' work spread over the rails (module docstring:
    ``rails``), the same bits on every rank; a rank of rail s overwrites slice s of ``message``
    with what it quantized and of ``error`` with its new errors (the rest is left as it is)."""
    node = comm.node_group(NODE_LABEL)
    rails, me = comm.rails(), node.rank
    rail = comm.node_rails(label)
    slices = chunk_bounds(message.size, rails)
    sizes = [hi - lo for lo, hi in slices] + [0] * (node.size - rails)
    lo, hi = slices[me] if me < rails else (0, 0)
    pieces = node.alltoallv(message.astype(np.float32), sizes, [hi - lo] * node.size, NODE_LABEL)
    mine = np.empty(hi - lo, dtype=np.float32)
    if rail is not None:
        total = pieces[:hi - lo].copy()
        for j in range(1, node.size):
            total += pieces[j * (hi - lo):(j + 1) * (hi - lo)]
        _leaders_mean(total, message[lo:hi], error[lo:hi], wire, rail, comm.size, label, mine)
    return node.allgatherv(mine, sizes, NODE_LABEL)


def _leaders_mean(total: np.ndarray, message: np.ndarray, error: np.ndarray, wire: str,
                  leaders: Comm, ranks: int, label: str, mean: np.ndarray) -> None:
    """Steps 2 of the module docstring on a leader: ``mean`` <- the decoded chunks."""
    me, bounds = leaders.rank, chunk_bounds(total.size, leaders.size)
    message[...] = total
    message += error
    payloads, sizes = [], [message_bytes(wire, hi - lo) for lo, hi in bounds]
    for c, (lo, hi) in enumerate(bounds):
        if c == me:
            payloads.append(np.zeros(0, dtype=np.uint8))
            continue
        payloads.append(codec_for(wire, hi - lo).encode_(message[lo:hi], error[lo:hi]).copy())
    send_counts = [0 if c == me else sizes[c] for c in range(leaders.size)]
    recv_counts = [0 if j == me else sizes[me] for j in range(leaders.size)]
    received = leaders.alltoallv(np.concatenate(payloads), send_counts, recv_counts, label)
    lo, hi = bounds[me]
    codec, chunk = codec_for(wire, hi - lo), np.zeros(hi - lo, dtype=np.float32)
    offset = 0
    for j in range(leaders.size):
        if j == me:
            chunk += total[lo:hi]
        else:
            codec.add_decoded_(received[offset:offset + sizes[me]], chunk)
            offset += sizes[me]
    chunk /= np.float32(ranks)
    mine = chunk + error[lo:hi]
    payload = codec.encode_(mine, error[lo:hi])
    message[lo:hi] = mine
    everyone = leaders.allgatherv(payload, sizes, label)
    offset = 0
    for (lo, hi), size in zip(bounds, sizes):
        codec_for(wire, hi - lo).decode_(everyone[offset:offset + size], mean[lo:hi])
        offset += size
