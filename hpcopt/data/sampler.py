"""Minibatches from one rank's shard: reshuffled every epoch, incomplete tail dropped.

Epoch ``e`` of rank ``r`` visits the shard in the order ``stream(seed, "sampler", r, e)``
draws and serves ``len(shard) // batch_size`` batches of exactly ``batch_size`` consecutive
entries of that order. The sampler's position is two integers, so a resumed run continues
with exactly the batches the uninterrupted run would have drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hpcopt.errors import HpcoptError
from hpcopt.rng import stream

Array = Any


class MinibatchSampler:
    """Serves batches of global sample indices from ``indices`` (this rank's shard).

    ``epoch`` is the epoch the next batch comes from and ``position`` the number of its batches
    already served (``0 <= position < batches_per_epoch``): after the last batch of an epoch the
    sampler moves on to ``(epoch + 1, 0)``.
    """

    def __init__(self, indices: np.ndarray, batch_size: int, seed: int, rank: int) -> None:
        shard = np.array(indices, dtype=np.int64)
        if shard.ndim != 1:
            raise ValueError(f"indices must be one-dimensional, got shape {shard.shape}")
        if batch_size < 1:
            raise HpcoptError(f"batch size must be at least 1, got {batch_size}")
        if batch_size > shard.size:
            raise HpcoptError(
                f"batch size {batch_size} is larger than the shard of rank {rank} "
                f"({shard.size} samples)"
            )
        shard.setflags(write=False)
        self._shard = shard
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.batches_per_epoch = shard.size // batch_size
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order = shard[:0]
        self._placed_epoch = -1
        self._placed_order: Array = None

    def _epoch_order(self) -> np.ndarray:
        """The current epoch's visiting order, drawn once per epoch."""
        if self._order_epoch != self.epoch:
            rng = stream(self.seed, "sampler", self.rank, self.epoch)
            self._order = rng.permutation(self._shard)
            self._order_epoch = self.epoch
        return self._order

    def next_batch(self) -> np.ndarray:
        """The next ``batch_size`` global sample indices (a fresh int64 array)."""
        return self._advance(self._epoch_order()).copy()

    def next_batch_placed(self, place: Callable[[np.ndarray], Array]) -> Array:
        """The same batch as ``next_batch``, as a read-only slice of ``place(epoch order)``:
        with ``place`` a copy to the GPU, one host-to-device copy per epoch instead of one per
        step."""
        if self._placed_epoch != self.epoch:
            self._placed_order = place(self._epoch_order())
            self._placed_epoch = self.epoch
        return self._advance(self._placed_order)

    def _advance(self, order: Array) -> Array:
        """The current batch's slice of ``order``; moves the position on by one batch."""
        start = self.position * self.batch_size
        batch = order[start : start + self.batch_size]
        self.position += 1
        if self.position == self.batches_per_epoch:
            self.epoch += 1
            self.position = 0
        return batch

    def state(self) -> dict[str, int]:
        """Where the sampler stands, plus the settings a resumed sampler must share."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "batch_size": self.batch_size,
            "shard_size": int(self._shard.size),
            "seed": self.seed,
            "rank": self.rank,
        }

    def restore(self, state: dict) -> None:
        """Continue from ``state`` (from ``state()``); HpcoptError if it is malformed, out of
        range, or was saved by a sampler with another batch size, shard size, seed or rank."""
        expected = self.state()
        if set(state) != set(expected):
            raise HpcoptError(
                f"sampler state has keys {sorted(state)}, expected {sorted(expected)}"
            )
        for key, value in state.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise HpcoptError(f"sampler state {key!r} must be an integer, got {value!r}")
        for key in ("batch_size", "shard_size", "seed", "rank"):
            if state[key] != expected[key]:
                raise HpcoptError(
                    f"sampler state was saved with {key} {state[key]}, "
                    f"but this run has {key} {expected[key]}"
                )
        if state["epoch"] < 0:
            raise HpcoptError(f"sampler state epoch must be non-negative, got {state['epoch']}")
        if not 0 <= state["position"] < self.batches_per_epoch:
            raise HpcoptError(
                f"sampler state position {state['position']} is outside "
                f"0..{self.batches_per_epoch - 1} (batches per epoch)"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
