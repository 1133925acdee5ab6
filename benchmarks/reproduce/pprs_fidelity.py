"""PPRS fidelity: divergence on an unconstrained problem, the depth dependence of the time
model, and the measured pipeline time per iteration beside the modelled one.

Colin, Dos Santos, Scaman (NeurIPS 2019) report that at learning rate 1e-3 PPRS with K = 2
diverges and with K = 10 converges, while GD and AGD need 1e-5 and 1e-7; and that one iteration
costs about 2 tau (K + Delta - 1) against 2 tau Delta per gradient for GD and AGD. Three parts,
all on the l1 chain f(theta) = (1/m)||A theta - b||_1 (hpcopt.problems.l1_chain: convex,
non-smooth, no constraint, 8 parameter blocks, one per layer), run with ``train_pipeline``:

1. divergence, on 2 stages: pipelined GD, AGD (momentum 0.9) and PPRS (nesterov loop, momentum
   0.9, K in ``--samples``, gamma in ``--gammas``) at the paper's learning rates, on the chain as
   built and on the chain with its loss multiplied by ``--scale`` (the same as learning rates
   ``--scale`` times larger on the chain as built: the paper's rates only mean something
   against its problem's scale). Verdicts as in ``pprs_reproduce.py``;
2. depth, from the time model: for each method at its best learning rate on the scaled chain,
   the iterations to reach ``--target`` f(x_0), times the modelled time per iteration at Delta
   in {2, 4, 8}, with tau measured on 2 stages;
3. measured against modelled time per iteration at ``--stages`` (2 on this 2-core machine, 3
   and 4 oversubscribed) for GD and PPRS, on the chain as built (microsecond operations) and on
   a larger one (``--large-block`` parameters and ``--large-rows`` rows per block).

Run without mpiexec: the script drives its own MPI parts (``mpiexec -n DELTA python
benchmarks/reproduce/pprs_fidelity.py --worker ...``), then writes the sections ``pprs-divergence``,
``pprs-depth`` and ``pprs-measured`` of ``--page`` and every number to ``--json``
(``--from-json`` only rewrites the sections).

    python benchmarks/reproduce/pprs_fidelity.py [--lrs 1e-3 1e-5 1e-7] [--samples 2 10 100]
        [--scale 1e4] [--stages 2 3 4] [--page docs/results/pprs.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.launch import add_mpiexec_option, run_script  # noqa: E402
from benchmarks.common.sections import replace_section  # noqa: E402
from benchmarks.reproduce.pprs_reproduce import make_table, one_run, verdict  # noqa: E402
from hpcopt.comm import Comm, node_layout
from hpcopt.config import build_config
from hpcopt.pipeline.parts import L1_BLOCK_DIM, L1_BLOCKS, L1_ROWS
from hpcopt.problems.l1_chain import l1_chain
from hpcopt.problems.staged import StagedProblem
from hpcopt.run.pipeline import train_pipeline
from hpcopt.run.threads import configure_threads

MOMENTUM = 0.9
DEPTHS = (2, 4, 8)
BASE = {"problem": "l1_chain", "dtype": "float64"}


# -- the MPI parts ---------------------------------------------------------------------------

def scaled(problem: StagedProblem, scale: float) -> StagedProblem:
    """The same problem with its loss (and so its gradients and L) multiplied by ``scale``."""
    sink = problem.sink

    def scaled_sink(k: int, out: Any) -> tuple[Any, Any]:
        loss, grad = sink(k, out)
        return scale * loss, scale * grad

    return dataclasses.replace(problem, sink=scaled_sink,
                               lipschitz=scale * (problem.lipschitz or 0.0))


def methods(samples: list[int], gammas: list[float]) -> list[tuple[str, dict[str, str]]]:
    """(name, options) of every method of the divergence grid."""
    out = [("GD", {"algorithm": "pipelined_gd"}),
           ("AGD", {"algorithm": "pipelined_agd", "momentum": str(MOMENTUM)})]
    out += [(f"PPRS K={k} γ={g:g}", {"algorithm": "pprs", "samples": str(k), "smoothing": repr(g),
                                     "momentum": str(MOMENTUM)})
            for g in gammas for k in samples]
    return out


def divergence(comm: Comm, args: argparse.Namespace) -> dict:
    """Every (scale, lr, method) run on this job's stages (the loss curves, verdict inputs)."""
    base = l1_chain(L1_BLOCKS, L1_BLOCK_DIM, L1_ROWS, seed=0)
    baseline = args.iterations * (10 + comm.size - 1) // comm.size
    records = []
    for scale in (1.0, args.scale):
        problem = scaled(base, scale)
        name = "l1_chain" if scale == 1 else f"l1_chain, loss x {scale:g}"
        for lr in args.lrs:
            for method, options in methods(args.samples, args.gammas):
                steps = args.iterations if options["algorithm"] == "pprs" else baseline
                record = one_run(comm, problem, {**BASE, **options, "lr": repr(lr)}, steps,
                                 args.eval_every)
                record.update(problem=name, scale=scale, method=method, lr=lr,
                              samples=int(options.get("samples", 1)))
                records.append(record)
                if comm.rank == 0:
                    print(f"{name} lr {lr:g} {method}: {record['loss'][0]:.4g} -> "
                          f"{record['final']:.4g}", flush=True)
    return {"stages": comm.size, "iterations": args.iterations, "baseline_iterations": baseline,
            "runs": records}


def timing_problems(args: argparse.Namespace) -> dict[str, StagedProblem]:
    return {"l1 chain (4 parameters x 64 rows a block)":
            l1_chain(L1_BLOCKS, L1_BLOCK_DIM, L1_ROWS, seed=0),
            f"l1 chain ({args.large_block} parameters x {args.large_rows} rows a block)":
            l1_chain(L1_BLOCKS, args.large_block, args.large_rows, seed=0)}


def per_iteration(history: list[dict], stages: int) -> dict[str, float]:
    """Medians over the trace windows after the first (warm-up): the pipeline's measured seconds
    per iteration (the slowest stage's busy + idle), the wall per iteration, tau; the bubble over
    those windows."""
    rows, spans = history[1:], [b["step"] - a["step"] for a, b in zip(history, history[1:])]
    spent = [max(r[f"busy_{s}"] + r[f"idle_{s}"] for s in range(stages)) / n
             for r, n in zip(rows, spans)]
    walls = [(b["wall"] - a["wall"]) / n for a, b, n in zip(history, rows, spans)]
    busy = sum(r[f"busy_{s}"] for r in rows for s in range(stages))
    idle = sum(r[f"idle_{s}"] for r in rows for s in range(stages))
    return {"measured": statistics.median(spent), "wall": statistics.median(walls),
            "tau": statistics.median(r["tau"] for r in rows), "bubble": idle / (busy + idle)}


def timing(comm: Comm, args: argparse.Namespace) -> dict:
    """Per problem and K, the measured and modelled seconds per iteration on this job's stages."""
    records = []
    for name, problem in timing_problems(args).items():
        for k in [1, *args.timing_samples]:
            options = ({"algorithm": "pipelined_gd"} if k == 1 else
                       {"algorithm": "pprs", "samples": str(k), "smoothing": "0.01",
                        "momentum": str(MOMENTUM)})
            cfg = build_config(None, {**BASE, **options, "lr": "1e-3",
                                      "steps": str(args.timing_iterations), "eval_every": "0",
                                      "trace_every": str(max(1, args.timing_iterations // 8)),
                                      "progress": "false", "out": ""})
            summary, _ = train_pipeline(cfg, comm, verbose=False, problem=problem)
            figures = per_iteration(summary.history, comm.size)
            modelled = 2 * figures["tau"] * (k + comm.size - 1)
            records.append({"problem": name, "stages": comm.size, "samples": k,
                            "modelled": modelled, "ideal": summary.bubble_ideal,
                            "load": os.getloadavg()[0], **figures})
            if comm.rank == 0:
                print(f"{name} Delta {comm.size} K {k}: measured {1e3 * figures['measured']:.3f} "
                      f"ms, modelled {1e3 * modelled:.3f} ms, bubble {figures['bubble']:.2f}",
                      flush=True)
    return {"stages": comm.size, "runs": records}


def worker(args: argparse.Namespace) -> None:
    comm = Comm()
    configure_threads(node_layout(comm.mpi)[1])
    result = divergence(comm, args) if args.worker == "divergence" else timing(comm, args)
    if comm.rank == 0:
        args.worker_json.write_text(json.dumps(result))
    comm.free()


# -- the tables ------------------------------------------------------------------------------

def reach(run: dict, target: float) -> int | None:
    """The first evaluated iteration at which f(x_t) <= target (None: never)."""
    return next((s for s, v in zip(run["step"], run["loss"]) if v <= target), None)


def depth_rows(div: dict, target_share: float) -> list[dict]:
    """Per method, its best learning rate on the scaled chain (fewest iterations to the target)
    and the modelled time to the target at every depth, in units of tau."""
    scaled_runs = [r for r in div["runs"] if r["scale"] != 1]
    rows = []
    for method in dict.fromkeys(r["method"] for r in scaled_runs):
        mine = [r for r in scaled_runs if r["method"] == method]
        target = target_share * mine[0]["loss"][0]
        hits = [(reach(r, target), r) for r in mine if reach(r, target) is not None]
        if not hits:
            rows.append({"method": method, "iterations": None})
            continue
        its, run = min(hits, key=lambda h: h[0])
        k = run["samples"]
        per_iteration = {d: 2 * (k + d - 1 if method.startswith("PPRS") else d) for d in DEPTHS}
        rows.append({"method": method, "lr": run["lr"], "iterations": its, "tau": run["tau"],
                     "deeper": {d: its * t for d, t in per_iteration.items()},
                     "finer": {d: its * t * 2 / d for d, t in per_iteration.items()}})
    return rows


def divergence_section(div: dict, target: float) -> str:
    head = ("Final f(x) by learning rate and method, 2 stages, seed 0. "
            f"PPRS runs {div['iterations']} iterations, GD and AGD {div['baseline_iterations']} "
            "(the modelled time of PPRS K = 10 at equal tau). f(x) is evaluated without "
            "smoothing. Below each problem's tables, the runs that diverged.\n")
    lines = [head, make_table(div, target)]
    for problem in dict.fromkeys(r["problem"] for r in div["runs"]):
        mine = [r for r in div["runs"] if r["problem"] == problem]
        floor = min(min(v for v in r["loss"] if math.isfinite(v)) for r in mine)
        diverged = {m: [f"{r['lr']:g}" for r in mine if r["method"] == m
                        and verdict(r, floor, target) == "diverged"]
                    for m in dict.fromkeys(r["method"] for r in mine)}
        named = "; ".join(f"{m} at lr {', '.join(v)}" for m, v in diverged.items() if v)
        lines.append(f"Diverged on {problem}: {named or 'none'}.")
        lines.append("")
    return "\n".join(lines)


def depth_section(div: dict, target_share: float) -> str:
    rows = depth_rows(div, target_share)

    def cells(times: dict) -> str:
        return " | ".join(f"{times[d]:.0f}" for d in DEPTHS)

    lines = [
        f"Target: f(x) <= {target_share:g} f(x_0) on the scaled chain, each method at its best "
        "learning rate of the grid (fewest iterations to the target, evaluated every "
        f"{div['runs'][0]['step'][1]} iterations). Modelled time to the target, in units of "
        "tau: iterations x 2 (K + Delta - 1) for PPRS, iterations x 2 Delta for GD and AGD. "
        "\"Deeper\": the paper's reading, Delta layers of tau each (a deeper network; the "
        "iterations of the 2-stage run assumed); \"cut finer\": the same 8-block chain on Delta "
        "stages, tau_Delta = 2 tau_2 / Delta (balanced, no latency), in units of tau_2. tau_2: "
        "the slowest stage's busy seconds per forward or backward of one sample, measured in "
        "the 2-stage run (it differs between methods mostly by the load on the machine; PPRS "
        "also draws noise).",
        "",
        "| method | lr | iterations | tau_2 µs | " + " | ".join(
            f"deeper Δ={d}" for d in DEPTHS) + " | " + " | ".join(
            f"cut finer Δ={d}" for d in DEPTHS) + " |",
        "|---|---:|---:|---:|" + "---:|" * (2 * len(DEPTHS)),
    ]
    for r in rows:
        if r["iterations"] is None:
            lines.append(f"| {r['method']} | – | not reached | – |" + " – |" * (2 * len(DEPTHS)))
            continue
        lines.append(f"| {r['method']} | {r['lr']:g} | {r['iterations']} | {1e6 * r['tau']:.1f} "
                     f"| {cells(r['deeper'])} | {cells(r['finer'])} |")
    return "\n".join(lines) + "\n"


def measured_section(runs: list[dict], cores: int) -> str:
    loads = [r["load"] for r in runs]
    lines = [
        f"Per iteration (medians over the trace windows of a run, the first left out), seconds "
        "in the pipeline (the slowest stage's busy + idle, so no update, trace or evaluation) "
        "against the model 2 tau (K + Delta - 1) with tau measured in the same run; the wall "
        "per iteration (update and trace rows included); the "
        "measured bubble (idle share, all stages) against the ideal (Delta - 1)/(K + Delta - 1); "
        "and for Delta > 2 the model fed by the Delta = 2 run of the same problem and K: "
        "2 tau_2 (b_Delta / b_2) (K + Delta - 1), b = blocks on the fullest stage (8 blocks "
        f"balanced: 4, 3, 2 for Delta = 2, 3, 4). This machine has {cores} cores: Delta > "
        f"{cores} is oversubscribed (more stages than cores), and MPICH's waiting ranks spin, "
        "taking a core from the busy ones. The machine was shared with other jobs: load "
        f"average {min(loads):.1f} to {max(loads):.1f} during these runs.",
        "",
        "| problem | Δ | K | measured ms | modelled ms | measured / modelled | "
        "model from Δ=2 ms | wall ms | tau µs | bubble measured | bubble ideal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    two = {(r["problem"], r["samples"]): r for r in runs if r["stages"] == 2}
    for r in sorted(runs, key=lambda r: (r["problem"], r["samples"], r["stages"])):
        base = two.get((r["problem"], r["samples"]))
        predicted = "–"
        if base and r["stages"] != 2:
            share = math.ceil(L1_BLOCKS / r["stages"]) / math.ceil(L1_BLOCKS / 2)
            predicted = f"{1e3 * 2 * base['tau'] * share * (r['samples'] + r['stages'] - 1):.3f}"
        lines.append(
            f"| {r['problem']} | {r['stages']} | {r['samples']} | {1e3 * r['measured']:.3f} | "
            f"{1e3 * r['modelled']:.3f} | {r['measured'] / r['modelled']:.2f} | {predicted} | "
            f"{1e3 * r['wall']:.3f} | {1e6 * r['tau']:.1f} | {100 * r['bubble']:.0f}% | "
            f"{100 * r['ideal']:.0f}% |")
    return "\n".join(lines) + "\n"


def write(data: dict, args: argparse.Namespace) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data))
    sections = {"pprs-divergence": divergence_section(data["divergence"], args.verdict_target),
                "pprs-depth": depth_section(data["divergence"], args.target),
                "pprs-measured": measured_section(data["timing"], data["cores"])}
    for name, text in sections.items():
        replace_section(args.page, name, text)
        print(text)


def drive(args: argparse.Namespace) -> dict:
    """Run the MPI parts (one mpiexec each) and gather their results."""
    common = [str(a) for a in ("--iterations", args.iterations, "--eval-every", args.eval_every,
                               "--scale", args.scale, "--timing-iterations",
                               args.timing_iterations, "--large-block", args.large_block,
                               "--large-rows", args.large_rows)]
    common += ["--lrs", *map(repr, args.lrs), "--samples", *map(str, args.samples),
               "--gammas", *map(repr, args.gammas),
               "--timing-samples", *map(str, args.timing_samples)]
    with tempfile.TemporaryDirectory() as tmp:
        def part(ranks: int, kind: str) -> dict:
            path = Path(tmp) / f"{kind}-{ranks}.json"
            print(run_script(ranks, __file__, "--worker", kind, "--worker-json",
                             str(path), *common, mpiexec=args.mpiexec), end="", flush=True)
            return json.loads(path.read_text())

        div = part(2, "divergence")
        timed = [r for stages in args.stages for r in part(stages, "timing")["runs"]]
    return {"divergence": div, "timing": timed, "cores": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-4, 1e-4, 1e-5, 1e-7])
    parser.add_argument("--samples", type=int, nargs="+", default=[2, 10, 100])
    parser.add_argument("--gammas", type=float, nargs="+", default=[0.01, 1.0])
    parser.add_argument("--scale", type=float, default=1e4)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--verdict-target", type=float, default=0.5,
                        help="converged: below this share of the way from f(x_0) to the lowest f")
    parser.add_argument("--target", type=float, default=0.1,
                        help="depth table: time to reach this share of f(x_0)")
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--timing-samples", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--timing-iterations", type=int, default=40)
    parser.add_argument("--large-block", type=int, default=64)
    parser.add_argument("--large-rows", type=int, default=2048)
    parser.add_argument("--page", type=Path, default=Path("docs/results/pprs.md"))
    parser.add_argument("--json", type=Path, default=Path("docs/results/pprs/fidelity.json"))
    parser.add_argument("--from-json", type=Path, help="only rewrite the sections from this JSON")
    add_mpiexec_option(parser)
    parser.add_argument("--worker", choices=["divergence", "timing"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
    elif args.from_json:
        write(json.loads(args.from_json.read_text()), args)
    else:
        write(drive(args), args)


if __name__ == "__main__":
    main()
