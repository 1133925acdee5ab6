"""Freed memory kept for the next step: glibc malloc's settings for a training loop on the CPU.

Every step's forward and backward allocate the same transient tensors (activations, autograd's
fresh gradients) and free them again. With glibc's defaults a freed block goes back to the
operating system when it was mapped on its own (above the dynamic mmap threshold) or when it
leaves more than the trim threshold free at the top of the heap, so the next step maps it
again and the kernel zeroes it page by page on first touch: thousands of page faults per step
on an 11 M-parameter ResNet-18 (docs/torch.md, Speed). ``keep_freed_memory`` sets
M_MMAP_THRESHOLD to glibc's largest, 32 MiB (blocks up to that size come from the heap) and
M_TRIM_THRESHOLD to 1 GiB (the heap is not trimmed below that), so each step reuses the
memory of the step before; the process keeps its peak heap, which a training loop reaches
every step anyway. Values and results are unchanged: only where memory comes from.

Process-wide, once, on glibc only; a process whose environment sets glibc's own malloc
settings (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, or ``glibc.malloc`` in
``GLIBC_TUNABLES``) is left as it is.
"""

from __future__ import annotations

import ctypes
import functools
import os

#: mallopt's parameter numbers (glibc malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's maximum on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 1 << 30
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds as above (once per process); whether they were set."""
    if not glibc() or user_settings():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - a libc without mallopt
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def glibc() -> bool:
    """Whether this process runs on glibc."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):  # no such name on this system
        return False


def user_settings() -> bool:
    """Whether the environment sets glibc's malloc thresholds itself."""
    return (any(name in os.environ for name in USER_SETTINGS)
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""))
