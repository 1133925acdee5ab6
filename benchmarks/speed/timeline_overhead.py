"""Cost of the timeline (``--timeline true``) per step: the same job with and without it.

Run under MPI (rank 0 prints)::

    mpiexec -n 2 python benchmarks/speed/timeline_overhead.py
    mpiexec -n 2 python benchmarks/speed/timeline_overhead.py --rounds 30 --set dataset=digits --set hidden=16

The job is the default one (MLP 784-512-256-10 on MNIST-5k, PR-SGD with I = 8, batch 32 per
rank, float32) unless ``--set KEY=VALUE`` changes it; the trace is on in both modes, with its
defaults. Each round runs the two modes back to back (the order alternates), so both see about
the same load from other programs. Printed:

- a table of the median milliseconds per step of each mode (a run's wall time from the start
  barrier to the end, divided by its steps) and their ratio, the median over rounds of
  t(on) / t(off);
- attributed: the recorder's own cost, less sensitive to other load: its seconds per span
  (``Recorder.communicated`` timed in a loop within a step, each call making a communication
  and a compute span) times the spans per step, plus the timeline's gathers (label "timeline",
  rank 0's seconds), over the step time without it.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt import train  # noqa: E402
from hpcopt.comm import Comm  # noqa: E402
from hpcopt.config import build_config  # noqa: E402
from hpcopt.io.timeline import read_timeline  # noqa: E402
from hpcopt.run.recorder import Recorder  # noqa: E402

MODES = ("off", "on")


def run(options: dict[str, str], timeline: bool, out: Path) -> tuple[float, float, int]:
    """(wall seconds per step, rank 0's timeline-gather seconds, spans in the file) of one run."""
    config = build_config(None, {**options, "progress": "false", "out": str(out),
                                 "timeline": str(timeline).lower()})
    comm = Comm()
    try:
        summary, _ = train(config, comm, verbose=False)
        gathers = comm.stats.totals("timeline").seconds
    finally:
        comm.free()
    spans = 0
    if timeline and comm.rank == 0:
        recorded = read_timeline(out / "trace.h5")
        spans = recorded.spans.size if recorded is not None else 0
    return summary.wall_seconds / summary.steps, gathers, spans


def seconds_per_span(repeat: int = 100_000) -> float:
    """The recorder's cost per span: communication calls in a step, each making its own span and
    the compute span before it."""
    recorder = Recorder(2 * repeat + 10)
    record = recorder.communicated

    def step() -> None:
        for _ in range(repeat):
            record("allreduce", "average", 0.0)

    start = time.perf_counter()
    recorder.stepping(step, lambda: 0)()
    elapsed = time.perf_counter() - start
    assert recorder.spans == 2 * repeat + 1
    return elapsed / recorder.spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per run")
    parser.add_argument("--rounds", type=int, default=20, help="pairs of runs, one in each mode")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a job option (repeatable), e.g. dataset=digits")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the ratio's quartiles)")
    options = {"steps": str(args.steps), **dict(item.split("=", 1) for item in args.set)}
    probe = Comm()
    rank, size = probe.rank, probe.size
    root = Path(probe.mpi.bcast(tempfile.mkdtemp(prefix="hpcopt-timeline-bench-") if rank == 0 else None))
    probe.free()
    run(options, True, root / "warm-up")  # imports, data, first touch
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    gathers, spans = [], []
    for n in range(args.rounds):
        for mode in MODES if n % 2 == 0 else MODES[::-1]:
            seconds, gathered, recorded = run(options, mode == "on", root / f"{n}-{mode}")
            times[mode].append(seconds)
            if mode == "on":
                gathers.append(gathered / args.steps)
                spans.append(recorded / size / args.steps)
    if rank != 0:
        return
    shutil.rmtree(root, ignore_errors=True)
    ratios = [on / off for on, off in zip(times["on"], times["off"])]
    median = {mode: statistics.median(times[mode]) for mode in MODES}
    per_span = seconds_per_span()
    attributed = (per_span * statistics.median(spans) + statistics.median(gathers)) / median["off"]
    result = {"ranks": size, "steps": args.steps, "rounds": args.rounds, "options": options,
              "median_ms_per_step": {m: 1e3 * median[m] for m in MODES},
              "ratio": statistics.median(ratios),
              "ratio_quartiles": statistics.quantiles(ratios, n=4),
              "spans_per_step_per_rank": statistics.median(spans),
              "us_per_span": 1e6 * per_span, "attributed": attributed}
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    print(f"timeline overhead: {size} rank(s), {args.rounds} rounds of two runs ({shown})")
    print("| timeline | median ms/step |\n|---|---|")
    for mode in MODES:
        print(f"| {mode} | {1e3 * median[mode]:.4f} |")
    low, _, high = result["ratio_quartiles"]
    print(f"ratio on/off: {result['ratio']:.4f} (median over rounds; quartiles {low:.4f} .. {high:.4f})")
    print(f"attributed: {100 * attributed:.2f}% of the step time ({result['spans_per_step_per_rank']:.2f} "
          f"spans per step and rank at {result['us_per_span']:.2f} us, plus the gathers)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
