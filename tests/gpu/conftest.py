"""The GPU tests run only where CuPy finds a CUDA device; everywhere else each test is skipped
with the reason (CuPy missing, no device, CUDA unusable), so the suite still collects them."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def gpu_missing() -> str | None:
    """Why the GPU tests cannot run here, or None when they can."""
    try:
        import cupy
    except ImportError:
        return "no GPU here: CuPy is not installed (pip install 'hpcopt[gpu]')"
    try:
        count = cupy.cuda.runtime.getDeviceCount() if cupy.cuda.is_available() else 0
    except Exception as exc:  # a missing driver raises from the runtime
        return f"no GPU here: CUDA is not usable ({exc})"
    return None if count else "no GPU here: CuPy finds no CUDA device"


@pytest.fixture(autouse=True)
def _needs_gpu():
    reason = gpu_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def cupy():
    import cupy

    return cupy
