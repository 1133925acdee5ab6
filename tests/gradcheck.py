"""Central finite differences, the yardstick for every backward pass in the tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def numeric_grad(f: Callable[[], float], x: Any, eps: float = 1e-6) -> np.ndarray:
    """d f() / d x by central differences, perturbing ``x`` (a contiguous NumPy or CuPy array)
    in place one entry at a time; the result is a NumPy array of ``x``'s shape and dtype."""
    if not x.flags.c_contiguous:
        raise ValueError("numeric_grad perturbs x through a flat view: x must be contiguous")
    flat = x.reshape(-1)  # a view: writing it perturbs x on its own device
    grad = np.zeros(x.size, dtype=x.dtype)
    for i in range(x.size):
        old = flat[i].copy()
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad.reshape(x.shape)
