"""Standard augmentation for CIFAR-like NCHW batches: random crop with zero padding, then a random
horizontal flip (the CIFAR ResNet recipe: pad 4, crop 32x32, flip with probability 1/2).

The draws for a batch are a pure function of (seed, rank, epoch, batch index), from
``stream(seed, "augment", rank, epoch, batch)``: every rank augments differently, nothing needs
saving in a checkpoint, and a resumed run augments exactly as the uninterrupted one. The draws
are made on the host; the crop and flip are one gather on the batch's own device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcopt.backend import array_module
from hpcopt.errors import HpcoptError
from hpcopt.rng import stream

Array = Any


def crop_flip(images: Array, top: Array, left: Array, flip: Array, pad: int) -> Array:
    """out[n, :, r, c] = P[n, :, top[n] + r, left[n] + (W - 1 - c if flip[n] else c)], with P the
    images zero-padded by ``pad`` on each side: an H x W window of the padded image, mirrored
    left-right where ``flip``. Offsets are in 0..2 pad; the result is a new array."""
    xp = array_module(images)
    n, c, h, w = images.shape
    padded = xp.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=images.dtype)
    padded[:, :, pad:pad + h, pad:pad + w] = images
    columns = xp.arange(w)
    flip = xp.asarray(flip, dtype=bool)[:, None]
    rows = xp.asarray(top)[:, None] + xp.arange(h)
    cols = xp.asarray(left)[:, None] + xp.where(flip, w - 1 - columns, columns)
    return padded[xp.arange(n)[:, None, None, None], xp.arange(c)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]


@dataclass(frozen=True)
class Augmentation:
    """Random crop after zero padding by ``pad`` (0: none) and, if ``flip``, a horizontal flip
    with probability 1/2; call it as ``augment(images, epoch, batch)``."""

    seed: int
    rank: int
    pad: int = 4
    flip: bool = True

    def __post_init__(self) -> None:
        if self.pad < 0:
            raise HpcoptError(f"augmentation padding must be >= 0, got {self.pad}")

    def draws(self, n: int, epoch: int, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(top, left, flip) for the ``n`` images of batch ``batch`` of epoch ``epoch``."""
        rng = stream(self.seed, "augment", self.rank, epoch, batch)
        top, left = rng.integers(0, 2 * self.pad + 1, size=(2, n))
        flip = rng.random(n) < 0.5 if self.flip else np.zeros(n, dtype=bool)
        return top, left, flip

    def __call__(self, images: Array, epoch: int, batch: int) -> Array:
        if images.ndim != 4:
            raise ValueError(f"augmentation needs NCHW images, got shape {images.shape}")
        draws = np.stack(self.draws(images.shape[0], epoch, batch))  # (3, n) int64
        top, left, flip = array_module(images).asarray(draws)  # one host-to-device copy
        return crop_flip(images, top, left, flip, self.pad)
