"""Which sample indices each rank owns: its shard of ``range(n)``.

A partition is a pure function of ``(n, rank, size, seed)``: every rank computes its own shard
without communication, and the shards of ranks ``0..size-1`` cover ``0..n-1`` exactly once.
A new kind of partition is one function with the same signature added to ``_PARTITIONERS``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hpcopt.errors import UserError
from hpcopt.rng import stream

Partitioner = Callable[[int, int, int, int], np.ndarray]


def _block_range(n: int, rank: int, size: int) -> tuple[int, int]:
    """``[start, stop)`` of block ``rank``: sizes ``n // size``, the first ``n % size`` one more."""
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a communicator of size {size}")
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def block_partition(n: int, rank: int, size: int) -> np.ndarray:
    """Contiguous shards in rank order; sizes differ by at most 1, the first ``n % size`` ranks
    hold ``n // size + 1`` samples. When ``size > n`` the last ranks get empty shards."""
    start, stop = _block_range(n, rank, size)
    return np.arange(start, stop, dtype=np.int64)


def iid_partition(n: int, rank: int, size: int, seed: int) -> np.ndarray:
    """Block ``rank`` of one permutation of ``range(n)`` drawn from ``stream(seed, "partition")``
    (the same on every rank), returned sorted ascending (the sampler shuffles anyway)."""
    start, stop = _block_range(n, rank, size)
    permutation = stream(seed, "partition").permutation(n)
    return np.sort(permutation[start:stop]).astype(np.int64, copy=False)


_PARTITIONERS: dict[str, Partitioner] = {
    "block": lambda n, rank, size, _seed: block_partition(n, rank, size),
    "iid": iid_partition,
}

PARTITION_KINDS: tuple[str, ...] = tuple(_PARTITIONERS)


def partition_indices(kind: str, n: int, rank: int, size: int, seed: int) -> np.ndarray:
    """The int64 sample indices that ``rank`` of ``size`` owns under partition ``kind``."""
    partitioner = _PARTITIONERS.get(kind)
    if partitioner is None:
        raise UserError(f"unknown partition {kind!r}; valid: {', '.join(PARTITION_KINDS)}")
    if size > n:
        raise UserError(f"{size} ranks but only {n} samples: every rank needs at least one")
    return partitioner(n, rank, size, seed)
