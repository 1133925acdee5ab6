"""The compressed round's paths across nodes, idle and under a controlled load (as root).

    python -m benchmarks.cluster.round_paths --json OUT.json [--clusters 2x2-100mbit,2x2-1gbit]
        [--repeats 5] [--busy 2] [--rounds 3]

Per cluster (``EmulatedCluster``: nodes x ranks per node, link rate) and per load (no busy
process, then ``--busy`` processes spinning on the machine's cores beside the ranks), ``--repeats``
runs of benchmarks/cluster/wire_rounds.py, every variant in each run, the variants' order
rotated from one repeat to the next and the loads interleaved (idle, busy, idle, busy, ...), so
that a drift of the machine's load falls on every variant alike. Per cluster and load: each
variant's median seconds a round, and the median over repeats of each same-run ratio (a
variant's time over the flat round's of its wire, and over float32's). The machine's load
average (``/proc/loadavg``) is read before each run. Written as JSON; a table printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.cluster.emulated import EmulatedCluster
from benchmarks.cluster.wire_rounds import VARIANTS

ROOT = Path(__file__).resolve().parents[2]
#: A busy process: one core's worth of Python spinning.
BUSY = [sys.executable, "-c", "while 1: pass"]


def load_average() -> float:
    """The machine's 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def one_run(cluster: EmulatedCluster, order: list[str], rounds: int, timeout: float) -> dict[str, float]:
    """Seconds a round per variant, from one wire_rounds job with the variants in ``order``."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "rounds.json"
        job = cluster.mpiexec([sys.executable, "-m", "benchmarks.cluster.wire_rounds", "--json", str(out),
                               "--rounds", str(rounds), "--only", ",".join(order), "--load", "0"], "ofi",
                              timeout,
                              dict(os.environ, PYTHONPATH=str(ROOT)), ROOT)
        if job.returncode != 0:
            raise RuntimeError(f"wire_rounds failed: {job.describe()}")
        results = json.loads(out.read_text())["results"]
    return {name: result["seconds"] for name, result in results.items()}


def measure(cluster: EmulatedCluster, repeats: int, busy: int, rounds: int,
            timeout: float) -> dict[str, dict]:
    """load name -> {"runs": [{variant: seconds}], "load": [load averages]}."""
    names = list(VARIANTS)
    found: dict[str, dict] = {"idle": {"runs": [], "load": []}, f"busy {busy}": {"runs": [], "load": []}}
    for repeat in range(repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for load in found:
            spinners = [subprocess.Popen(BUSY) for _ in range(busy if load != "idle" else 0)]
            try:
                found[load]["load"].append(load_average())
                found[load]["runs"].append(one_run(cluster, order, rounds, timeout))
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
            print(f"{cluster.nodes}x{cluster.ranks_per_node} {load} repeat {repeat}: "
                  + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in found[load]["runs"][-1].items()), flush=True)
    return found


def summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per variant: median ms a round, and the medians of its same-run ratios to the flat round
    of its wire and to float32."""
    out = {}
    for name in VARIANTS:
        wire = name.split()[0]
        flat = f"{wire} flat" if wire != "float32" else "float32"
        out[name] = {"ms": 1e3 * statistics.median(run[name] for run in runs),
                     "vs_flat": statistics.median(run[name] / run[flat] for run in runs),
                     "vs_float32": statistics.median(run[name] / run["float32"] for run in runs)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--clusters", default="2x2-100mbit,2x2-1gbit")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--busy", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    results = {}
    for spec in args.clusters.split(","):
        shape, rate = spec.split("-")
        nodes, ppn = (int(v) for v in shape.split("x"))
        with EmulatedCluster(nodes, ppn, rate) as cluster:
            found = measure(cluster, args.repeats, args.busy, args.rounds, args.timeout)
        results[spec] = {load: {**value, "summary": summary(value["runs"])} for load, value in found.items()}
        args.json.write_text(json.dumps(results, indent=1))
        for load, value in results[spec].items():
            print(f"== {spec}, {load} (load average {min(value['load']):.1f}-{max(value['load']):.1f})")
            for name, row in value["summary"].items():
                print(f"   {name:24s} {row['ms']:7.0f} ms   / flat {row['vs_flat']:.2f}   "
                      f"/ float32 {row['vs_float32']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
