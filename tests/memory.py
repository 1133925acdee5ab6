"""Peak Python-heap allocation of one call, for "works in place" checks (tracemalloc sees numpy)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any


def peak_allocation(call: Callable[[], Any]) -> tuple[Any, int]:
    """``(call(), bytes)``: the call's result and the most memory it held allocated at once."""
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - base
