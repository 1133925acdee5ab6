"""PR-SGD whose round overlaps the next local steps, against max(compute, communication) per
step, on an emulated cluster (root; benchmarks/cluster/emulated.py)::

    python -m benchmarks.cluster.overlap [--nodes 2 --ppn 2 --rate 100mbit --repeats 3]

Per repeat, interleaved, on the same cluster (the study's MLP 1024,1024 on mnist5k: 7.45 MB a
round, batch 32 per rank):

- compute: no round within the run (``--interval`` above ``--steps``): seconds per local step;
- blocking: PR-SGD I (every round blocking): compute + communication per step, so the
  communication per step is blocking - compute;
- overlapped: ``--overlap I-1 --overlap-rule delayed`` under each ``--comm-progress`` mode.

A run's ms per step are the trace's wall clock between its rows at steps I and T (the first
round's set-up and the end's final average left out). Every ratio is of medians of the same
run set; ``uptime``'s load is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.cluster.costmodel_links import hpcopt_job  # noqa: E402
from benchmarks.cluster.emulated import EmulatedCluster, namespaces_unavailable  # noqa: E402
from hpcopt.io.trace import read_trace  # noqa: E402

MODES = ("calls", "comm-thread", "mpich-thread")


def ms_per_step(trace_path: Path, first: int) -> tuple[float, float]:
    """ms per local step between the rows at steps ``first`` and the last; the last row's
    hidden fraction (NaN where the run has none)."""
    trace = read_trace(trace_path)
    steps, wall = trace.columns["step"], trace.columns["wall"]
    start = list(steps).index(first)
    hidden = trace.columns.get("hidden_fraction")
    return (1e3 * (wall[-1] - wall[start]) / (steps[-1] - steps[start]),
            float(hidden[-1]) if hidden is not None else float("nan"))


def runs(args: argparse.Namespace) -> dict[str, tuple[str, ...]]:
    """name -> its hpcopt train options."""
    overlap = ("--interval", str(args.interval), "--overlap", str(args.interval - 1),
               "--overlap-rule", "delayed")
    found = {"compute": ("--interval", str(args.steps + 1)),
             "blocking": ("--interval", str(args.interval))}
    found.update({f"overlapped, {mode}": (*overlap, "--comm-progress", mode) for mode in args.modes})
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ppn", type=int, default=2)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--hidden", default="1024,1024")
    p.add_argument("--interval", type=int, default=8)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    args = p.parse_args(argv)
    why = namespaces_unavailable()
    if why:
        raise SystemExit(f"overlap: {why}")
    print(f"uptime before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in runs(args)}
    with tempfile.TemporaryDirectory(prefix="overlap-") as tmp, \
            EmulatedCluster(args.nodes, args.ppn, args.rate) as cluster:
        os.chmod(tmp, 0o755)
        for repeat in range(args.repeats):
            for name, options in runs(args).items():
                out = Path(tmp) / f"{len(measured[name])}-{name.replace(', ', '-')}-{repeat}"
                hpcopt_job(cluster, "train", "--hidden", args.hidden, "--steps", str(args.steps),
                           "--trace-every", str(args.interval), "--progress", "false",
                           "--out", str(out), *options, timeout=1800)
                measured[name].append(ms_per_step(out / "trace.h5", args.interval))
                print(f"  {name}: {measured[name][-1][0]:.1f} ms per step", flush=True)
    print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    median = {name: statistics.median(ms for ms, _ in values) for name, values in measured.items()}
    compute, blocking = median["compute"], median["blocking"]
    communication = max(blocking - compute, 0.0)
    bound = max(compute, communication)
    print(f"\n{args.nodes}x{args.ppn} nodes at {args.rate}, PR-SGD I={args.interval}, "
          f"{args.steps} steps, medians of {args.repeats}")
    print(f"compute {compute:.1f} ms/step, blocking {blocking:.1f}, communication {communication:.1f}, "
          f"max(compute, communication) {bound:.1f}")
    print("| run | ms per step (each) | / max(compute, comm) | / blocking | hidden fraction (thread) |")
    print("|---|---|---|---|---|")
    for name, values in measured.items():
        each = ", ".join(f"{ms:.0f}" for ms, _ in values)
        hidden = statistics.median(h for _, h in values)
        print(f"| {name} | {median[name]:.1f} ({each}) | {median[name] / bound:.2f} | "
              f"{median[name] / blocking:.2f} | {'' if hidden != hidden else f'{hidden:.2f}'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
