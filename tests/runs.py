"""Training runs inside a test process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hpcopt import train
from hpcopt.algorithms import state as fields
from hpcopt.comm import Comm
from hpcopt.config import Config
from hpcopt.run.faults import FaultPlan
from hpcopt.run.pipeline import train_pipeline
from tests.conftest import host

#: Pipeline trace columns that are measured times, not results.
PIPELINE_TIME_COLUMNS = ("wall", "tau", "modelled_time", "bubble")


def fresh_train(config: Config, resume: str | Path | None = None,
                faults: FaultPlan | None = None) -> Any:
    """train() on a new Comm, so each run's counters start from zero as in a new process;
    ``faults``: this rank's debug fault (hpcopt.run.faults)."""
    return _on_new_comm(train, config, resume, faults)


def fresh_pipeline(config: Config, resume: str | Path | None = None,
                   faults: FaultPlan | None = None) -> Any:
    """train_pipeline() on a new Comm (its own counters and device transport)."""
    return _on_new_comm(train_pipeline, config, resume, faults)


def _on_new_comm(loop: Any, config: Config, resume: str | Path | None,
                 faults: FaultPlan | None) -> Any:
    comm = Comm()
    try:
        return loop(config, comm, verbose=False, resume=resume, faults=faults)
    finally:
        comm.free()


def assert_same_state(a_state: Any, b_state: Any) -> None:
    """Every field the state declares for checkpoints (model, momentum, batch-norm statistics,
    shared vectors, counters, clipping numbers) is bitwise the same."""
    assert type(a_state) is type(b_state)
    arrays = fields.present(a_state, fields.MODEL, fields.VECTOR, fields.SHARED)
    assert arrays == fields.present(b_state, fields.MODEL, fields.VECTOR, fields.SHARED)
    for name in arrays:
        np.testing.assert_array_equal(host(getattr(a_state, name)), host(getattr(b_state, name)),
                                      err_msg=name)
    for kind in (fields.COUNTER, fields.SCALAR, fields.FLAG):
        np.testing.assert_array_equal(list(fields.numbers(a_state, kind).values()),
                                      list(fields.numbers(b_state, kind).values()), err_msg=kind)
