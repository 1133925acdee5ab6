"""Validate the alpha-beta cost model against a real run, then project time-to-accuracy.

    python benchmarks/reproduce/costmodel_validate.py [--ranks 2] [--steps 1200] [--out FILE]

1. Fit: ``mpiexec -n R python -m hpcopt bench allreduce`` (Comm.average_, the averaging path
   training uses) from 4 KB to 8 MB; beta fitted in the model's form to the sizes from --fit-from
   up, alpha to the smaller ones (hpcopt.comm.costmodel.fit_allreduce).
2. Validate: one PR-SGD run of the default model (MLP on MNIST-5k) with I=1 (an average every
   step) and a small batch (``--validate-batch``), so that the step is communication-bound and
   the measured time is mostly transfer rather than waiting for the slower rank, with
   ``--network alpha=..,beta=..`` set to the fit: its trace carries, per label, the measured
   seconds (rank 0) and the modelled ones. Target: modelled within 25% of measured for the
   averaging label.
3. Project: PR-SGD and CELGC runs for several averaging intervals I, each traced once (one
   study, run by ``python -m hpcopt sweep --local`` and gathered by ``hpcopt collect``); for
   every named profile the wall clock is recomputed row by row as measured computation plus
   modelled communication (hpcopt.comm.costmodel.project_wall), and the time to reach the target
   test accuracy is read off the evaluation rows; the best I per profile is marked.

Every other run is its own ``mpiexec`` launch; the tables are printed (markdown) and, with --out,
written to a file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common.launch import run_hpcopt  # noqa: E402
from benchmarks.common.study import find_run, run_study, sweep_file  # noqa: E402
from hpcopt.comm.costmodel import (PROFILES, NetworkProfile, fit_allreduce, project_wall,  # noqa: E402
                              trace_comm_seconds, trace_modelled)
from hpcopt.io.trace import read_trace  # noqa: E402

#: CELGC's threshold in the projection runs.
CELGC_GAMMA = 5.0


def fit(ranks: int, tmp: Path, low: int, high: str, budget: float) -> tuple[NetworkProfile, list[dict]]:
    """Benchmark 4 KB .. ``high``; fit beta to the sizes from ``low`` up and alpha to the smaller
    ones (hpcopt.comm.costmodel.fit_allreduce's two-stage fit)."""
    path = tmp / "allreduce.json"
    run_hpcopt(ranks, "bench", "allreduce", "--min-bytes", "4K", "--max-bytes", high, "--factor", "2",
               "--budget", str(budget), "--json", str(path), timeout=1800)
    results = json.loads(path.read_text())["results"]
    fitted = fit_allreduce([r["bytes"] for r in results], [r["seconds"]["auto"] for r in results],
                           ranks, "fitted", bandwidth_from=low)
    return fitted, results


def train(ranks: int, out: Path, network: str, steps: int, *options: str) -> Path:
    run_hpcopt(ranks, "train", "--steps", str(steps), "--network", network, "--out", str(out),
               "--progress", "false", "--trace-every", "8", *options, timeout=1800)
    return out / "trace.h5"


def projection_study(args: argparse.Namespace) -> str:
    """The sweep file of the projection runs: PR-SGD and CELGC at every I, on ``--network shm``."""
    train = {"steps": args.steps, "network": "shm", "progress": False, "trace_every": 8,
             "eval_every": args.eval_every}
    grids = [{"ranks": [args.ranks], "algorithm": ["prsgd"], "interval": args.intervals},
             {"ranks": [args.ranks], "algorithm": ["celgc"], "interval": args.intervals, "gamma": [CELGC_GAMMA]}]
    return sweep_file({"name": "projection", "ranks_per_node": args.ranks}, train, grids)


def validation_table(trace_path: Path) -> list[str]:
    trace = read_trace(trace_path)
    lines = ["| label | calls | MB | measured s (rank 0) | modelled s | modelled / measured |",
             "|---|---:|---:|---:|---:|---:|"]
    measured_total = modelled_total = 0.0
    for label, fields in sorted(trace.comm.items(), key=lambda kv: -kv[1]["seconds"][-1]):
        measured, modelled = float(fields["seconds"][-1]), float(fields["modelled"][-1])
        measured_total += measured
        modelled_total += modelled
        lines.append(f"| {label} | {int(fields['calls'][-1])} | {fields['bytes'][-1] / 1e6:.2f} | "
                     f"{measured:.4f} | {modelled:.4f} | {modelled / measured if measured else math.nan:.2f} |")
    lines.append(f"| **all** | | | {measured_total:.4f} | {modelled_total:.4f} | "
                 f"{modelled_total / measured_total:.2f} |")
    return lines


def time_to_accuracy(trace_path: Path, profile: NetworkProfile | None, target: float) -> float:
    """Seconds until the first evaluation at or above ``target`` (measured wall when profile is
    None, else projected onto ``profile``); nan if never reached."""
    trace = read_trace(trace_path)
    wall = trace.columns["wall"]
    if profile is not None:
        measured = trace_comm_seconds(trace.comm)
        modelled = trace_modelled(trace.comm, trace.ops or {}, int(trace.attrs["world_size"]), profile)
        wall = project_wall(wall, measured, modelled)
    reached = np.flatnonzero(trace.columns["eval_accuracy"] >= target)
    return float(wall[reached[0]]) if reached.size else math.nan


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=1200, help="steps of each projection run")
    p.add_argument("--validate-steps", type=int, default=600)
    p.add_argument("--validate-batch", type=int, default=4,
                   help="batch per rank of the validation run (small: communication-bound)")
    p.add_argument("--fit-from", type=int, default=256, help="fit the bandwidth to the sizes from this many KB up "
                   "(the latency to the smaller ones)")
    p.add_argument("--max-bytes", default="8M", help="largest size of the allreduce benchmark")
    p.add_argument("--bench-budget", type=float, default=0.5, help="seconds per size and case")
    p.add_argument("--intervals", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--target", type=float, default=0.93, help="test accuracy of time-to-accuracy")
    p.add_argument("--eval-every", type=int, default=48)
    p.add_argument("--profiles", nargs="+", default=["shm", "ib100", "eth10", "eth1"])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    out: list[str] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        fitted, results = fit(args.ranks, tmp, args.fit_from << 10, args.max_bytes, args.bench_budget)
        spec = f"alpha={fitted.alpha:.4g},beta={fitted.beta:.4g}"
        out += [f"## Fit ({args.ranks} ranks, Comm.average_ with averaging auto, fitted from "
                f"{args.fit_from} KB up)", "",
                f"alpha {1e6 * fitted.alpha:.2f} us, bandwidth {fitted.bandwidth / 1e9:.2f} GB/s "
                f"(`--network {spec}`)", "",
                "| size | measured us | modelled us | modelled / measured |", "|---:|---:|---:|---:|"]
        for r in results:
            t = r["seconds"]["auto"]
            m = fitted.allreduce(r["bytes"], args.ranks, "ring")
            out.append(f"| {r['bytes'] >> 10} KB | {1e6 * t:.1f} | {1e6 * m:.1f} | {m / t:.2f} |")
        trace = train(args.ranks, tmp / "validate", spec, args.validate_steps, "--interval", "1",
                      "--batch-size", str(args.validate_batch))
        out += ["", f"## Validation: PR-SGD, default model, I=1, batch {args.validate_batch}/rank, "
                f"{args.validate_steps} steps, {args.ranks} ranks",
                "", *validation_table(trace)]
        found = run_study(projection_study(args), tmp / "projection")
        runs = {(algorithm, interval): find_run(found, args.ranks, algorithm=algorithm, interval=interval).path
                / "trace.h5" for algorithm in ("prsgd", "celgc") for interval in args.intervals}
        profiles: list[NetworkProfile | None] = [None, *(PROFILES[name] for name in args.profiles)]
        out += ["", f"## Projected time to {args.target:.0%} test accuracy (seconds; * = best I per column)", "",
                "| algorithm | I | measured here | " + " | ".join(p.name for p in profiles if p) + " |",
                "|---|---:|---:|" + "---:|" * (len(profiles) - 1)]
        for algorithm in ("prsgd", "celgc"):
            table = {i: [time_to_accuracy(runs[algorithm, i], prof, args.target) for prof in profiles]
                     for i in args.intervals}
            best = [min(args.intervals, key=lambda i, c=c: table[i][c] if math.isfinite(table[i][c]) else math.inf)
                    for c in range(len(profiles))]
            for i in args.intervals:
                cells = [f"{v:.2f}{'*' if best[c] == i and math.isfinite(v) else ''}" if math.isfinite(v) else "not reached"
                         for c, v in enumerate(table[i])]
                out.append(f"| {algorithm} | {i} | " + " | ".join(cells) + " |")
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
