"""Strong and weak scaling of PR-SGD on the default job, at the rank counts this machine allows.

Weak scaling keeps the batch per rank (32) fixed, so N ranks process N times the samples per
step; efficiency = (time per step at 1 rank) / (time per step at N ranks). Strong scaling keeps
the global batch (32 x max ranks) fixed and splits it over the ranks; efficiency = t1 / (N tN).
One more row runs 2 ranks with 2 BLAS threads each (overriding hpcopt's threads-per-rank rule)
to show what that rule is worth. Every configuration runs in its own mpiexec launch, the cases
interleaved over repeats, and the table gives medians.

    python benchmarks/scaling.py [--ranks 1 2 4] [--repeats 3] [--steps 600] [--out docs/results/scaling.md]
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
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def worker(steps: int, batch: int, interval: int) -> None:
    """Run under mpiexec: train for ``steps`` and print rank 0's figures as JSON."""
    from hpcopt.comm import Comm
    from hpcopt.config import build_config
    from hpcopt.train import train

    comm = Comm()
    config = build_config(None, {"steps": str(steps), "batch_size": str(batch),
                                 "interval": str(interval), "progress": "false"})
    summary, _ = train(config, comm, verbose=False)
    if comm.rank == 0:
        print(json.dumps({"seconds_per_step": summary.wall_seconds / steps,
                          "samples_per_second": summary.samples_per_second,
                          "comm_share": summary.comm_seconds / summary.wall_seconds,
                          "threads": summary.threads.threads}))


def launch(ranks: int, steps: int, batch: int, interval: int, threads: int | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env["PYTHONPATH"] = str(ROOT)
    if threads is not None:
        env.update({name: str(threads) for name in THREAD_VARIABLES})
    command = ["mpiexec", "-n", str(ranks), sys.executable, __file__, "--worker", "--steps",
               str(steps), "--batch", str(batch), "--interval", str(interval)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--interval", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.batch, args.interval)
        return
    global_batch = args.batch * max(args.ranks)
    cases = [("weak", n, args.batch, None) for n in args.ranks]
    cases += [("strong", n, global_batch // n, None) for n in args.ranks]
    cases += [("weak", 2, args.batch, 2)]
    runs: dict[tuple, list[dict]] = {case: [] for case in cases}
    for _ in range(args.repeats):
        for case in cases:  # interleaved, so machine noise hits every case alike
            mode, ranks, batch, threads = case
            runs[case].append(launch(ranks, args.steps, batch, args.interval, threads))
    med = {case: {key: statistics.median(r[key] for r in results) for key in results[0]}
           for case, results in runs.items()}
    lines = [f"PR-SGD default job (MLP 784-512-256-10, I={args.interval}), {args.steps} steps, "
             f"median of {args.repeats} launches, {os.cpu_count()} cores",
             "",
             "| scaling | ranks | batch/rank | threads/rank | ms/step | samples/s | comm share | efficiency |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for case, m in med.items():
        mode, ranks, batch, threads = case
        base = med[(mode, 1, args.batch if mode == "weak" else global_batch, None)]
        if mode == "weak":
            efficiency = base["seconds_per_step"] / m["seconds_per_step"]
        else:
            efficiency = base["seconds_per_step"] / (ranks * m["seconds_per_step"])
        label = f"{int(m['threads'])}" + (" (user)" if threads else "")
        lines.append(f"| {mode} | {ranks} | {batch} | {label} | {1e3 * m['seconds_per_step']:.2f} | "
                     f"{m['samples_per_second']:,.0f} | {m['comm_share']:.0%} | {efficiency:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("# Scaling of PR-SGD\n\n`python benchmarks/scaling.py --out "
                            f"{args.out}`\n\n" + text)


if __name__ == "__main__":
    main()
