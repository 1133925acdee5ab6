"""What the benchmarks share: byte sizes, parsing, timing with a barrier, medians over ranks."""

from __future__ import annotations

import argparse
import json
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from ..errors import HpcoptError

KB, MB = 1 << 10, 1 << 20


class _DefaultsShown(argparse.HelpFormatter):
    """Help that ends each option's text with its default, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text and action.option_strings and action.default not in (None, argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse that raises HpcoptError (one line, exit code 2) instead of printing usage, and
    whose help shows every option's default."""

    def __init__(self, **kwargs: typing.Any) -> None:
        super().__init__(formatter_class=_DefaultsShown, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        raise HpcoptError(f"{self.prog}: {message}")


def parse_bytes(text: str) -> int:
    """'4096', '4K', '4KB', '16M', '1G' -> bytes (binary units)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": KB, "M": MB, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)
    except ValueError:
        raise HpcoptError(f"not a size: {text!r} (e.g. 4096, 64K, 16M)") from None


def fmt_bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", MB), ("KB", KB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def sizes_between(low: int, high: int, factor: int = 2) -> list[int]:
    if low < 1 or high < low or factor < 2:
        raise HpcoptError("sizes need 1 <= --min-bytes <= --max-bytes and --factor >= 2")
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def repetitions(one_call: float, budget: float, min_reps: int, max_reps: int, mpi: MPI.Comm) -> int:
    """Repetitions that fit ``budget`` seconds given the slowest rank's warm-up call (agreed)."""
    slowest = mpi.allreduce(one_call, op=MPI.MAX)
    return int(max(min_reps, min(max_reps, budget / max(slowest, 1e-9))))


def timed(mpi: MPI.Comm, fn: Callable[[], Any], reps: int) -> np.ndarray:
    """Per repetition, the slowest rank's time of ``fn`` (a barrier before each call)."""
    times = np.empty(reps)
    for r in range(reps):
        mpi.Barrier()
        start = time.perf_counter()
        fn()
        times[r] = time.perf_counter() - start
    mpi.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return times


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
    except OSError as exc:
        raise HpcoptError(f"cannot write {path}: {exc.strerror or exc}") from None


