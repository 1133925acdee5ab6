"""Compressed averaging: what a round sends, cast or quantized, with error feedback.

A round's message m_i (the pseudo-gradient anchor - x_i, or the model x_i under plain
averaging) is sent as ``wire`` values; the quantization error stays on the rank and is added to
its next message (error feedback: Seide et al., "1-bit SGD", Interspeech 2014; Karimireddy et
al., "Error Feedback Fixes SignSGD", ICML 2019)::

    m_i <- m_i + e_i;   q_i = Q(m_i);   e_i <- m_i - D(q_i)
    mean = (1/N) (D(q_0) + D(q_1) + ... + D(q_{N-1}))        (in float32)

Q and D per wire type are the codec's (hpcopt/comm/codec.py: float32, bfloat16, float16, int8
per rows of 256 values with a float32 scale each; ``message_bytes`` the bytes a rank sends).

MPI has no reduction for bfloat16, float16 or a scaled int8, so these messages are exchanged with
one Allgather (label as the round's) and every rank decodes and sums all N in float32 in rank
order: the same bits on every rank. It costs what an allgather of the message costs,
(N-1)(alpha + bytes beta) on the cost model, against a ring allreduce's 2(N-1)/N of 4 n bytes:
cheaper below N = 4 for the 2-byte types (equal at 4) and up to N = 7 for int8; every rank holds
the N messages at once (N n bytes for int8). ``Comm`` counts the message bytes, so the trace and
``--network`` see them. That is the round on one node; when the ranks span several nodes, the
compressing wires take hpcopt/comm/wire_nodes.py instead (float32 sums within each node, a
reduce-scatter and an allgather of compressed chunks between them), and float32 stays one
Allreduce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from .codec import codec_for, message_bytes
from .wire_nodes import hierarchical_mean, rails_mean

if TYPE_CHECKING:
    from .core import Comm


def compressed_mean(message: np.ndarray, error: np.ndarray, wire: str, comm: Comm,
                    label: str, node_round: str = "leader",
                    members: np.ndarray | None = None) -> np.ndarray:
    """The mean over ranks of the messages as ``wire`` sends them (module docstring), in
    float32; ``message`` (this rank's, flat) is overwritten with m + e and ``error`` with the
    new e. On several nodes a compressing wire takes ``wire_nodes.hierarchical_mean``, or
    ``wire_nodes.rails_mean`` (``node_round``: ``wire_nodes.NODE_ROUNDS``; "flat" this round).
    With ``members`` (a subset of the ranks: ``hpcopt.algorithms.participation``) the members'
    mean, on the flat path: the others send nothing (zeros in float32's sum) and keep their
    message and error as they are."""
    everybody = members is None
    if everybody and wire != "float32" and not comm.in_node and node_round != "flat":
        mean = rails_mean if node_round == "rails" else hierarchical_mean
        return mean(message, error, wire, comm, label)
    member, count = (True, comm.size) if members is None else (comm.rank in members, members.size)
    codec = codec_for(wire, message.size)
    if member:
        message += error
        payload = codec.encode_(message, error)
    if wire == "float32":
        values = payload.view(np.float32) if member else np.zeros(message.size, dtype=np.float32)
        return comm.allreduce_(values, MPI.SUM, label=label) / np.float32(count)
    if members is None:
        everyone = comm.allgather(payload, label=label)
    else:
        size = message_bytes(wire, message.size)
        counts = [size if rank in members else 0 for rank in range(comm.size)]
        sent = payload if member else np.zeros(0, dtype=np.uint8)
        everyone = comm.allgatherv(sent, counts, label=label).reshape(count, size)
    total = np.zeros(message.size, dtype=np.float32)
    for row in everyone:
        codec.add_decoded_(row, total)
    total /= np.float32(count)
    return total


def wire_average_(x: np.ndarray, anchor: np.ndarray | None, error: np.ndarray, wire: str,
                  comm: Comm, label: str, node_round: str = "leader",
                  members: np.ndarray | None = None) -> np.ndarray:
    """x <- the ranks' mean through the wire: of the pseudo-gradients anchor - x_i (x =
    anchor - their mean), or without an anchor of the models x_i (``node_round`` and
    ``members``: as ``compressed_mean``'s)."""
    message = x.copy() if anchor is None else anchor - x
    mean = compressed_mean(message, error, wire, comm, label, node_round, members)
    if anchor is None:
        x[...] = mean
    else:
        np.subtract(anchor, mean, out=x)
    return x
