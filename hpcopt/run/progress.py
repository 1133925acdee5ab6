"""Progress lines on rank 0: a handful of lines over a run, never one per step."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
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


#: A command that has run this long starts to show its progress, then at most a line this often.
QUIET_SECONDS, EVERY_SECONDS = 3.0, 2.0


class Ticker:
    """Progress of a command that may take a while (``collect``, ``report``), on stderr:
    silent for its first ``quiet`` seconds, then at most a line every ``every`` seconds, and a
    last line (``done``) once it has shown any, so the last line shown holds the final counts."""

    def __init__(self, command: str, quiet: float | None = None, every: float | None = None,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.command = command
        self.quiet = QUIET_SECONDS if quiet is None else quiet
        self.every = EVERY_SECONDS if every is None else every
        self.stream, self.clock = stream, clock
        self.start = clock()
        self.last = -math.inf

    def __call__(self, text: str) -> None:
        now = self.clock()
        if now - self.start < self.quiet or now - self.last < self.every:
            return
        self._show(text, now)

    def done(self, text: str) -> None:
        """The command's last line, shown when it has shown progress (else it was quick)."""
        if self.last > -math.inf:
            self._show(text, self.clock())

    def _show(self, text: str, now: float) -> None:
        self.last = now
        print(f"{self.command}: {text} ({now - self.start:.1f} s)", file=self.stream or sys.stderr,
              flush=True)
