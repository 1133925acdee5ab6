"""Seeded random streams keyed by purpose and integers (rank, epoch, step, sample, stage).

A stream is a pure function of its key, so any rank can recreate any other rank's stream (PPRS
noise is never sent) and a resumed run draws exactly what the uninterrupted run would have.
"""

from __future__ import annotations

import zlib

import numpy as np


def purpose_id(purpose: str) -> int:
    """A stable 32-bit integer for a purpose name (Python's hash() is salted per process)."""
    return zlib.crc32(purpose.encode("utf-8"))


def stream(seed: int, purpose: str, *key: int) -> np.random.Generator:
    """The generator for ``(seed, purpose, *key)``; independent streams for different keys."""
    if seed < 0 or any(k < 0 for k in key):
        raise ValueError(f"seed and keys must be non-negative, got {seed}, {key}")
    sequence = np.random.SeedSequence(entropy=seed, spawn_key=(purpose_id(purpose), *key))
    return np.random.Generator(np.random.PCG64(sequence))
