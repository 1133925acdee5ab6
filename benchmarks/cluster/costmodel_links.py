"""The node-aware cost model against measured seconds on emulated links (root: network namespaces).

    python -m benchmarks.cluster.costmodel_links [--nodes 2] [--ppn 2] [--rate 100mbit] [--repeats 3]

On an ``EmulatedCluster`` (benchmarks/cluster/emulated.py):

1. Fit: ``hpcopt bench allreduce`` (Comm.average_ with averaging auto) in one node (a cluster
   of one), fitted over its ranks: ``memory_alpha`` and ``memory_beta``, what in-node calls
   cost here (the nominal ``shm`` profile, measured on an idle machine, is 20-40 times faster
   than the in-node averages of 4 busy ranks on 2 shared cores); then across the nodes, alpha
   and beta fitted in the model's form over the nodes to each time less its in-node level
   (``fit_allreduce`` with ranks = nodes and the layout: the node-aware model prices a spanning
   call as its in-node level plus the nodes' level on the network, so a fit to the whole time
   counted the in-node level twice: 5% of a 7.45 MB average at 100 Mbit/s, 20% at 1 Gbit/s).
2. Validate: training runs whose round is link-bound (an MLP of a few MB), one per algorithm
   (synchronous, PR-SGD, two-level, an int8 round), each with ``--network alpha=..,beta=..``
   from the fit: per run, the measured communication seconds of rank 0 (all labels but the
   set-up ones) beside the modelled ones, from the run's trace; medians over ``--repeats``.

Prints markdown tables (the fit, then algorithm, measured s, modelled s, modelled / measured),
with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.cluster.emulated import EmulatedCluster  # noqa: E402
from hpcopt.comm import costmodel  # noqa: E402
from hpcopt.io.trace import read_trace  # noqa: E402

#: The algorithms compared: name -> training flags.
ALGORITHMS = {
    "synchronous (I=1)": ["--interval", "1"],
    "PR-SGD (I=8)": ["--interval", "8"],
    "two-level (node every 2, all every 8)": ["--interval", "8", "--group-size", "node",
                                              "--group-interval", "2"],
    "int8 round (I=1)": ["--interval", "1", "--wire", "int8"],
}
#: Streaming DiLoCo, each fragment's Iallreduce in flight for ``--overlap`` inner steps.
STREAMING = ["--algorithm", "diloco", "--interval", "8", "--fragments", "4", "--overlap", "2"]
#: Progress of a non-blocking collective: name -> the ranks' extra environment.
PROGRESS = {"in MPI calls": {}, "progress thread": {"MPIR_CVAR_ASYNC_PROGRESS": "1"}}


def hpcopt_job(cluster: EmulatedCluster, *args: str, timeout: float,
               env: dict[str, str] | None = None) -> str:
    """``python -m hpcopt ARGS`` on every rank of ``cluster`` (OFI netmod), this checkout first on
    the path; its output (a failure ends the script with the job's)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, **(env or {}))
    job = cluster.mpiexec([sys.executable, "-m", "hpcopt", *args], "ofi", timeout, env, ROOT)
    if job.returncode:
        raise SystemExit(f"hpcopt {' '.join(args)} failed: {job.describe()}")
    return job.stdout


def fit(cluster: EmulatedCluster, tmp: Path, high: str, budget: float, ranks: int,
        memory: costmodel.NetworkProfile | None = None, timing: str = "seconds",
        within: str = "world") -> tuple[costmodel.NetworkProfile, list[str]]:
    """alpha and beta fitted to ``bench allreduce`` on ``cluster`` (in the model's form over
    ``ranks``: its nodes, or its ranks on one node), and the table of the fit. With ``memory`` (the in-node
    profile), each time less the in-node level the node-aware model adds to a spanning call
    (``fit_allreduce``'s ``layout``): the table's modelled times are both levels. ``timing``:
    which of ``bench allreduce``'s medians, the slowest rank's ("seconds") or the last to
    arrive's ("last_arrival", the calls' own); ``within``: "node" times every node's own
    allreduce at once (``bench allreduce --within node``: ``ranks`` is a node's ranks)."""
    path = tmp / f"allreduce-{cluster.nodes}-{within}.json"
    hpcopt_job(cluster, "bench", "allreduce", "--min-bytes", "4K", "--max-bytes", high, "--factor", "2",
               "--budget", str(budget), "--within", within, "--json", str(path), timeout=1800)
    results = json.loads(path.read_text())["results"]
    sizes, seconds = [r["bytes"] for r in results], [r[timing]["auto"] for r in results]
    layout = None if memory is None else costmodel.NodeLayout(cluster.nodes, cluster.ranks_per_node, memory)
    fitted = costmodel.fit_allreduce(sizes, seconds, ranks, "fitted", bandwidth_from=256 << 10, layout=layout)
    lines = [f"alpha {1e6 * fitted.alpha:.1f} us, bandwidth {8 * fitted.bandwidth / 1e6:.1f} Mbit/s", "",
             "| size | measured ms | modelled ms | modelled / measured |", "|---:|---:|---:|---:|"]
    for n, t in zip(sizes, seconds):
        m = (fitted.allreduce(n, ranks) if layout is None else
             layout.spanning("allreduce", 1, n, ranks * layout.per_node, fitted))
        lines.append(f"| {n >> 10} KB | {1e3 * t:.2f} | {1e3 * m:.2f} | {m / t:.2f} |")
    return fitted, lines


def comm_seconds(trace_path: Path) -> tuple[float, float]:
    """Measured (rank 0) and modelled communication seconds of a run, set-up labels left out."""
    trace = read_trace(trace_path)
    measured, modelled = (costmodel.trace_comm_seconds(trace.comm, f)[-1] for f in ("seconds", "modelled"))
    return float(measured), float(modelled)


def hidden_fraction(trace_path: Path, spec: str, layout: costmodel.NodeLayout) -> tuple[float, float, float]:
    """Streaming: the fragments' measured seconds (rank 0 held in posts and waits), their
    modelled seconds unhidden (as blocking calls, on the fitted profile), and the fraction of
    them hidden, OSU's overlap 1 - held / unhidden (0: nothing hidden)."""
    trace = read_trace(trace_path)
    fragments = {"fragments": trace.comm["fragments"]}
    held = float(fragments["fragments"]["seconds"][-1])
    unhidden = float(costmodel.trace_modelled(fragments, trace.ops or {}, int(trace.attrs["world_size"]),
                                              costmodel.get_profile(spec), layout=layout)[-1])
    return held, unhidden, 1 - held / unhidden


def streaming_rows(cluster: EmulatedCluster, tmp: Path, spec: str, args: argparse.Namespace) -> list[str]:
    layout = costmodel.NodeLayout(cluster.nodes, cluster.ranks_per_node)
    lines = []
    for progress, env in PROGRESS.items():
        runs = []
        for repeat in range(args.repeats):
            run = tmp / f"streaming-{len(lines)}-{repeat}"
            hpcopt_job(cluster, "train", "--hidden", args.hidden, "--steps", str(args.steps), "--network",
                       spec, "--trace-every", "4", "--progress", "false", "--out", str(run), *STREAMING,
                       timeout=1800, env=env)
            runs.append((*comm_seconds(run / "trace.h5"), *hidden_fraction(run / "trace.h5", spec, layout)))
        measured, modelled, held, unhidden, hidden = (statistics.median(r[i] for r in runs) for i in range(5))
        each = ", ".join(f"{r[4]:.2f}" for r in runs)
        lines.append(f"| {progress} | {measured:.2f} | {modelled:.2f} | {modelled / measured:.2f} | "
                     f"{held:.2f} | {unhidden:.2f} | {hidden:.2f} ({each}) |")
        print(lines[-1], flush=True)
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ppn", type=int, default=2)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--hidden", default="1024,1024", help="the MLP's hidden layers (a round of a few MB)")
    p.add_argument("--max-bytes", default="4M", help="largest size of the allreduce benchmark")
    p.add_argument("--bench-budget", type=float, default=1.0, help="seconds per size")
    p.add_argument("--only", nargs="*", help="the algorithms to run (prefixes of their names)")
    p.add_argument("--streaming", action="store_true",
                   help="also streaming DiLoCo: the fraction of each fragment's reduction hidden")
    args = p.parse_args()
    out = [f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", ""]
    chosen = {name: flags for name, flags in ALGORITHMS.items()
              if not args.only or any(name.startswith(prefix) for prefix in args.only)}
    with tempfile.TemporaryDirectory() as name, EmulatedCluster(args.nodes, args.ppn, args.rate) as cluster:
        tmp = Path(name)
        with EmulatedCluster(1, args.ppn, args.rate) as node:
            memory, node_table = fit(node, tmp, args.max_bytes, args.bench_budget, args.ppn)
        network, table = fit(cluster, tmp, args.max_bytes, args.bench_budget, args.nodes, memory)
        spec = (f"alpha={network.alpha:.4g},beta={network.beta:.4g},"
                f"memory_alpha={memory.alpha:.4g},memory_beta={memory.beta:.4g}")
        out += [f"## Fit: bench allreduce across {args.nodes} nodes x {args.ppn} ranks, {args.rate}", "",
                *table, "", f"## Fit: bench allreduce in one node of {args.ppn} ranks", "", *node_table, "",
                f"`--network {spec}`", "",
                f"## {args.steps} steps, MLP {args.hidden}, median of {args.repeats}", "",
                "| algorithm | measured comm s | modelled s | modelled / measured | each run's ratio |",
                "|---|---:|---:|---:|---|"]
        for label, flags in chosen.items():
            runs = []
            for repeat in range(args.repeats):
                run = tmp / f"{len(out)}-{repeat}"
                hpcopt_job(cluster, "train", "--hidden", args.hidden, "--steps", str(args.steps), "--network",
                           spec, "--trace-every", "4", "--progress", "false", "--out", str(run), *flags,
                           timeout=1800)
                runs.append(comm_seconds(run / "trace.h5"))
            measured = statistics.median(m for m, _ in runs)
            modelled = statistics.median(m for _, m in runs)
            each = ", ".join(f"{b / a:.2f}" for a, b in runs)
            out.append(f"| {label} | {measured:.2f} | {modelled:.2f} | {modelled / measured:.2f} | {each} |")
            print(out[-1], flush=True)
        if args.streaming:
            out += ["", f"## Streaming DiLoCo ({' '.join(STREAMING[2:])}), median of {args.repeats}", "",
                    "| progress | measured comm s | modelled s | modelled / measured | fragments held s | "
                    "fragments unhidden s | hidden (each run) |", "|---|---:|---:|---:|---:|---:|---|",
                    *streaming_rows(cluster, tmp, spec, args)]
    out += ["", f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
