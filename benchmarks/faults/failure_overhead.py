"""Cost of the failure handling in the default PR-SGD job: the stall watchdog and NaN skipping.

Run under MPI (rank 0 prints)::

    mpiexec -n 2 python benchmarks/faults/failure_overhead.py [--pairs 15] [--steps 200]

The job is the default one (MLP 784-512-256-10 on MNIST-5k, PR-SGD with I = 8, batch 32 per
rank, float32), cut to ``--steps`` steps, without files. Modes, run back to back in an order
that rotates every round, so each round sees about the same load from other programs:

- ``base``: ``--stall-timeout 0 --on-nonfinite stop`` (the defaults: no per-step work at all);
- ``watchdog``: ``--stall-timeout 10`` (a thread per rank that wakes every 0.5 s);
- ``skip``: ``--on-nonfinite skip`` (a dot product and two scalars to the host every step).

Reported: each mode's median wall time per step (start barrier to end, as the run summary
measures it), and the median over rounds of t(mode) / t(base) - 1. For the watchdog also the
time one wake-up of its thread takes (median over all wake-ups), measured directly.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt.comm import Comm  # noqa: E402
from hpcopt.config import build_config  # noqa: E402
from hpcopt import train  # noqa: E402
from hpcopt.run.watchdog import Watchdog  # noqa: E402

MODES = {"base": {}, "watchdog": {"stall_timeout": "10"}, "skip": {"on_nonfinite": "skip"}}
WAKE_UPS: list[float] = []


def instrument() -> None:
    """Time every wake-up of the watchdog thread (its status look-up and query check)."""
    status, answer = Watchdog.status, Watchdog._answer

    def timed_status(self: Watchdog) -> dict:
        start = time.perf_counter()
        try:
            return status(self)
        finally:
            WAKE_UPS.append(time.perf_counter() - start)

    def timed_answer(self: Watchdog, request, query):
        start = time.perf_counter()
        try:
            return answer(self, request, query)
        finally:
            WAKE_UPS.append(time.perf_counter() - start)

    Watchdog.status, Watchdog._answer = timed_status, timed_answer


def run(steps: int, options: dict[str, str]) -> float:
    """Wall seconds per step of one run (the summary's, max over ranks)."""
    config = build_config(None, {"steps": str(steps), "progress": "false", **options})
    comm = Comm()
    try:
        summary, _ = train(config, comm, verbose=False)
    finally:
        comm.free()
    return summary.wall_seconds / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per run")
    parser.add_argument("--pairs", type=int, default=15, help="rounds (each runs every mode)")
    args = parser.parse_args()
    instrument()
    run(args.steps // 4, {})  # imports, data, first touch
    names = list(MODES)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(args.pairs):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for name in order:
            times[name].append(run(args.steps, MODES[name]))
    probe = Comm()
    rank, size = probe.rank, probe.size
    probe.free()
    if rank != 0:
        return
    print(f"default PR-SGD job, {size} rank(s), {args.pairs} rounds of {args.steps}-step runs")
    print(f"  {'mode':<9} {'ms/step':>8}  {'vs base (median of ratios)':>27}")
    for name in names:
        ratios = [t / b for t, b in zip(times[name], times["base"])]
        low, _, high = statistics.quantiles(ratios, n=4)
        print(f"  {name:<9} {1e3 * statistics.median(times[name]):8.3f}  "
              f"{100 * (statistics.median(ratios) - 1):+7.2f}% (quartiles {100 * (low - 1):+.2f}% .. "
              f"{100 * (high - 1):+.2f}%)")
    if WAKE_UPS:
        print(f"  watchdog thread: {len(WAKE_UPS)} timed calls on rank 0, median "
              f"{1e6 * statistics.median(WAKE_UPS):.1f} us each (2 per wake-up, every 0.5 s)")


if __name__ == "__main__":
    main()
