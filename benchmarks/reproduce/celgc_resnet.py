"""CELGC against naive parallel clipping on a batch-norm ResNet at laptop scale (``hpcopt train``).

The CELGC paper (Liu, Zhuang, Lei, Liao, NeurIPS 2022) also trains ResNet-56 on CIFAR-10 (eta
0.3, gamma 1.0, batch 64, N = 8 workers, I in {2, ..., 32}) and finds CELGC as accurate per
epoch as naive parallel clipping (gradients averaged every step) with I times fewer rounds, and
clipping firing more often. Here: ResNet-8 of width 8 on MNIST-5k, 4 ranks, batch 32 per rank,
plain clipped SGD at eta 0.3, the same number of epochs for every run. Each run is one
``mpiexec -n 4 python -m hpcopt train`` writing its trace, a task of a study (``--runs``/probe
and ``--runs``/sweep, run by ``python -m hpcopt sweep --local`` and gathered by ``hpcopt
collect``); a run whose trace has its summary is not run again.

- The probe: short runs of naive clipping and CELGC I = 8 for each of ``--probe-gammas``, for
  the share of steps in which clipping fires (with the paper's gamma 1.0, threshold
  gamma/eta = 3.3, it never fired in the probe); ``--probe-only`` stops after it.
- The sweep: naive clipping and CELGC at ``--intervals``, with ``--gamma``, per seed.

    python benchmarks/reproduce/celgc_resnet.py --probe-only [--probe-gammas 0.3 0.45 1] [--probe-epochs 3]
    python benchmarks/reproduce/celgc_resnet.py --probe-epochs 3 --probe-gammas 0.3 0.45 1 --gamma 0.3 \
        --epochs 60 --seeds 0 1 --intervals 1 2 8 32

The second is the run of ``docs/results/celgc.md`` (8 runs of ~155 s each on 2 cores).
Writes the section ``celgc-resnet`` of ``docs/results/celgc.md`` (probe and sweep tables) and
the ``hpcopt report`` figures of the first seed's sweep under ``docs/results/celgc-resnet/``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.launch import ROOT, add_mpiexec_option  # noqa: E402
from benchmarks.common.sections import mean_sd, replace_section  # noqa: E402
from benchmarks.common.study import Run, find_run, run_study, sweep_file  # noqa: E402
from benchmarks.reproduce.celgc_reproduce import clip_fraction  # noqa: E402
from benchmarks.reproduce.resnet_mnist import BATCH, MNIST_TRAIN, RANKS, figures_of_run  # noqa: E402
from hpcopt.report import write_report
from hpcopt.io.trace import read_trace

#: Shared by every run: the model of the PR-SGD ResNet reproduction, the paper's step size.
COMMON = {"dataset": "mnist5k", "model": "resnet", "depth": 8, "width": 8, "batch-size": BATCH,
          "lr": 0.3, "eval-every": MNIST_TRAIN // RANKS // BATCH, "progress": "false"}


def algorithm(interval: int) -> dict[str, str | int]:
    """Naive parallel clipping for interval 1 (it averages gradients every step), else CELGC."""
    return {"algorithm": "naive_clip" if interval == 1 else "celgc", "interval": interval}


def label(interval: int) -> str:
    return "naive" if interval == 1 else f"celgc-I{interval}"


def study(grids: list[dict], part: str, args: argparse.Namespace) -> list[Run]:
    """Run one part's grids as a study in ``--runs``/PART (finished runs are kept); its runs."""
    train = {k.replace("-", "_"): v for k, v in COMMON.items() if k != "progress"}
    text = sweep_file({"name": part, "time": "01:00:00", "ranks_per_node": RANKS},
                      {**train, "progress": False}, [{"ranks": [RANKS], **grid} for grid in grids])
    return run_study(text, args.runs / part, mpiexec=args.mpiexec)


def grids(intervals: list[int], **sweep: list) -> list[dict]:
    """The grids of ``intervals`` (``algorithm``'s choice for each) with the lists ``sweep``."""
    return [{"algorithm": [algorithm(i)["algorithm"]], "interval": [i], **sweep} for i in intervals]


def figures(run: Run, early: int) -> dict:
    """``resnet_mnist.figures_of_run`` plus the clip fraction over the whole run and over its
    first ``early`` steps (from the trace: the study's table has neither)."""
    trace = read_trace(run.path / "trace.h5")
    return {**figures_of_run(run), "clip": clip_fraction(trace), "early": clip_fraction(trace, early)}


def early_steps(args: argparse.Namespace) -> int:
    """The steps of the probe's epochs, over which the sweep's clip fraction is given too."""
    return round(args.probe_epochs * COMMON["eval-every"])


def probe(args: argparse.Namespace) -> list[str]:
    lines = [f"| gamma | threshold gamma/eta | run | clip fraction | test accuracy after "
             f"{args.probe_epochs:g} epochs |", "|---:|---:|---|---:|---:|"]
    runs = study(grids([1, 8], gamma=args.probe_gammas, seed=[0], epochs=[args.probe_epochs]), "probe", args)
    for gamma in args.probe_gammas:
        for interval in (1, 8):
            r = figures(find_run(runs, RANKS, interval=interval, gamma=gamma), early_steps(args))
            lines.append(f"| {gamma:g} | {gamma / COMMON['lr']:.2f} | {label(interval)} | "
                         f"{r['clip']:.1%} | {r['accuracy']:.3f} |")
    return lines


def sweep_tables(results: dict[int, list[dict]], args: argparse.Namespace) -> list[str]:
    lines = ["| run | I | averaging rounds | MB averaged per rank | final test accuracy | "
             "mean of last 3 epochs | final train loss | clip fraction | "
             f"clip fraction, first {args.probe_epochs:g} epochs | wall s |",
             "|---|" + "---:|" * 9]
    for interval, runs in results.items():
        r = runs[0]
        lines.append(f"| {label(interval)} | {interval} | {r['rounds']} | {r['mbytes']:.2f} | "
                     f"{mean_sd([x['accuracy'] for x in runs])} | "
                     f"{mean_sd([statistics.mean(x['history'][-3:]) for x in runs])} | "
                     f"{mean_sd([x['loss'] for x in runs])} | "
                     f"{', '.join(format(x['clip'], '.1%') for x in runs)} | "
                     f"{', '.join(format(x['early'], '.1%') for x in runs)} | "
                     f"{', '.join(format(x['wall'], '.0f') for x in runs)} |")
    epochs = len(next(iter(results.values()))[0]["history"])
    shown = sorted({e for e in (1, 2, 3, 5, *range(10, epochs, 10)) if e < epochs} | {epochs})
    lines += ["", "Test accuracy by epoch (mean over seeds):", "",
              "| run | " + " | ".join(f"ep. {e}" for e in shown) + " |", "|---|" + "---:|" * len(shown)]
    for interval, runs in results.items():
        cells = [statistics.mean(r["history"][e - 1] for r in runs) for e in shown]
        lines.append(f"| {label(interval)} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    return lines


def section(probe_lines: list[str], results: dict[int, list[dict]], args: argparse.Namespace) -> str:
    seeds = " ".join(map(str, args.seeds))
    flags = (f"--probe-epochs {args.probe_epochs:g} --probe-gammas "
             f"{' '.join(f'{g:g}' for g in args.probe_gammas)} --gamma {args.gamma:g} "
             f"--epochs {args.epochs:g} --seeds {seeds} --intervals {' '.join(map(str, args.intervals))}")
    parameters = next(iter(results.values()))[0]["parameters"]
    seconds = sum(r["wall"] for runs in results.values() for r in runs)
    steps = MNIST_TRAIN // RANKS // BATCH
    return "\n".join([
        "## ResNet-8 on MNIST-5k (the paper's ResNet-56 / CIFAR-10 experiment, scaled down)",
        "",
        "<!-- docs-check",
        f"tiny: {flags} => --probe-epochs 1 --probe-gammas {args.gamma:g} --gamma "
        f"{args.gamma:g} --epochs 1 --seeds 0 --intervals 1 8",
        "-->",
        "```bash",
        f"python benchmarks/reproduce/celgc_resnet.py {flags}",
        "```",
        "",
        "(`--probe-only` runs the probe alone, to choose gamma.)",
        "",
        f"- {RANKS} ranks of `mpiexec -n {RANKS} python -m hpcopt train` per run, on 2 cores "
        "(oversubscribed, one BLAS thread each), runs one after another.",
        "- Data: MNIST-5k (4,000 training images dealt i.i.d. to the ranks, 1,000 test images), "
        "no augmentation.",
        f"- Model: ResNet-{COMMON['depth']}, width {COMMON['width']} ({parameters:,} parameters, "
        "batch norm; buffer_policy average: the BN statistics are averaged at every round, "
        "apart from the parameters), float32.",
        f"- Training: plain clipped SGD (no momentum, no weight decay), constant eta = "
        f"{COMMON['lr']:g} (the paper's), gamma = {args.gamma:g} (threshold gamma/eta = "
        f"{args.gamma / COMMON['lr']:.2f}; chosen with the probe below; the paper's gamma = 1.0 "
        f"does not clip once in the probe), batch {BATCH} per rank, {args.epochs:g} epochs = "
        f"{args.epochs * steps:g} steps per rank ({steps} per epoch) for every run; naive "
        "clipping averages the gradients every step (I = 1), CELGC the weights every I steps. "
        f"Seeds {seeds} (initial model and shards); {len(results) * len(args.seeds)} runs, "
        f"{seconds / 60:.0f} min of training in all.",
        "- Test accuracy of the averaged model (1,000 test images) after every epoch; \"final\" "
        "is after the last step (the accuracy of one epoch swings by a point or more at this "
        "constant step size, so the mean over the last 3 epochs is given too); mean ± standard "
        "deviation over the seeds. Final train loss: "
        "mean over ranks of the last trace window (up to 8 steps). \"MB averaged\" is what one rank "
        "sent on the `average` label (gradients for naive, weights for CELGC; the BN "
        "statistics travel apart). Clip fraction (over the whole run, and over the first "
        f"{args.probe_epochs:g} epochs, as long as a probe run) and wall time: one value per seed.",
        "",
        f"Probe (seed 0, {args.probe_epochs:g} epochs each; share of all ranks' steps in which "
        "min(eta, gamma/||g||) < eta):",
        "",
        *probe_lines,
        "",
        "Sweep:",
        "",
        *sweep_tables(results, args),
        "",
        "Figures (`hpcopt report`, first seed): test accuracy and training loss against local "
        "steps, averaging rounds and bytes:",
        "![steps](celgc-resnet/steps.png) ![rounds](celgc-resnet/rounds.png) "
        "![bytes](celgc-resnet/bytes.png)",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gamma", type=float, default=0.3)
    parser.add_argument("--epochs", type=float, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 2, 8, 32],
                        help="1 is the naive clipping baseline, the others CELGC")
    parser.add_argument("--probe-gammas", type=float, nargs="+", default=[0.3, 0.45, 1.0])
    parser.add_argument("--probe-epochs", type=float, default=3)
    parser.add_argument("--probe-only", action="store_true", help="run and print the probe only")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "celgc-resnet",
                        help="holds the studies probe/ and sweep/ of one set of options "
                        "(finished runs are kept)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "celgc.md")
    parser.add_argument("--figures", type=Path, default=ROOT / "docs" / "results" / "celgc-resnet")
    add_mpiexec_option(parser)
    args = parser.parse_args()
    args.runs, args.out, args.figures = args.runs.resolve(), args.out.resolve(), args.figures.resolve()

    probe_lines = probe(args)
    print("\n".join(probe_lines), flush=True)
    if args.probe_only:
        return
    sweep = grids(args.intervals, gamma=[args.gamma], seed=args.seeds, epochs=[args.epochs])
    runs = study(sweep, "sweep", args)
    chosen = {i: [find_run(runs, RANKS, interval=i, seed=seed) for seed in args.seeds]
              for i in args.intervals}
    results = {i: [figures(run, early_steps(args)) for run in mine] for i, mine in chosen.items()}
    write_report([mine[0].path for mine in chosen.values()], args.figures)
    (args.figures / "report.md").unlink()  # the tables below; it names local paths
    text = section(probe_lines, results, args)
    replace_section(args.out, "celgc-resnet", text)
    print(text)


if __name__ == "__main__":
    main()
