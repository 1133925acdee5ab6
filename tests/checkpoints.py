"""A small real checkpoint and a field-by-field comparison of loaded checkpoints: shared by the
checkpoint property tests and the byte-edit probe (benchmarks/faults/checkpoint_fuzz.py)."""

from __future__ import annotations

from pathlib import Path

from hpcopt.config import build_config
from hpcopt.io.data_parallel_checkpoint import Checkpoint
from tests.runs import fresh_train


def small_checkpoint(out: Path) -> Path:
    """PR-SGD on 1 rank, MLP 64-12-10 on digits, momentum 0.9, I = 4, checkpoint at tick 6
    (mid-round: every kind of per-rank dataset); its path."""
    fresh_train(build_config(None, {"dataset": "digits", "hidden": "12", "steps": "6", "interval": "4",
                                    "momentum": "0.9", "progress": "false", "out": str(out)}))
    return out / "checkpoints" / "step-000000006.h5"


def differences(a: Checkpoint, b: Checkpoint) -> list[str]:
    """The fields in which two loaded checkpoints differ (bitwise for arrays); [] when equal."""
    found = []
    for name in ("model", "sampler", "window"):
        x, y = getattr(a, name), getattr(b, name)
        if x.shape != y.shape or x.tobytes() != y.tobytes():
            found.append(name)
    for name in ("counters", "scalars", "rows", "shared"):  # name -> array
        x, y = getattr(a, name), getattr(b, name)
        if sorted(x) != sorted(y):
            found.append(name)
        found += [f"{name}/{n}" for n in x if n in y and x[n].tobytes() != y[n].tobytes()]
    for name in ("config", "world_size", "tick", "run_id", "trace_rows", "wall_seconds", "comm"):
        if getattr(a, name) != getattr(b, name):
            found.append(name)
    if a.layout.entries != b.layout.entries:
        found.append("layout")
    return found
