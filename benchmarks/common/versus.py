"""Timing hpcopt against another framework (PyTorch) on the same step, in one process.

Steps are timed in interleaved rounds (each framework once per round, ``calls`` calls each), so
load that drifts during the run hits every framework alike; the median round is reported.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import ModuleType
from typing import Callable


def seconds_per_call(step: Callable[[], None], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - start) / calls


def interleaved_medians(steps: dict[str, Callable[[], None]], rounds: int,
                        calls: int) -> dict[str, float]:
    """Median seconds per call of each step, after one warm-up call each (workspaces, pools)."""
    for step in steps.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(seconds_per_call(step, calls))
    return {name: statistics.median(t) for name, t in times.items()}


def ratio_to(medians: dict[str, float], name: str, baseline: str = "torch") -> str:
    """``name``'s time over ``baseline``'s, as "1.23x", or "-" without a baseline."""
    return f"{medians[name] / medians[baseline]:.2f}x" if baseline in medians else "-"


def add_timing_options(parser: argparse.ArgumentParser) -> None:
    """--dtype, --rounds and --calls, shared by the comparisons."""
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="calls timed together per round")


def optional_torch() -> ModuleType | None:
    """PyTorch when it is installed (an optional benchmark dependency), else None, said once."""
    try:
        import torch
    except ImportError:
        print("torch is not installed: measuring hpcopt only (pip install torch to compare)")
        return None
    print(f"torch {torch.__version__}")
    return torch
