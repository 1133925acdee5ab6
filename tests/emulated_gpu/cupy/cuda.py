"""cupy.cuda, emulated: ``EMULATED_GPU_COUNT`` devices (default 1), one current device per
process, and a stream whose synchronizations are counted."""

from __future__ import annotations

import os
from types import SimpleNamespace


class CUDARuntimeError(RuntimeError):
    pass


#: Start addresses of the host allocations made by cupyx.empty_pinned ("page-locked").
pinned_addresses: set[int] = set()


class runtime:  # noqa: N801  (a namespace, named as in CuPy)
    CUDARuntimeError = CUDARuntimeError

    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802
        return int(os.environ.get("EMULATED_GPU_COUNT", "1"))

    @staticmethod
    def runtimeGetVersion() -> int:  # noqa: N802
        return 0

    @staticmethod
    def getDeviceProperties(device: int) -> dict[str, object]:  # noqa: N802
        """Named so that no table or log can pass an emulated run off as a GPU's."""
        return {"name": b"EMULATED (tests/emulated_gpu: host memory, not a GPU)", "totalGlobalMem": 0}

    @staticmethod
    def pointerGetAttributes(address: int) -> SimpleNamespace:  # noqa: N802
        """type 1 (cudaMemoryTypeHost, page-locked) for cupyx.empty_pinned memory, else 0."""
        return SimpleNamespace(type=1 if address in pinned_addresses else 0)


_current = [0]


def is_available() -> bool:
    return runtime.getDeviceCount() > 0


class Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = _current[0] if device is None else int(device)
        if not 0 <= self.id < runtime.getDeviceCount():
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")

    def use(self) -> None:
        _current[0] = self.id

    def synchronize(self) -> None:
        _count_sync()


class Stream:
    def synchronize(self) -> None:
        _count_sync()


_stream = Stream()


def get_current_stream() -> Stream:
    return _stream


def _count_sync() -> None:
    from . import _count

    _count("sync")
