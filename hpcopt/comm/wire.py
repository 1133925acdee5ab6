"""Compressed averaging: what a round sends, cast or quantized, with error feedback.

A round's message m_i (the pseudo-gradient anchor - x_i, or the model x_i under plain
averaging) is sent as ``wire`` values; the quantization error stays on the rank and is added to
its next message (error feedback: Seide et al., "1-bit SGD", Interspeech 2014; Karimireddy et
al., "Error Feedback Fixes SignSGD", ICML 2019)::

    m_i <- m_i + e_i;   q_i = Q(m_i);   e_i <- m_i - D(q_i)
    mean = (1/N) (D(q_0) + D(q_1) + ... + D(q_{N-1}))        (in float32)

Q and D per wire type (``WIRES``; bytes a rank sends for n values):

    float32   the float32 cast: one MPI Allreduce (SUM) of the cast values, then / N      4 n
    bfloat16  the bfloat16 cast (ml-dtypes), D the cast back to float32                   2 n
    float16   the float16 cast                                                            2 n
    int8      per row of ``INT8_ROW`` values: s = max|m| / 127 (float32),
              q = rint(m / s) in [-127, 127], D = q s                   n + 4 ceil(n / 256)

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

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

if TYPE_CHECKING:
    from .core import Comm

Array = Any

WIRES = ("float32", "bfloat16", "float16", "int8")
#: Values per int8 row (one float32 scale each).
INT8_ROW = 256


def message_bytes(wire: str, n: int) -> int:
    """Bytes a rank sends for a message of ``n`` values."""
    if wire == "int8":
        return n + 4 * math.ceil(n / INT8_ROW)
    return n * (4 if wire == "float32" else 2)


def _cast_type(wire: str) -> np.dtype:
    if wire == "bfloat16":
        import ml_dtypes  # only where bfloat16 is used

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(wire)


def encode(message: np.ndarray, wire: str) -> tuple[np.ndarray, np.ndarray]:
    """(the bytes sent, D(Q(message)) in float32) of a flat message."""
    values = message.astype(np.float32)
    if wire != "int8":
        cast = values.astype(_cast_type(wire))
        return cast.view(np.uint8), cast.astype(np.float32)
    n = values.size
    padded = np.zeros(math.ceil(n / INT8_ROW) * INT8_ROW, dtype=np.float32)
    padded[:n] = values
    rows = padded.reshape(-1, INT8_ROW)
    scales = np.max(np.abs(rows), axis=1) / np.float32(127)
    safe = np.where(scales > 0, scales, np.float32(1))
    q = np.clip(np.rint(rows / safe[:, None]), -127, 127).astype(np.int8)
    decoded = (q.astype(np.float32) * scales[:, None]).reshape(-1)[:n]
    return np.concatenate([q.reshape(-1)[:n].view(np.uint8), scales.view(np.uint8)]), decoded


def decode(payload: np.ndarray, wire: str, n: int) -> np.ndarray:
    """D of the bytes ``encode`` sent for ``n`` values, in float32."""
    if wire != "int8":
        return payload.view(_cast_type(wire)).astype(np.float32)
    q = np.zeros(math.ceil(n / INT8_ROW) * INT8_ROW, dtype=np.float32)
    q[:n] = payload[:n].view(np.int8)
    scales = payload[n:].view(np.float32)
    return (q.reshape(-1, INT8_ROW) * scales[:, None]).reshape(-1)[:n]


def compressed_mean(message: np.ndarray, error: np.ndarray, wire: str, comm: Comm,
                    label: str) -> np.ndarray:
    """The mean over ranks of the messages as ``wire`` sends them (module docstring), in
    float32; ``message`` (this rank's, flat) is overwritten with m + e and ``error`` with the
    new e. On several nodes a compressing wire takes ``wire_nodes.hierarchical_mean``."""
    if wire != "float32" and not comm.in_node:  # on several nodes: hpcopt/comm/wire_nodes.py
        from .wire_nodes import hierarchical_mean

        return hierarchical_mean(message, error, wire, comm, label)
    message += error
    payload, decoded = encode(message, wire)
    np.subtract(message, decoded, out=error)
    if wire == "float32":
        comm.allreduce_(decoded, MPI.SUM, label=label)
        total = decoded
    else:
        everyone = comm.allgather(payload, label=label)
        total = np.zeros(message.size, dtype=np.float32)
        for row in everyone:
            total += decode(row, wire, message.size)
    total /= np.float32(comm.size)
    return total


def wire_average_(x: np.ndarray, anchor: np.ndarray | None, error: np.ndarray, wire: str,
                  comm: Comm, label: str) -> np.ndarray:
    """x <- the ranks' mean through the wire: of the pseudo-gradients anchor - x_i (x =
    anchor - their mean), or without an anchor of the models x_i."""
    message = x.copy() if anchor is None else anchor - x
    mean = compressed_mean(message, error, wire, comm, label)
    if anchor is None:
        x[...] = mean
    else:
        np.subtract(anchor, mean, out=x)
    return x
