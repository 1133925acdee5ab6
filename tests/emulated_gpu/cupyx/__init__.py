"""cupyx, emulated alongside tests/emulated_gpu/cupy: pinned host memory is plain host memory."""

from __future__ import annotations

from typing import Any

import cupy
import numpy as _np


def empty_pinned(shape: Any, dtype: Any = float) -> _np.ndarray:
    array = _np.empty(shape, dtype=dtype)
    cupy.cuda.pinned_addresses.add(array.ctypes.data)
    return array


def scatter_add(a: cupy.ndarray, slices: Any, value: Any) -> None:
    cupy.add.at(a, slices, value)
