"""Array backend: NumPy on CPU, CuPy on GPU, behind one small object.

Code on the hot path uses ``backend.xp`` (the array module) and never calls NumPy directly,
so the same layers and algorithms run on either. CuPy is imported only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from .errors import UserError

DEVICES = ("cpu", "gpu")


@dataclass(frozen=True)
class Backend:
    """The array module of a run and the few operations that differ between devices."""

    name: str
    xp: ModuleType

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"

    def synchronize(self) -> None:
        """Wait for queued device work (before MPI touches device memory, and for timing)."""
        if self.is_gpu:
            self.xp.cuda.get_current_stream().synchronize()

    def to_host(self, array: Any) -> np.ndarray:
        """A NumPy copy (GPU) or the array itself (CPU)."""
        return self.xp.asnumpy(array) if self.is_gpu else np.asarray(array)

    def asarray(self, array: Any, dtype: Any = None) -> Any:
        """Move host data to this backend's device (no copy on CPU when nothing changes)."""
        return self.xp.asarray(array, dtype=dtype)


CPU = Backend("cpu", np)


def array_module(array: Any) -> ModuleType:
    """numpy or cupy, whichever ``array`` belongs to (cupy is only imported for cupy arrays)."""
    if isinstance(array, np.ndarray) or np.isscalar(array):
        return np
    import cupy  # pragma: no cover - GPU only

    return cupy.get_array_module(array)  # pragma: no cover - GPU only


def get_backend(device: str = "cpu") -> Backend:
    """The backend for ``device`` ('cpu' or 'gpu'); a clear error when CuPy or a GPU is missing."""
    if device == "cpu":
        return CPU
    if device != "gpu":
        raise UserError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise UserError("device 'gpu' needs CuPy: pip install 'hpcopt[gpu]'") from exc
    if not cupy.cuda.is_available():  # pragma: no cover - depends on the machine
        raise UserError("device 'gpu' was asked for but CuPy finds no CUDA device")
    return Backend("gpu", cupy)
