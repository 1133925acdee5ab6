"""Steps per second with 1 against N BLAS threads per rank, at 1 and 2 ranks: what hpcopt's
threads-per-rank default (hpcopt/run/threads.py) is chosen from.

    python benchmarks/speed/blas_threads.py [--threads 2] [--batches 32 256] [--repeats 5]
                                            [--steps 300] [--out docs/results/scaling.md]

Each case is the default job (MLP 784-512-256-10 on MNIST-5k, PR-SGD, I=8) trained for
``--steps`` steps in its own ``mpiexec`` launch with the thread variables set (so hpcopt's own
rule is not involved); the cases are interleaved over the repeats, so machine noise hits every
case alike, and the table gives each case's median steps/s and, per rank count and batch, the
ratio of N threads to 1 thread (above 1: the threads help). N defaults to the cores this process
may run on. The load average at the start and the end is printed with the table: on a machine
shared with other jobs, threads that must all be scheduled at once pay for any other load.
With ``--out`` the table replaces the ``blas-threads`` section of that page.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common.sections import replace_section  # noqa: E402
from hpcopt.bench.scaling import launch  # noqa: E402
from hpcopt.run.threads import available_cores  # noqa: E402

RANKS = (1, 2)


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def measure(threads: int, batches: list[int], repeats: int, steps: int) -> list[str]:
    """Launch every (batch, ranks, threads) case ``repeats`` times, interleaved; the table."""
    cases = [(batch, ranks, t) for batch in batches for ranks in RANKS for t in sorted({1, threads})]
    rates: dict[tuple[int, int, int], list[float]] = {case: [] for case in cases}
    start_load, started = load(), time.perf_counter()
    for repeat in range(repeats):
        for i, (batch, ranks, t) in enumerate(cases):
            figures = launch("prsgd", ranks, steps, batch, 8, t)
            rates[(batch, ranks, t)].append(1 / figures["seconds_per_step"])
            print(f"[{repeat * len(cases) + i + 1}/{repeats * len(cases)}] batch {batch}, {ranks} rank(s), "
                  f"{t} thread(s): {rates[(batch, ranks, t)][-1]:.0f} steps/s", file=sys.stderr, flush=True)
    median = {case: statistics.median(values) for case, values in rates.items()}
    lines = [f"PR-SGD default job (MLP 784-512-256-10 on MNIST-5k, I=8), {steps} steps a launch, median "
             f"of {repeats} launches, {available_cores()} cores, load average (1/5/15 min) {start_load} at "
             f"the start, {load()} at the end, {time.perf_counter() - started:.0f} s in all",
             "",
             "| batch/rank | ranks | threads/rank | steps/s (median) | min - max | N threads / 1 thread |",
             "|---:|---:|---:|---:|---:|---:|"]
    for (batch, ranks, t), value in median.items():
        ratio = f"{value / median[(batch, ranks, 1)]:.2f}" if t != 1 else ""
        values = rates[(batch, ranks, t)]
        lines.append(f"| {batch} | {ranks} | {t} | {value:.0f} | {min(values):.0f} - {max(values):.0f} "
                     f"| {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=available_cores(),
                        help="N: the threads per rank compared with 1 (default: the cores available)")
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256], help="batches per rank")
    parser.add_argument("--repeats", type=int, default=5, help="launches per case (the median is shown)")
    parser.add_argument("--steps", type=int, default=300, help="steps per launch")
    parser.add_argument("--out", type=Path, help="write the table into this page's blas-threads section")
    args = parser.parse_args(argv)
    if min(args.threads, args.repeats, args.steps, *args.batches) < 1:
        parser.error("--threads, --batches, --repeats and --steps must be >= 1")
    lines = measure(args.threads, args.batches, args.repeats, args.steps)
    print("\n".join(lines))
    if args.out:
        replace_section(args.out, "blas-threads", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
