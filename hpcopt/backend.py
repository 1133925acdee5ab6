"""Array backend: NumPy on CPU, CuPy on GPU, behind one small object.

Code on the hot path uses ``backend.xp`` (the array module) and never calls NumPy directly,
so the same layers and algorithms run on either. CuPy is imported only when asked for.

On GPU each rank uses one device, chosen by its rank on the node (``Comm.local_rank``, from a
shared-memory split of the communicator), never by its global rank: rank 9 of a job with 4
GPUs per node is local rank 1 of its node and takes device 1 there.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from .errors import HpcoptError

DEVICES = ("cpu", "gpu")  # NumPy, or CuPy on the GPU of each node-local rank


@dataclass(frozen=True)
class Backend:
    """The array module of a run and the few operations that differ between devices.

    ``device`` is the CUDA device index the arrays live on (0 for the CPU backend).
    """

    name: str
    xp: ModuleType
    device: int = 0

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

    def floats_to_host(self, scalars: list[Any]) -> list[float]:
        """Python floats of a list of 0-d arrays or scalars: one device-to-host copy on the GPU
        for all of them (for logging and evaluation totals, never one transfer per value)."""
        if not self.is_gpu:
            return np.array(scalars, dtype=np.float64).tolist()  # np.stack: ~2 us a 0-d array
        on_device = [v for v in scalars if not _on_host(v)]
        copied = iter(self.to_host(self.xp.stack([v.astype(self.xp.float64) for v in on_device]))
                      .tolist() if on_device else ())
        return [float(v) if _on_host(v) else next(copied) for v in scalars]

    def empty_pinned(self, size: int, dtype: Any) -> np.ndarray:
        """A 1-d host array in page-locked memory (GPU; the fastest copies) or plain memory (CPU)."""
        if self.is_gpu:
            import cupyx  # pragma: no cover - GPU only

            return cupyx.empty_pinned(size, dtype=dtype)  # pragma: no cover - GPU only
        return np.empty(size, dtype=dtype)

    def copy_to_host_(self, source: Any, out: np.ndarray) -> np.ndarray:
        """Copy a contiguous device array into the host array ``out`` (same size); returns ``out``
        once the copy has finished."""
        if self.is_gpu:
            self.xp.asnumpy(source.reshape(-1), out=out)  # pragma: no cover - GPU only
        else:
            np.copyto(out, source.reshape(-1))
        return out

    def copy_from_host_(self, target: Any, source: np.ndarray) -> Any:
        """Copy the host array ``source`` into the contiguous device array ``target``; returns
        ``target`` once the copy has finished (so ``source`` may be reused at once)."""
        if self.is_gpu:
            target.reshape(-1).set(source)  # pragma: no cover - GPU only
            self.synchronize()  # pragma: no cover - GPU only
        else:
            np.copyto(target.reshape(-1), source)
        return target


CPU = Backend("cpu", np)


def _on_host(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, int, float))


def array_module(array: Any) -> ModuleType:
    """numpy or cupy, whichever ``array`` belongs to (cupy is only imported for cupy arrays)."""
    if isinstance(array, np.ndarray) or np.isscalar(array):
        return np
    import cupy  # pragma: no cover - GPU only

    return cupy.get_array_module(array)  # pragma: no cover - GPU only


def gpu_for_local_rank(local_rank: int, count: int) -> int:
    """The device of the rank with this node-local rank: ``local_rank mod count``.

    With one visible device per rank (a launcher that sets ``CUDA_VISIBLE_DEVICES`` per rank)
    this is 0 for everyone; with more ranks than devices on a node, ranks share devices.
    """
    if count < 1:
        raise HpcoptError("device 'gpu' was asked for but CuPy finds no CUDA device")
    return local_rank % count


def get_backend(device: str = "cpu", local_rank: int | None = None) -> Backend:
    """The backend for ``device`` ('cpu' or 'gpu'); a clear error when CuPy or a GPU is missing.

    For 'gpu', ``local_rank`` (this rank's rank on its node) selects the device and makes it
    current; None keeps the current device (the one a previous call selected).
    """
    if device == "cpu":
        return CPU
    if device != "gpu":
        raise HpcoptError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
    try:
        import cupy
    except ImportError:
        raise HpcoptError("device 'gpu' needs CuPy (pip install 'hpcopt[gpu]'), "
                          "which is not installed") from None
    try:
        available = cupy.cuda.is_available()
        count = cupy.cuda.runtime.getDeviceCount() if available else 0
    except Exception as exc:  # a driver or runtime that cannot be loaded: no usable GPU
        raise HpcoptError(f"device 'gpu' was asked for but CUDA is not usable: {exc}") from None
    if local_rank is not None:
        cupy.cuda.Device(gpu_for_local_rank(local_rank, count)).use()
    elif count < 1:
        gpu_for_local_rank(0, count)
    return Backend("gpu", cupy, cupy.cuda.Device().id)
