"""Training runs inside a test process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcopt.comm import Comm
from hpcopt.config import Config
from hpcopt.pipeline.run import train_pipeline
from hpcopt import train

#: Pipeline trace columns that are measured times, not results.
PIPELINE_TIME_COLUMNS = ("wall", "tau", "modelled_time", "bubble")


def fresh_train(config: Config, resume: str | Path | None = None) -> Any:
    """train() on a new Comm, so each run's counters start from zero as in a new process."""
    return _on_new_comm(train, config, resume)


def fresh_pipeline(config: Config, resume: str | Path | None = None) -> Any:
    """train_pipeline() on a new Comm (its own counters and device transport)."""
    return _on_new_comm(train_pipeline, config, resume)


def _on_new_comm(loop: Any, config: Config, resume: str | Path | None) -> Any:
    comm = Comm()
    try:
        return loop(config, comm, verbose=False, resume=resume)
    finally:
        comm.free()
