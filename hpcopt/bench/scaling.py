"""Strong and weak scaling of the training algorithms on the default job, at the rank counts
this machine allows.

    python -m hpcopt bench scaling [--ranks 1 2 4] [--algorithms prsgd celgc] [--repeats 3]
                                   [--steps 600] [--no-thread-rows] [--out docs/results/scaling.md]

Weak scaling keeps the batch per rank (32) fixed, so N ranks process N times the samples per
step; efficiency = (time per step at 1 rank) / (time per step at N ranks). Strong scaling keeps
the global batch (32 x max ranks) fixed and splits it over the ranks; efficiency = t1 / (N tN).
Every scaling row, the 1-rank baseline included, runs 1 BLAS thread per rank (hpcopt's default,
set explicitly): one core per rank at every size, so the baseline is not slowed (or sped up) by
threads the other rows lack. Two more rows, 1 and 2 ranks with 2 threads each, show what threads
are worth, as a ratio to 1 thread printed below the table (``--no-thread-rows`` leaves them out:
on a machine whose cores are busy they take 5-20x as long as the others). An efficiency above 1
comes with a note saying where it comes from; the header gives the load average at the start
and the end.
Every configuration runs in its own ``mpiexec`` launch (this command itself is started without
``mpiexec``), the cases interleaved over repeats (each launch is reported on stderr as it starts
and ends, with an estimate of the time left), and the table gives medians; "comm share" is the
time inside MPI calls over the wall time.
"""

from __future__ import annotations

import argparse
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


#: A case: (algorithm, "weak" or "strong", ranks, batch per rank, BLAS threads per rank).
Case = tuple[str, str, int, int, int]
#: Printed under a table in which an efficiency is above 1.
ABOVE_ONE_NOTE = ("efficiency above 1 is not a gain from the ranks: every scaling row and its 1-rank "
                  "baseline run 1 BLAS thread per rank, so it comes from the machine (other jobs slowed "
                  "the 1-rank launches: compare the rows' ms/step with a rerun) or, in strong scaling, "
                  "from a smaller batch per rank fitting the caches")


def cases_for(ranks: list[int], algorithms: list[str], batch: int, thread_rows: bool = True) -> list[Case]:
    """The scaling rows, each at 1 BLAS thread per rank (one core per rank at every size, so that
    the 1-rank baseline is not the only row with several threads), then, with ``thread_rows``,
    the rows that show what 2 threads per rank are worth, at 1 and 2 ranks."""
    global_batch = batch * max(ranks)
    cases: list[Case] = []
    for algorithm in algorithms:
        cases += [(algorithm, "weak", n, batch, 1) for n in ranks]
        cases += [(algorithm, "strong", n, global_batch // n, 1) for n in ranks]
    return cases + [(algorithms[0], "weak", n, batch, 2) for n in (1, 2) if n in ranks and thread_rows]


def run(ranks: list[int], algorithms: list[str], repeats: int, steps: int, interval: int,
        batch: int, thread_rows: bool = True) -> tuple[list[str], dict[Case, dict[str, float]]]:
    """Launch every case ``repeats`` times, interleaved; (table lines, medians per case)."""
    cases = cases_for(ranks, algorithms, batch, thread_rows)
    runs: dict[Case, list[dict]] = {case: [] for case in cases}
    total, started, load = repeats * len(cases), time.perf_counter(), _load()
    for repeat in range(repeats):
        for i, case in enumerate(cases):  # interleaved, so machine noise hits every case alike
            algorithm, mode, n, per_rank, threads = case
            done = repeat * len(cases) + i
            what = (f"[{done + 1}/{total}] {algorithm} {mode}, {n} rank(s), batch {per_rank}/rank, "
                    f"{threads} thread(s)/rank")
            _say(f"{what}: started")
            launched = time.perf_counter()
            runs[case].append(launch(algorithm, n, steps, per_rank, interval, threads))
            elapsed = time.perf_counter() - started
            _say(f"{what}: {time.perf_counter() - launched:.1f} s, "
                 f"eta {elapsed / (done + 1) * (total - done - 1):.0f} s")
    med = {case: {key: statistics.median(r[key] for r in results) for key in results[0]}
           for case, results in runs.items()}
    header = (f"default job (MLP 784-512-256-10 on MNIST-5k, I={interval}), {steps} steps, "
              f"median of {repeats} launches, {os.cpu_count()} cores, load average (1/5/15 min) {load} at "
              f"the start, {_load()} at the end")
    return table(med, ranks, batch, header), med


def table(med: dict[Case, dict[str, float]], ranks: list[int], batch: int, header: str) -> list[str]:
    """The markdown table of the medians. Efficiency: weak t(1) / t(N), strong t(1) / (N t(N)),
    against the 1-rank row of the same algorithm, mode and threads per rank (1); the thread rows
    have none, their ratio to the same ranks with 1 thread is printed below the table."""
    global_batch = batch * max(ranks)
    lines = [header, "",
             "| algorithm | scaling | ranks | batch/rank | threads/rank | ms/step | samples/s | comm share "
             "| efficiency |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    above_one = False
    for case, m in med.items():
        algorithm, mode, n, per_rank, threads = case
        base = med.get((algorithm, mode, 1, batch if mode == "weak" else global_batch, 1))
        efficiency = "-"
        if threads == 1 and base is not None:
            value = base["seconds_per_step"] / ((1 if mode == "weak" else n) * m["seconds_per_step"])
            efficiency, above_one = f"{value:.2f}", above_one or round(value, 2) > 1
        lines.append(f"| {algorithm} | {mode} | {n} | {per_rank} | {int(m['threads'])} | "
                     f"{1e3 * m['seconds_per_step']:.2f} | {m['samples_per_second']:,.0f} | "
                     f"{m['comm_share']:.0%} | {efficiency} |")
    for case, m in med.items():
        algorithm, mode, n, per_rank, threads = case
        one = med.get((algorithm, mode, n, per_rank, 1))
        if threads != 1 and one is not None:
            ratio = m["seconds_per_step"] / one["seconds_per_step"]
            lines += ["", f"{n} rank(s) with {int(m['threads'])} BLAS threads each take {ratio:.2f}x "
                      "the time per step of 1 thread each"]
    if above_one:
        lines += ["", ABOVE_ONE_NOTE]
    return lines


def _load() -> str:
    """The load average (1, 5 and 15 minutes): other jobs on the machine slow every row."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


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
    parser.add_argument("--thread-rows", action=argparse.BooleanOptionalAction, default=True,
                        help="also time 1 and 2 ranks with 2 BLAS threads each (--no-thread-rows: "
                             "only 1 thread per rank; the thread rows can take 5-20x as long)")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    if min(args.ranks) < 1 or args.repeats < 1 or args.steps < 1 or args.batch < 1:
        raise HpcoptError("--ranks, --repeats, --steps and --batch must be >= 1")
    lines, _ = run(sorted(set(args.ranks)), args.algorithms, args.repeats, args.steps, args.interval,
                   args.batch, args.thread_rows)
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
