"""PPRS reproduction: PPRS (K in {2, 10, 100}) against pipelined GD and Nesterov AGD.

Colin, Dos Santos, Scaman, NeurIPS 2019, experiments: an l_inf-bounded adversarial attack on a
trained MLP (MNIST-5k) and few-shot training of a small ReLU MLP with a hinge loss, both
non-smooth. For every (problem, algorithm, learning rate) the script runs ``train_pipeline``
(the same loop as ``hpcopt train --algorithm pprs|pipelined_gd|pipelined_agd``) on the ranks
of this job, one stage each, and records f(x_t) without smoothing every few iterations
against iterations, measured wall time and the modelled pipeline time
sum_t 2 tau (K + Delta - 1) (tau: the slowest stage's measured seconds per forward or backward
of one sample; K = 1 for GD and AGD). The problems are built once (the attacked classifier is
trained once) and shared by all runs.

PPRS runs ``--iterations`` iterations; GD and AGD run ``--baseline-iterations`` (default: as
many as give them the modelled time of PPRS with K = 10). A run counts as diverged when its
loss becomes non-finite or ends above its start, as converged when it ends below
``--target`` x (start - floor) + floor (floor: the smallest loss any run reached).

    mpiexec -n 2 python benchmarks/reproduce/pprs_reproduce.py --out docs/results/pprs \
        [--problems attack few_shot] [--lrs 10 1 1e-1 1e-3 1e-5 1e-7] [--samples 2 10 100]
        [--iterations 60] [--eval-every 5] [--gamma G]

Writes ``results.json`` (every curve), ``table.md`` and PNG plots (needs matplotlib) to --out,
and with ``--page PAGE`` the tables into PAGE's section ``--section`` (the rest of the page stays);
``--from-json FILE`` only redoes the table and plots. On the time axes (log scale) a curve
starts at its first evaluation, after ``--eval-every`` iterations.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from hpcopt.comm import Comm, node_layout
from hpcopt.config import build_config
from hpcopt.pipeline.parts import build_problem
from hpcopt.run.pipeline import train_pipeline
from hpcopt.run.threads import configure_threads

#: Per problem: the data/model options and PPRS's smoothing gamma (hand-set, as in the paper).
PROBLEMS = {
    "attack": ({"problem": "attack", "hidden": "128,128", "images": "10", "eps": "0.1"}, 0.01),
    "few_shot": ({"problem": "few_shot", "hidden": "32", "shots": "5"}, 0.01),
}
MOMENTUM = 0.9


def runs(samples: list[int]) -> list[tuple[str, str, dict[str, str]]]:
    """(name, algorithm, extra options) of every method compared."""
    methods = [("GD", "pipelined_gd", {}), ("AGD", "pipelined_agd", {"momentum": str(MOMENTUM)})]
    methods += [(f"PPRS K={k}", "pprs", {"samples": str(k), "momentum": str(MOMENTUM)})
                for k in samples]
    return methods


def one_run(comm: Comm, problem, options: dict[str, str], iterations: int,
            eval_every: int) -> dict:
    cfg = build_config(None, {**options, "steps": str(iterations), "eval_every": str(eval_every),
                              "trace_every": str(eval_every), "dtype": "float64",
                              "progress": "false", "out": ""})
    start = time.perf_counter()
    summary, _ = train_pipeline(cfg, comm, verbose=False, problem=problem)
    rows = summary.history
    start_loss = problem.value(problem.params)  # f(x_0): x_0 is the problem's start (in its box)
    return {"step": [0] + [r["step"] for r in rows],
            "loss": [start_loss] + [r["eval_loss"] for r in rows],
            "train_loss": [math.nan] + [r["loss_mean"] for r in rows],
            "wall": [0.0] + [r["wall"] for r in rows],
            "modelled": [0.0] + [r["modelled_time"] for r in rows],
            "final": summary.final_loss, "seconds": time.perf_counter() - start,
            "tau": statistics.median(r["tau"] for r in rows),
            "bubble": summary.bubble, "bubble_ideal": summary.bubble_ideal,
            "messages": summary.messages, "iterations": summary.steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--lrs", type=float, nargs="+", default=[10, 1, 1e-1, 1e-3, 1e-5, 1e-7])
    parser.add_argument("--samples", type=int, nargs="+", default=[2, 10, 100])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--baseline-iterations", type=int, default=0,
                        help="GD/AGD iterations (0: the modelled time of PPRS K=10)")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--gamma", type=float, default=None,
                        help="PPRS smoothing for every problem (default: the per-problem value)")
    parser.add_argument("--page", type=Path,
                        help="also write the tables into this results page (section --section)")
    parser.add_argument("--section", default="pprs", help="the page's section to rewrite")
    parser.add_argument("--from-json", type=Path,
                        help="only redo the table and plots from an earlier results.json")
    args = parser.parse_args()
    if args.from_json:
        write(json.loads(args.from_json.read_text()), args)
        return
    comm = Comm()
    configure_threads(node_layout(comm.mpi)[1])  # before building: the classifier trains here
    stages = comm.size
    baseline = args.baseline_iterations or args.iterations * (10 + stages - 1) // stages
    results: dict = {"stages": stages, "iterations": args.iterations,
                     "baseline_iterations": baseline, "momentum": MOMENTUM, "runs": []}
    for name in args.problems:
        options, gamma = PROBLEMS[name]
        gamma = gamma if args.gamma is None else args.gamma
        t0 = time.perf_counter()
        problem = build_problem(build_config(None, {**options, "algorithm": "pprs",
                                                    "dtype": "float64"}))
        if comm.rank == 0:
            print(f"{name}: built in {time.perf_counter() - t0:.1f} s", flush=True)
        for lr in args.lrs:
            for method, algorithm, extra in runs(args.samples):
                opts = {**options, **extra, "algorithm": algorithm, "lr": repr(lr)}
                if algorithm == "pprs":
                    opts["smoothing"] = repr(gamma)
                steps = args.iterations if algorithm == "pprs" else baseline
                record = one_run(comm, problem, opts, steps, args.eval_every)
                record.update(problem=name, method=method, lr=lr,
                              gamma=gamma if algorithm == "pprs" else 0.0)
                results["runs"].append(record)
                if comm.rank == 0:
                    print(f"{name:8s} lr {lr:7.0e} {method:12s} loss {record['loss'][0]:9.4g} -> "
                          f"{record['final']:9.4g}  {record['seconds']:6.1f} s  "
                          f"modelled {record['modelled'][-1]:7.3f} s  "
                          f"bubble {100 * record['bubble']:4.1f}% "
                          f"(ideal {100 * record['bubble_ideal']:4.1f}%)", flush=True)
    if comm.rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results))
        print(write(results, args))


def write(results: dict, args: argparse.Namespace) -> str:
    """table.md and the plots in --out, and the tables in --page's section; the tables."""
    args.out.mkdir(parents=True, exist_ok=True)
    table = make_table(results, args.target)
    (args.out / "table.md").write_text(table)
    if args.page:
        from benchmarks.common.sections import replace_section

        replace_section(args.page, args.section, table)
    plot(results, args.out)
    return table


def verdict(run: dict, floor: float, target: float) -> str:
    start, final = run["loss"][0], run["final"]
    if not math.isfinite(final) or not all(math.isfinite(v) for v in run["loss"]) or final > start:
        return "diverged"
    if final <= floor + target * (start - floor):
        return "converged"
    return "slow"


def make_table(results: dict, target: float) -> str:
    """Per problem: final f(x) by learning rate and method (with the verdict), then the cost of
    one iteration of each method (medians over the learning rates)."""
    lines = []
    for problem in dict.fromkeys(r["problem"] for r in results["runs"]):
        mine = [r for r in results["runs"] if r["problem"] == problem]
        floor = min(min(v for v in r["loss"] if math.isfinite(v)) for r in mine)
        methods = list(dict.fromkeys(r["method"] for r in mine))
        iterations = {m: next(r["iterations"] for r in mine if r["method"] == m) for m in methods}
        lines += [f"### {problem}: f(x_0) = {mine[0]['loss'][0]:.4g}, lowest f reached "
                  f"{floor:.4g}", "",
                  "final f(x) (C converged: below the midpoint between f(x_0) and the lowest; "
                  "D diverged: above f(x_0) or not finite; S slow: neither)", "",
                  "| lr | " + " | ".join(f"{m} ({iterations[m]} it.)" for m in methods) + " |",
                  "|---|" + "---|" * len(methods)]
        for lr in dict.fromkeys(r["lr"] for r in mine):
            cells = []
            for m in methods:
                r = next(r for r in mine if r["lr"] == lr and r["method"] == m)
                cells.append(f"{r['final']:.4g} {verdict(r, floor, target)[0].upper()}")
            lines.append(f"| {lr:.0e} | " + " | ".join(cells) + " |")
        lines += ["", "cost per iteration, medians over the learning rates (wall: the whole run, "
                  "set-up, evaluations and trace rows included; modelled: 2 tau (K + Delta - 1))",
                  "",
                  "| method | wall ms | modelled ms | tau ms | bubble measured | bubble ideal | "
                  "messages |", "|---|---|---|---|---|---|---|"]
        for m in methods:
            runs_m = [r for r in mine if r["method"] == m]
            def med(f: Callable[[dict], float], runs_m: list[dict] = runs_m) -> float:
                return statistics.median(f(r) for r in runs_m)

            lines.append(
                f"| {m} | {1e3 * med(lambda r: r['seconds'] / r['iterations']):.2f} | "
                f"{1e3 * med(lambda r: r['modelled'][-1] / r['iterations']):.2f} | "
                f"{1e3 * med(lambda r: r['tau']):.3f} | {100 * med(lambda r: r['bubble']):.0f}% | "
                f"{100 * runs_m[0]['bubble_ideal']:.0f}% | "
                f"{runs_m[0]['messages'] // runs_m[0]['iterations']} |")
        lines.append("")
    return "\n".join(lines)


def plot(results: dict, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install 'hpcopt[plot]')")
        return
    axes_keys = (("step", "iterations"), ("wall", "measured wall time (s)"),
                 ("modelled", "modelled pipeline time (s)"))
    for problem in dict.fromkeys(r["problem"] for r in results["runs"]):
        mine = [r for r in results["runs"] if r["problem"] == problem]
        lrs = list(dict.fromkeys(r["lr"] for r in mine))
        fig, axes = plt.subplots(len(lrs), 3, figsize=(15, 3.4 * len(lrs)), squeeze=False)
        for i, lr in enumerate(lrs):
            for j, (key, label) in enumerate(axes_keys):
                ax = axes[i][j]
                for r in (r for r in mine if r["lr"] == lr):
                    skip = 1 if j else 0  # time 0 (the start) has no place on a log axis
                    ax.plot(r[key][skip:], r["loss"][skip:], label=r["method"])
                ax.set_xlabel(label)
                ax.set_ylabel("f(x)")
                ax.set_title(f"{problem}, lr {lr:.0e}")
                if j:
                    ax.set_xscale("log")
            axes[i][0].legend(fontsize=8)
        fig.tight_layout()
        path = out / f"pprs_{problem}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
