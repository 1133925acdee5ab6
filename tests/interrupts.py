"""SIGTERM and SIGHUP as a KeyboardInterrupt while a fixture holds something to clean up."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def interrupted_by_sigterm() -> Iterator[None]:
    """SIGTERM (tests/run.sh's timeout) or SIGHUP would end the process with no clean-up: inside,
    each is a KeyboardInterrupt, so pytest stops and a fixture's exit runs; the handlers from
    before are back however the block ends."""
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
