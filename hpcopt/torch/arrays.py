"""Tensors over backend arrays without a copy: NumPy through ``torch.from_numpy``, CuPy (or any
DLPack producer) through ``torch.from_dlpack``; and the dtypes both sides share."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..backend import Backend

Array = Any

#: The parameter dtypes a flat vector can hold (hpcopt's algorithms run in float32 or float64).
DTYPES: dict[np.dtype, torch.dtype] = {np.dtype(np.float32): torch.float32,
                                       np.dtype(np.float64): torch.float64}


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a NumPy dtype (or its name); ValueError outside ``DTYPES``."""
    key = np.dtype(dtype)
    if key not in DTYPES:
        raise ValueError(f"dtype {key} is not supported: choose float32 or float64")
    return DTYPES[key]


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The NumPy dtype of a torch dtype in ``DTYPES``."""
    for key, value in DTYPES.items():
        if value == dtype:
            return key
    raise ValueError(f"dtype {dtype} is not supported: choose torch.float32 or torch.float64")


def device_of(backend: Backend) -> torch.device:
    """Where torch must put tensors that share memory with ``backend``'s arrays."""
    return torch.device("cuda", backend.device) if backend.is_gpu else torch.device("cpu")


def as_tensor(array: Array) -> torch.Tensor:
    """A tensor sharing ``array``'s memory: writes through either are seen by the other."""
    if isinstance(array, np.ndarray):
        return torch.from_numpy(array)
    return torch.from_dlpack(array)  # pragma: no cover - GPU only


def as_array(tensor: torch.Tensor, backend: Backend) -> Array:
    """A ``backend`` array sharing ``tensor``'s memory (the tensor must not require grad)."""
    if backend.is_gpu:
        return backend.xp.from_dlpack(tensor)  # pragma: no cover - GPU only
    return tensor.numpy()
