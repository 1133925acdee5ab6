"""Aggregate training throughput of the default PR-SGD job at 1 and 2 ranks (and 4).

Each configuration is launched with mpiexec, in turn, several times; the table gives the median
samples/s over all ranks together and the ratio to 1 rank. A third row runs 2 ranks with 2 BLAS
threads each (the user overriding hpcopt's threads-per-rank rule) to show what the rule buys on
a 2-core machine.

    python benchmarks/throughput.py [--repeats 3] [--epochs 10] [--ranks 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(epochs: float) -> None:
    """Run under mpiexec: train the default job and print rank 0's summary as JSON."""
    from hpcopt.comm import Comm
    from hpcopt.config import build_config
    from hpcopt.train import train

    comm = Comm()
    summary, _ = train(build_config(None, {"epochs": str(epochs), "progress": "false"}), comm,
                       verbose=False)
    if comm.rank == 0:
        print(json.dumps({"samples_per_second": summary.samples_per_second,
                          "accuracy": summary.final.accuracy,
                          "threads": summary.threads.threads,
                          "comm_share": summary.comm_seconds / summary.wall_seconds}))


def launch(ranks: int, epochs: float, threads: int | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        env.pop(name, None)
    if threads is not None:
        env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
    out = subprocess.run(["mpiexec", "-n", str(ranks), sys.executable, __file__, "--worker",
                          "--epochs", str(epochs)], capture_output=True, text=True, env=env,
                         check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=10)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.epochs)
        return
    cases = [(n, None) for n in args.ranks] + [(2, 2)]
    results: dict[tuple[int, int | None], list[dict]] = {case: [] for case in cases}
    for _ in range(args.repeats):
        for case in cases:  # interleaved, so machine noise hits every case alike
            results[case].append(launch(case[0], args.epochs, case[1]))
    base = statistics.median(r["samples_per_second"] for r in results[(1, None)])
    print(f"default PR-SGD job ({args.epochs:g} epochs), median of {args.repeats} runs, "
          f"{os.cpu_count()} cores")
    print(f"{'ranks':>5} {'threads/rank':>12} {'samples/s':>10} {'vs 1 rank':>9} "
          f"{'comm share':>10} {'accuracy':>8}")
    for (ranks, threads), runs in results.items():
        rate = statistics.median(r["samples_per_second"] for r in runs)
        share = statistics.median(r["comm_share"] for r in runs)
        accuracy = statistics.median(r["accuracy"] for r in runs)
        label = f"{runs[0]['threads']}" + ("" if threads is None else " (user)")
        print(f"{ranks:>5} {label:>12} {rate:>10,.0f} {rate / base:>8.2f}x {share:>9.1%} {accuracy:>8.4f}")


if __name__ == "__main__":
    main()
