"""A stand-in GPU for testing the device-buffer paths of Comm on a machine without one.

``FakeDeviceArray`` holds host memory but offers MPI only ``__cuda_array_interface__`` (no
buffer protocol), which mpi4py accepts like a CuPy array: the straight-through path hands it
to MPI as a "device" pointer, and since the memory is really on the host MPI can read it.
``FakeDeviceBackend`` is a Backend whose copies and stream synchronizations are logged in
``events`` ("sync", "d2h", "h2d", and "mpi" each time MPI reads an array's interface), so a
test can check what happened in which order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from hpcopt.backend import Backend


class FakeDeviceArray:
    """A contiguous array in host memory that MPI sees only through ``__cuda_array_interface__``."""

    def __init__(self, host: np.ndarray, events: list[str]) -> None:
        assert host.flags.c_contiguous
        self.host, self.events = host, events

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self.events.append("mpi")
        return {"shape": self.host.shape, "typestr": self.host.dtype.str,
                "data": (self.host.ctypes.data, False), "version": 3, "strides": None,
                "stream": None}

    shape = property(lambda self: self.host.shape)
    size = property(lambda self: self.host.size)
    dtype = property(lambda self: self.host.dtype)
    nbytes = property(lambda self: self.host.nbytes)
    itemsize = property(lambda self: self.host.itemsize)

    def reshape(self, *shape: Any) -> FakeDeviceArray:
        return FakeDeviceArray(self.host.reshape(*shape), self.events)

    def __getitem__(self, index: Any) -> FakeDeviceArray:
        return FakeDeviceArray(self.host[index], self.events)

    def __itruediv__(self, value: float) -> FakeDeviceArray:
        self.host /= value
        return self


@dataclass(frozen=True)
class FakeDeviceBackend(Backend):
    """A "gpu" backend over FakeDeviceArray, logging synchronizations and copies."""

    name: str = "gpu"
    xp: ModuleType = np
    device: int = 0
    events: list[str] = field(default_factory=list, compare=False)

    def synchronize(self) -> None:
        self.events.append("sync")

    def to_host(self, array: Any) -> np.ndarray:
        return array.host.copy()

    def asarray(self, array: Any, dtype: Any = None) -> FakeDeviceArray:
        return FakeDeviceArray(np.array(array, dtype=dtype), self.events)

    def empty_pinned(self, size: int, dtype: Any) -> np.ndarray:
        return np.empty(size, dtype=dtype)

    def copy_to_host_(self, source: Any, out: np.ndarray) -> np.ndarray:
        self.events.append("d2h")
        np.copyto(out, source.host.reshape(-1))
        return out

    def copy_from_host_(self, target: Any, source: np.ndarray) -> Any:
        self.events.append("h2d")
        np.copyto(target.host.reshape(-1), source)
        return target
