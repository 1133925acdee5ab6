"""Strong and weak scaling of the training algorithms on the default job, at the rank counts
this machine allows.

    python -m hpcopt bench scaling [--ranks 1 2 4] [--algorithms prsgd celgc] [--repeats 3]
                                   [--steps 600] [--out docs/results/scaling.md]

Weak scaling keeps the batch per rank (32) fixed, so N ranks process N times the samples per
step; efficiency = (time per step at 1 rank) / (time per step at N ranks). Strong scaling keeps
the global batch (32 x max ranks) fixed and splits it over the ranks; efficiency = t1 / (N tN).
One more row runs 2 ranks with 2 BLAS threads each (overriding hpcopt's threads-per-rank rule)
to show what that rule is worth, and one runs 1 rank with 1 thread: the baseline of a second
weak-scaling efficiency, one core per rank on both sides. Every configuration runs in its own
``mpiexec`` launch (this command itself is started without ``mpiexec``), the cases interleaved
over repeats (each launch is reported on stderr as it starts and ends, with an estimate of
the time left), and the table gives medians; "comm share" is the time inside MPI calls over the
wall time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import HpcoptError
from .common import Parser

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
#: Settings per algorithm beyond the defaults (CELGC with a threshold that clips now and then).
ALGORITHM_OPTIONS = {"prsgd": {}, "celgc": {"gamma": "5.0"}}


def worker(algorithm: str, steps: int, batch: int, interval: int) -> None:
    """Run under mpiexec: train for ``steps`` and print rank 0's figures as JSON."""
    from ..comm import Comm
    from ..config import build_config
    from ..run import train

    comm = Comm()
    config = build_config(None, {"algorithm": algorithm, "steps": str(steps), "batch_size": str(batch),
                                 "interval": str(interval), "progress": "false",
                                 **ALGORITHM_OPTIONS[algorithm]})
    summary, _ = train(config, comm, verbose=False)
    if comm.rank == 0:
        print(json.dumps({"seconds_per_step": summary.wall_seconds / steps,
                          "samples_per_second": summary.samples_per_second,
                          "comm_share": summary.comm_seconds / summary.wall_seconds,
                          "threads": summary.threads.threads}))
    comm.free()


def launch(algorithm: str, ranks: int, steps: int, batch: int, interval: int,
           threads: int | None) -> dict[str, Any]:
    package_root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES and not k.startswith("PMI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH", "")]))
    if threads is not None:
        env.update({name: str(threads) for name in THREAD_VARIABLES})
    command = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "hpcopt.bench.scaling", "--worker",
               "--algorithm", algorithm, "--steps", str(steps), "--batch", str(batch),
               "--interval", str(interval)]
    try:
        out = subprocess.run(command, capture_output=True, text=True, env=env, check=True, timeout=1800)
    except subprocess.CalledProcessError as exc:
        raise HpcoptError(f"{' '.join(command[:3])} ... failed: {exc.stderr.strip()[-300:]}") from None
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(ranks: list[int], algorithms: list[str], repeats: int, steps: int, interval: int,
        batch: int) -> tuple[list[str], dict[tuple, dict[str, float]]]:
    """Launch every case ``repeats`` times, interleaved; (table lines, medians per case)."""
    global_batch = batch * max(ranks)
    cases: list[tuple[str, str, int, int, int | None]] = []  # (algorithm, mode, ranks, batch, threads)
    for algorithm in algorithms:
        cases += [(algorithm, "weak", n, batch, None) for n in ranks]
        cases += [(algorithm, "strong", n, global_batch // n, None) for n in ranks]
    if 2 in ranks:
        cases += [(algorithms[0], "weak", 2, batch, 2)]
    if 1 in ranks:
        cases += [(algorithms[0], "weak", 1, batch, 1)]
    runs: dict[tuple, list[dict]] = {case: [] for case in cases}
    total, started = repeats * len(cases), time.perf_counter()
    for repeat in range(repeats):
        for i, case in enumerate(cases):  # interleaved, so machine noise hits every case alike
            algorithm, mode, n, per_rank, threads = case
            done = repeat * len(cases) + i
            what = (f"[{done + 1}/{total}] {algorithm} {mode}, {n} rank(s), batch {per_rank}/rank"
                    + (f", {threads} threads/rank" if threads else ""))
            _say(f"{what}: started")
            launched = time.perf_counter()
            runs[case].append(launch(algorithm, n, steps, per_rank, interval, threads))
            elapsed = time.perf_counter() - started
            _say(f"{what}: {time.perf_counter() - launched:.1f} s, "
                 f"eta {elapsed / (done + 1) * (total - done - 1):.0f} s")
    med = {case: {key: statistics.median(r[key] for r in results) for key in results[0]}
           for case, results in runs.items()}
    lines = [f"default job (MLP 784-512-256-10 on MNIST-5k, I={interval}), {steps} steps, "
             f"median of {repeats} launches, {os.cpu_count()} cores",
             "",
             "| algorithm | scaling | ranks | batch/rank | threads/rank | ms/step | samples/s | comm share "
             "| efficiency |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for case, m in med.items():
        algorithm, mode, n, per_rank, threads = case
        base_batch = batch if mode == "weak" else global_batch // min(ranks)
        base = med.get((algorithm, mode, min(ranks), base_batch, None))
        efficiency = float("nan")
        if base is not None and min(ranks) == 1:
            scale = 1 if mode == "weak" else n
            efficiency = base["seconds_per_step"] / (scale * m["seconds_per_step"])
        label = f"{int(m['threads'])}" + (" (user)" if threads else "")
        lines.append(f"| {algorithm} | {mode} | {n} | {per_rank} | {label} | "
                     f"{1e3 * m['seconds_per_step']:.2f} | {m['samples_per_second']:,.0f} | "
                     f"{m['comm_share']:.0%} | {efficiency:.2f} |")
    one_thread = med.get((algorithms[0], "weak", 1, batch, 1))
    two = med.get((algorithms[0], "weak", 2, batch, None))
    if one_thread and two:
        ratio = one_thread["seconds_per_step"] / two["seconds_per_step"]
        lines += ["", f"weak-scaling efficiency 1 -> 2 ranks of {algorithms[0]} against 1 rank with 1 thread "
                  f"(one core per rank in both): {ratio:.2f}"]
    return lines, med


def _say(line: str) -> None:
    """A progress line, on stderr (stdout carries only the table)."""
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="hpcopt bench scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4],
                        help="rank counts to launch (mpiexec -n R each)")
    parser.add_argument("--algorithms", nargs="+", default=["prsgd"], choices=sorted(ALGORITHM_OPTIONS),
                        help="algorithms to time")
    parser.add_argument("--repeats", type=int, default=3, help="runs per rank count (the median is shown)")
    parser.add_argument("--steps", type=int, default=600, help="steps per run")
    parser.add_argument("--interval", type=int, default=8, help="I: local steps between averages")
    parser.add_argument("--batch", type=int, default=32,
                        help="batch per rank in weak scaling (strong: this times the most ranks, split)")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    if min(args.ranks) < 1 or args.repeats < 1 or args.steps < 1 or args.batch < 1:
        raise HpcoptError("--ranks, --repeats, --steps and --batch must be >= 1")
    lines, _ = run(sorted(set(args.ranks)), args.algorithms, args.repeats, args.steps, args.interval,
                   args.batch)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        except OSError as exc:
            raise HpcoptError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        import argparse

        w = argparse.ArgumentParser()
        for name in ("--algorithm",):
            w.add_argument(name)
        for name in ("--steps", "--batch", "--interval"):
            w.add_argument(name, type=int)
        w.add_argument("--worker", action="store_true")
        a = w.parse_args()
        worker(a.algorithm, a.steps, a.batch, a.interval)
    else:
        sys.exit(main())
