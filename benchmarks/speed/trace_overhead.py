"""Cost of the run trace in the default PR-SGD job: tracing on vs off, per step.

Run under MPI (rank 0 prints)::

    mpiexec -n 4 python benchmarks/speed/trace_overhead.py
    mpiexec -n 4 python benchmarks/speed/trace_overhead.py --pairs 40 --json docs/results/trace-overhead-4.json

The job is the default one (MLP 784-512-256-10 on MNIST-5k, PR-SGD with I = 8, batch 32 per rank,
float32) with its default trace settings; only the length is cut. "off" is ``--trace false``
with ``trace_every`` longer than the run: no gradient norm, no trace file and no window
reductions along the way (what a run without any trace costs; note that with ``--trace false``
alone the window reductions, which carry progress and the SIGTERM flag, would still run).
Checkpoints are switched off in both modes (they are not tracing, and their disk writes would
only add noise).

Two measurements:

- wall: the two modes run back to back as a pair of short runs (the order alternates), for
  many pairs; the overhead is the median over pairs of t(on) / t(off) - 1, t being a run's wall
  time per step from the start barrier to the end (set-up and data loading excluded, the final
  evaluation included, the same in both modes). A pair sees about the same load from other
  programs, but on a busy machine the spread is still wide.
- attributed: in the "on" runs, the time spent in the trace's own code (the gradient-norm dot
  product, keeping the losses, the rows: starting and finishing the window reductions, row
  assembly, buffered HDF5 writes) divided by the rest of the run's time. Much less sensitive
  to other load, since both parts slow down together; it misses only the progress that the
  non-blocking reductions make inside other MPI calls.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt import train  # noqa: E402
from hpcopt.comm import Comm  # noqa: E402
from hpcopt.config import build_config  # noqa: E402
from hpcopt.run.window import Window  # noqa: E402
from hpcopt.run.data_parallel import DataParallelSession  # noqa: E402

MODES = ("off", "on")


SPENT = {"oracle": 0.0, "traced": 0.0, "add": 0.0, "row": 0.0}


def _timed(name: str, function: Callable) -> Callable:
    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args)
        finally:
            SPENT[name] += time.perf_counter() - start
    return timed


def instrument() -> None:
    """Time the trace's code: its part of the oracle (the dot), Window.add and the session's row.
    Checkpoints are switched off (not tracing; their disk writes would only add noise)."""
    traced = Window.traced
    Window.traced = lambda self, oracle: _timed("traced", traced(self, _timed("oracle", oracle)))
    Window.add = _timed("add", Window.add)
    DataParallelSession.row = _timed("row", DataParallelSession.row)
    DataParallelSession.save = lambda self, tick: None


def run(steps: int, trace: bool, out: Path) -> tuple[float, float]:
    """(wall seconds per step, trace-code seconds / other seconds) of a default job, rank 0's."""
    options = {"steps": str(steps), "progress": "false", "out": str(out)}
    if not trace:
        options.update(trace="false", trace_every=str(10 * steps))
    config = build_config(None, options)
    for key in SPENT:
        SPENT[key] = 0.0
    comm = Comm()
    try:
        summary, _ = train(config, comm, verbose=False)
    finally:
        comm.free()
    tracing = SPENT["traced"] - SPENT["oracle"] + SPENT["add"] + SPENT["row"]
    return summary.wall_seconds / steps, tracing / (summary.wall_seconds - tracing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per run")
    parser.add_argument("--pairs", type=int, default=25)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    instrument()
    probe = Comm()
    rank, size = probe.rank, probe.size
    root = Path(probe.mpi.bcast(tempfile.mkdtemp(prefix="hpcopt-trace-bench-") if rank == 0 else None))
    probe.free()
    run(args.steps // 4, True, root / "warm-up")  # imports, data, first touch
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    attributed = []
    for pair in range(args.pairs):
        for mode in MODES if pair % 2 == 0 else MODES[::-1]:
            seconds, share = run(args.steps, mode == "on", root / f"{pair}-{mode}")
            times[mode].append(seconds)
            if mode == "on":
                attributed.append(share)
    if rank != 0:
        return
    shutil.rmtree(root, ignore_errors=True)
    ratios = [on / off for on, off in zip(times["on"], times["off"])]
    defaults = build_config()
    result = {"ranks": size, "steps": args.steps, "pairs": args.pairs,
              "trace_every": defaults.run.trace_every, "interval": defaults.algorithm.interval,
              "ms_per_step": {m: [1e3 * t for t in times[m]] for m in MODES},
              "median_ms_per_step": {m: 1e3 * statistics.median(times[m]) for m in MODES},
              "overhead": statistics.median(ratios) - 1,
              "overhead_quartiles": [q - 1 for q in statistics.quantiles(ratios, n=4)],
              "attributed": statistics.median(attributed),
              "attributed_quartiles": statistics.quantiles(attributed, n=4)}
    print(f"default PR-SGD job, {size} rank(s), I={result['interval']}, "
          f"trace_every={result['trace_every']}, {args.pairs} pairs of {args.steps}-step runs")
    for mode in MODES:
        print(f"  tracing {mode:<3}  median {result['median_ms_per_step'][mode]:.3f} ms/step")
    low, _, high = result["overhead_quartiles"]
    print(f"  wall       {100 * result['overhead']:+.2f}% (median over pairs of t(on)/t(off) - 1; "
          f"quartiles {100 * low:+.2f}% .. {100 * high:+.2f}%)")
    low, _, high = result["attributed_quartiles"]
    print(f"  attributed {100 * result['attributed']:.2f}% (time in trace code / the rest, median; "
          f"quartiles {100 * low:.2f}% .. {100 * high:.2f}%)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
