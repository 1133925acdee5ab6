"""The node-aware cost model against measured seconds on emulated links (root: network namespaces).

    python -m benchmarks.cluster.costmodel_links [--nodes 2] [--ppn 2] [--rate 100mbit] [--repeats 3]
                                                 [--load 0 2]

On an ``EmulatedCluster`` (benchmarks/cluster/emulated.py):

Once per load level (``--load``, default 0 and 2: idle, then two busy processes on the same
cores for the whole level: benchmarks/common/load.py), everything below runs under that load:

1. Fit: ``hpcopt bench allreduce --within node`` (Comm.average_ with averaging auto, every
   node's allreduce at once), fitted over a node's ranks: ``memory_alpha`` and ``memory_beta``,
   what in-node calls cost here (the nominal ``shm`` profile, measured on an idle machine, is
   20-40 times faster than the in-node averages of 4 busy ranks on 2 shared cores); then across
   the nodes, alpha and beta fitted in the model's form over the nodes to each time less its
   in-node level (``fit_allreduce`` with ranks = nodes and the layout). Both on the slowest
   rank's times: the wall clock waits for it.
2. Compute: a run with no average within its steps (``COMPUTE``, one per inner optimizer: SGD,
   and DiLoCo's AdamW): its wall seconds less its calls' per step, the step's compute seconds
   on these cores at this load (``costmodel.fit_compute``); one before the first repeat and one
   after each, and a repeat's
   runs are priced with the mean of the two around them (the machine's other load drifts).
3. Validate: one training run per algorithm (``ALGORITHMS``: those of
   benchmarks/cluster/study.py), each with ``--network`` from the fit. The check is the wall
   clock: the measured seconds per step between the trace's first and last rows against the
   cost model's, ``costmodel.StepModel``: the step's compute plus the modelled seconds of the
   calls the trace counted in the same window (non-blocking ones less what overlap hid), plus
   for a compressed wire its rounds' seconds outside their calls (encoding and decoding),
   measured on a round alone before the runs (benchmarks/cluster/wire_rounds.py with the fit's
   ``--network``: a round's seconds less its calls' modelled ones). Rank
   0's seconds in its calls and their modelled seconds stay beside it as a diagnostic (where the
   time went), not the check. Medians over ``--repeats`` (the algorithms interleaved: every
   repeat runs each once).

Prints markdown tables per load level (its busy processes and the load average; the fits, the
compute, the wall check), with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.cluster.emulated import EmulatedCluster  # noqa: E402
from benchmarks.common.load import add_load_option, busy  # noqa: E402
from hpcopt.comm import costmodel  # noqa: E402
from hpcopt.io.trace import read_trace  # noqa: E402

#: The algorithms compared (those of benchmarks/cluster/study.py): name -> training flags.
ALGORITHMS = {
    "synchronous (I=1)": ["--interval", "1"],
    "PR-SGD (I=8)": ["--interval", "8"],
    "PR-SGD (I=32)": ["--interval", "32"],
    "naive clipping": ["--algorithm", "naive_clip", "--gamma", "1.0"],
    "CELGC (I=16)": ["--algorithm", "celgc", "--interval", "16", "--gamma", "1.0"],
    "SlowMo (I=8)": ["--algorithm", "slowmo", "--interval", "8"],
    "DiLoCo (I=8)": ["--algorithm", "diloco", "--interval", "8"],
    "Streaming DiLoCo (I=8)": ["--algorithm", "diloco", "--interval", "8", "--fragments", "4",
                               "--overlap", "2"],
    "two-level (node every 2, all every 8)": ["--interval", "8", "--group-size", "node",
                                              "--group-interval", "2"],
    "int8 round (I=1)": ["--interval", "1", "--wire", "int8"],
    "int8 round (I=8)": ["--interval", "8", "--wire", "int8"],
}
#: The runs a step's compute seconds are fitted to, per inner optimizer (DiLoCo's AdamW makes
#: more passes over the model a step than SGD): no average within their steps (the interval is
#: longer than any run here), so their wall clock is computation and the trace's gathers.
COMPUTE = {"sgd": ["--interval", "100000"], "adamw": ["--algorithm", "diloco", "--interval", "100000"]}


def inner_optimizer(flags: list[str]) -> str:
    """The ``COMPUTE`` key of an algorithm's training flags."""
    return "adamw" if "diloco" in flags else "sgd"
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
            trace = train(cluster, tmp / f"streaming-{len(lines)}-{repeat}", spec, args, STREAMING, env)
            runs.append((*comm_seconds(trace), *hidden_fraction(trace, spec, layout)))
        measured, modelled, held, unhidden, hidden = (statistics.median(r[i] for r in runs) for i in range(5))
        each = ", ".join(f"{r[4]:.2f}" for r in runs)
        lines.append(f"| {progress} | {measured:.2f} | {modelled:.2f} | {modelled / measured:.2f} | "
                     f"{held:.2f} | {unhidden:.2f} | {hidden:.2f} ({each}) |")
        print(lines[-1], flush=True)
    return lines


class Window(NamedTuple):
    """A run between its first trace row and its last (``costmodel.trace_window``: start-up
    left out), set-up labels left out."""

    steps: float
    wall: float       # measured wall seconds
    modelled: float   # modelled seconds of the calls
    measured: float   # rank 0's seconds in its calls
    rounds: float     # averaging rounds


def wall_window(trace_path: Path) -> Window:
    """The window of a run's trace (``Window``)."""
    trace = read_trace(trace_path)
    step, wall = trace.columns["step"], trace.columns["wall"]
    steps, seconds, modelled = costmodel.trace_window(step, wall,
                                                      costmodel.trace_comm_seconds(trace.comm, "modelled"))
    measured = costmodel.trace_window(step, wall, costmodel.trace_comm_seconds(trace.comm))[2]
    rounds = costmodel.trace_window(step, wall, trace.columns["rounds"])[2]
    return Window(steps, seconds, modelled, measured, rounds)


def train(cluster: EmulatedCluster, run: Path, spec: str, args: argparse.Namespace, flags: list[str],
          env: dict[str, str] | None = None) -> Path:
    """One training run of ``args``' MLP on ``cluster`` with ``--network spec`` (the ranks' extra
    environment ``env``); its trace."""
    hpcopt_job(cluster, "train", "--hidden", args.hidden, "--steps", str(args.steps), "--network", spec,
               "--trace-every", "4", "--progress", "false", "--out", str(run), *flags, timeout=1800, env=env)
    return run / "trace.h5"


def compute_seconds(cluster: EmulatedCluster, run: Path, spec: str, args: argparse.Namespace,
                    kinds: set[str]) -> dict[str, float]:
    """A step's compute seconds per inner optimizer of ``kinds``, each fitted to its run of
    ``COMPUTE`` (``costmodel.fit_compute``)."""
    out = {}
    for kind in sorted(kinds):
        window = wall_window(train(cluster, run.with_name(f"{run.name}-{kind}"), spec, args, COMPUTE[kind]))
        out[kind] = costmodel.fit_compute(window.wall, window.measured, window.steps).compute
    return out


def round_computes(cluster: EmulatedCluster, tmp: Path, spec: str,
                   args: argparse.Namespace) -> dict[str, float]:
    """Compressing wire -> a round's seconds outside its calls on ``cluster``: the hierarchical
    rounds of benchmarks/cluster/wire_rounds.py, the MLP's values, ``--network spec``
    (``costmodel.fit_round_compute``). A float32 round is an average, priced by its calls."""
    out = tmp / "wire-rounds.json"
    job = cluster.mpiexec([sys.executable, "-m", "benchmarks.cluster.wire_rounds", "--json", str(out),
                           "--values", str(args.values), "--rounds", "3", "--load", "0", "--network", spec],
                          "ofi", 1800, dict(os.environ, PYTHONPATH=str(ROOT)), ROOT)
    if job.returncode:
        raise SystemExit(f"wire rounds failed: {job.describe()}")
    results = json.loads(out.read_text())["results"]
    return {name.split()[0]: r["outside"] for name, r in results.items()
            if "outside" in r and not name.startswith("float32")}


def level_rows(cluster: EmulatedCluster, tmp: Path, args: argparse.Namespace, chosen: dict[str, list[str]],
               level: int) -> list[str]:
    """Fit, calibrate and validate with ``level`` busy processes on the cores (``busy``): the
    section of the report for that load."""
    tmp.mkdir(parents=True, exist_ok=True)
    with busy(level) as load:
        memory, node_table = fit(cluster, tmp, args.max_bytes, args.bench_budget, args.ppn, within="node")
        network, table = fit(cluster, tmp, args.max_bytes, args.bench_budget, args.nodes, memory)
        spec = (f"alpha={network.alpha:.4g},beta={network.beta:.4g},"
                f"memory_alpha={memory.alpha:.4g},memory_beta={memory.beta:.4g}")
        # repeat r's runs are priced with the mean compute of the calibrations just before and
        # just after them: the machine's other load drifts over minutes
        kinds = {inner_optimizer(flags) for flags in chosen.values()}
        computes = [compute_seconds(cluster, tmp / "compute-0", spec, args, kinds)]
        outside = round_computes(cluster, tmp, spec, args)
        runs: dict[str, list[Window]] = {label: [] for label in chosen}
        for r in range(args.repeats):
            for i, (label, flags) in enumerate(chosen.items()):
                run = wall_window(train(cluster, tmp / f"run-{i}-{r}", spec, args, flags))
                runs[label].append(run)
                print(f"  {label}, repeat {r + 1}: {1e3 * run.wall / run.steps:.1f} ms / step", flush=True)
            computes.append(compute_seconds(cluster, tmp / f"compute-{r + 1}", spec, args, kinds))
        rows: list[str] = []
        for label, flags in chosen.items():
            wire = flags[flags.index("--wire") + 1] if "--wire" in flags else "float32"
            kind = inner_optimizer(flags)
            steps = [costmodel.StepModel((a[kind] + b[kind]) / 2, outside.get(wire, 0.0))
                     for a, b in zip(computes, computes[1:])]
            typical = statistics.median(step.compute for step in steps)
            measured = [run.wall / run.steps for run in runs[label]]
            modelled = [step.per_step(run.steps, run.modelled, run.rounds)
                        for step, run in zip(steps, runs[label])]
            each = ", ".join(f"{b / a:.2f}" for a, b in zip(measured, modelled))
            wall, model = statistics.median(measured), statistics.median(modelled)
            comm, priced = (statistics.median(getattr(run, field) / run.steps for run in runs[label])
                            for field in ("measured", "modelled"))
            rows.append(f"| {label} | {1e3 * wall:.1f} | {1e3 * model:.1f} | {model / wall:.2f} | {each} | "
                        f"{1e3 * comm:.1f} | {1e3 * priced:.1f} | {1e3 * typical:.1f} | "
                        f"{1e3 * outside.get(wire, 0.0):.1f} |")
        streaming = streaming_rows(cluster, tmp, spec, args) if args.streaming else []
    calibrated = "; ".join(f"{kind} (`{' '.join(COMPUTE[kind])}`) "
                           + ", ".join(f"{1e3 * c[kind]:.1f}" for c in computes) + " ms"
                           for kind in sorted(kinds))
    ratios = [float(row.split(" | ")[3]) for row in rows]
    inside = sum(0.75 <= r <= 1.25 for r in ratios)
    out = [f"## Load: {load.describe()} (load average {load.load_before:.2f} at the start)", "",
           f"### Fit: bench allreduce across {args.nodes} nodes x {args.ppn} ranks, {args.rate}", "",
           *table, "", f"### Fit: bench allreduce in each node of {args.ppn} ranks", "", *node_table, "",
           f"`--network {spec}`; a step's compute, before the first repeat and after each: {calibrated}", "",
           f"### Wall seconds per step, {args.steps} steps, MLP {args.hidden}, median of {args.repeats}", "",
           f"Within 25%: {inside} of {len(ratios)} algorithms.", "",
           "| algorithm | measured ms / step | modelled ms / step | modelled / measured | each run's ratio | "
           "comm ms / step (rank 0, diagnostic) | modelled comm ms / step | compute ms / step | "
           "compressed round's ms outside calls |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|", *rows]
    if streaming:
        out += ["", f"### Streaming DiLoCo ({' '.join(STREAMING[2:])}), median of {args.repeats}", "",
                "| progress | measured comm s | modelled s | modelled / measured | fragments held s | "
                "fragments unhidden s | hidden (each run) |", "|---|---:|---:|---:|---:|---:|---|",
                *streaming]
    return out + [""]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ppn", type=int, default=2)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--hidden", default="1024,1024", help="the MLP's hidden layers (a round of a few MB)")
    p.add_argument("--values", type=int, default=1_863_690,
                   help="the MLP's parameters: the size of the compressed rounds timed alone")
    p.add_argument("--max-bytes", default="4M", help="largest size of the allreduce benchmark")
    p.add_argument("--bench-budget", type=float, default=1.0, help="seconds per size")
    p.add_argument("--only", nargs="*", help="the algorithms to run (prefixes of their names)")
    p.add_argument("--streaming", action="store_true",
                   help="also streaming DiLoCo: the fraction of each fragment's reduction hidden")
    add_load_option(p)
    args = p.parse_args()
    out = [f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", ""]
    chosen = {name: flags for name, flags in ALGORITHMS.items()
              if not args.only or any(name.startswith(prefix) for prefix in args.only)}
    with tempfile.TemporaryDirectory() as name, EmulatedCluster(args.nodes, args.ppn, args.rate) as cluster:
        for level in args.load:
            out += level_rows(cluster, Path(name) / f"load-{level}", args, chosen, level)
    out += [f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
