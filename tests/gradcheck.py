"""Central finite differences, the yardstick for every backward pass in the tests."""

from __future__ import annotations

from typing import Callable

import numpy as np


def numeric_grad(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d f() / d x by central differences, perturbing ``x`` in place one entry at a time."""
    grad = np.zeros_like(x)
    for i in range(x.size):
        old = x.flat[i]
        x.flat[i] = old + eps
        up = f()
        x.flat[i] = old - eps
        down = f()
        x.flat[i] = old
        grad.flat[i] = (up - down) / (2 * eps)
    return grad
