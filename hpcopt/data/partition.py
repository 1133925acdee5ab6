"""Which sample indices each rank owns: its shard of ``range(n)``.

A partition is a pure function of ``(n, rank, size, seed)`` (and of the labels for the
label-skewed kinds): every rank computes its own shard without communication, and the shards of
ranks ``0..size-1`` cover ``0..n-1`` exactly once, none of them empty when ``n >= size``.
``block`` and ``iid`` balance sizes to within one sample; ``dirichlet`` and ``similarity`` make
heterogeneous (non-i.i.d.) shards from the labels. A new kind is one function added to
``_PARTITIONERS`` (signature ``(n, rank, size, seed)``) or, with the name of its parameter, to
``_LABEL_PARTITIONERS`` (signature ``(labels, rank, size, seed, parameter)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from hpcopt.errors import HpcoptError
from hpcopt.rng import stream

Partitioner = Callable[[int, int, int, int], np.ndarray]
LabelPartitioner = Callable[[np.ndarray, int, int, int, float], np.ndarray]


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


def dirichlet_partition(labels: np.ndarray, rank: int, size: int, alpha: float,
                        seed: int) -> np.ndarray:
    """Dirichlet label skew: rank ``rank``'s sorted shard of ``range(len(labels))``.

    All draws come from ``stream(seed, "dirichlet")`` (the same on every rank). First one random
    sample is dealt to each rank, so no shard is empty (needs ``n >= size``). Then, class by
    class (ascending label), the remaining samples of class c, shuffled, are cut into ``size``
    consecutive pieces with proportions ``p_c ~ Dirichlet(alpha, ..., alpha)``; piece r goes to
    rank r. Small ``alpha`` gives each rank few classes; large ``alpha`` approaches i.i.d.
    """
    labels = _check_labels(labels, rank, size)
    _check_alpha(alpha)
    rng = stream(seed, "dirichlet")
    order = rng.permutation(labels.size)
    owner = np.empty(labels.size, dtype=np.int64)
    owner[order[:size]] = np.arange(size)
    rest = order[size:]
    for label in np.unique(labels):
        members = rest[labels[rest] == label]
        proportions = rng.dirichlet(np.full(size, float(alpha)))
        cuts = np.floor(np.cumsum(proportions)[:-1] * members.size + 0.5).astype(np.int64)
        cuts = np.minimum(cuts, members.size)  # the cumulative sum may pass 1 by rounding
        for r, piece in enumerate(np.split(members, cuts)):
            owner[piece] = r
    return np.flatnonzero(owner == rank).astype(np.int64, copy=False)


def similarity_partition(labels: np.ndarray, rank: int, size: int, similarity: float,
                         seed: int) -> np.ndarray:
    """The CELGC authors' heterogeneous split: rank ``rank``'s sorted shard.

    Per class (shuffled by ``stream(seed, "similarity")``), the first ``round(s * count)``
    samples go to a common pool that is then shuffled, the rest to a pool sorted by label. Each
    rank takes an equal block of both pools: s = 1 is an i.i.d. split, s = 0 a label-sorted one
    (each rank sees one or two classes). The ranks holding one extra sample of the second pool
    start where the first pool's extras end, so shard sizes differ by at most one and none is
    empty when ``n >= size``.
    """
    labels = _check_labels(labels, rank, size)
    _check_similarity(similarity)
    rng = stream(seed, "similarity")
    common, skewed = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        take = math.floor(similarity * members.size + 0.5)
        common.append(members[:take])
        skewed.append(members[take:])
    common_pool = rng.permutation(np.concatenate(common))
    skewed_pool = np.concatenate(skewed)  # sorted by label
    start, stop = _block_range(common_pool.size, rank, size)
    shifted = (rank - common_pool.size % size) % size
    start2, stop2 = _block_range(skewed_pool.size, shifted, size)
    shard = np.concatenate([common_pool[start:stop], skewed_pool[start2:stop2]])
    return np.sort(shard).astype(np.int64, copy=False)


def _check_labels(labels: np.ndarray, rank: int, size: int) -> np.ndarray:
    """``labels`` as int64, checked to be 1-D integers with at least one sample per rank."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise HpcoptError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    _block_range(labels.size, rank, size)  # validates rank and size
    if labels.size < size:
        raise HpcoptError(f"{size} ranks but only {labels.size} samples: "
                          "every rank needs at least one")
    return labels.astype(np.int64, copy=False)


def _check_alpha(alpha: float) -> None:
    if not (alpha > 0 and math.isfinite(alpha)):
        raise HpcoptError(f"Dirichlet alpha must be a positive number, got {alpha}")


def _check_similarity(similarity: float) -> None:
    if not 0 <= similarity <= 1:
        raise HpcoptError(f"similarity s must be in [0, 1], got {similarity}")


_PARTITIONERS: dict[str, Partitioner] = {
    "block": lambda n, rank, size, _seed: block_partition(n, rank, size),
    "iid": iid_partition,
}

_LABEL_PARTITIONERS: dict[str, tuple[str, LabelPartitioner]] = {
    "dirichlet": ("alpha",
                  lambda y, rank, size, seed, a: dirichlet_partition(y, rank, size, a, seed)),
    "similarity": ("similarity",
                   lambda y, rank, size, seed, s: similarity_partition(y, rank, size, s, seed)),
}

PARTITION_KINDS: tuple[str, ...] = (*_PARTITIONERS, *_LABEL_PARTITIONERS)


def partition_indices(kind: str, n: int, rank: int, size: int, seed: int, *,
                      labels: np.ndarray | None = None, alpha: float | None = None,
                      similarity: float | None = None) -> np.ndarray:
    """The int64 sample indices that ``rank`` of ``size`` owns under partition ``kind``.

    ``dirichlet`` needs ``labels`` (length n) and ``alpha``; ``similarity`` needs ``labels`` and
    ``similarity`` (s). Parameters a kind does not use are ignored.
    """
    if kind not in PARTITION_KINDS:
        raise HpcoptError(f"unknown partition {kind!r}; valid: {', '.join(PARTITION_KINDS)}")
    if size > n:
        raise HpcoptError(f"{size} ranks but only {n} samples: every rank needs at least one")
    if kind in _PARTITIONERS:
        return _PARTITIONERS[kind](n, rank, size, seed)
    name, partitioner = _LABEL_PARTITIONERS[kind]
    value = {"alpha": alpha, "similarity": similarity}[name]
    if labels is None or value is None:
        raise HpcoptError(f"partition {kind!r} needs the training labels and a value for {name}")
    if len(labels) != n:
        raise HpcoptError(f"partition {kind!r}: {len(labels)} labels for {n} samples")
    return partitioner(labels, rank, size, seed, value)
