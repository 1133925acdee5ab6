"""Progress lines on rank 0: a handful of lines over a run, never one per step."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Prints ``step k/T (p%) | loss ... | elapsed, eta`` at about ``lines`` evenly spaced steps."""

    def __init__(self, total: int, enabled: bool, lines: int = 10, stream: TextIO | None = None) -> None:
        self.total, self.enabled = total, enabled
        self.every = max(1, total // max(1, lines))
        self.stream = stream or sys.stdout
        self.start = time.perf_counter()

    def due(self, step: int) -> bool:
        """Whether step ``step`` (1-based) is a reporting point: collectives may follow."""
        return step % self.every == 0 or step == self.total

    def report(self, step: int, text: str) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        eta = elapsed / step * (self.total - step) if step else 0.0
        width = len(str(self.total))
        print(f"step {step:>{width}}/{self.total} ({100 * step / self.total:3.0f}%) | {text} | "
              f"{elapsed:6.1f} s, eta {eta:5.1f} s", file=self.stream, flush=True)
