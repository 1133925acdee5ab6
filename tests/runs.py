"""Training runs inside a test process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcopt.comm import Comm
from hpcopt.config import Config
from hpcopt.train import train


def fresh_train(config: Config, resume: str | Path | None = None) -> Any:
    """train() on a new Comm, so each run's counters start from zero as in a new process."""
    comm = Comm()
    try:
        return train(config, comm, verbose=False, resume=resume)
    finally:
        comm.free()
