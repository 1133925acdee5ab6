"""PR-SGD reproduction with a small ResNet: I in {1, 4, 8, 16, 32} and the batch-norm policies.

The paper (Yu, Yang, Zhu, AAAI 2019) trains ResNet-20 on CIFAR-10 with I in {4, 8, 16, 32} and
finds the accuracy per epoch of I = 1 with I-times fewer averaging rounds. Here, at laptop scale:
the CIFAR ResNet of depth 8 (option-A shortcuts) on MNIST-5k, 4 ranks, momentum 0.9, the same
number of epochs for every I, several seeds. The runs are one
study (a ``[[sweep]]`` grid per group below; ``benchmarks/reproduce/resnet_mnist.toml`` is the one
of the command on docs/results/prsgd.md, ``--write-study FILE`` writes the one of other options),
run by ``python -m hpcopt sweep FILE --local -j JOBS --out RUNS`` and gathered by ``python -m
hpcopt collect`` (or run elsewhere and only read: ``--study DIR``); the tables are read from the
study's table and, for the evaluations along the way, the traces, and the figures drawn by
``hpcopt report``:

- the sweep over I with ``buffer_policy = "average"`` on i.i.d. shards;
- the three batch-norm policies (``local``, ``average``, ``rank0``) at the intervals given by
  ``--policy-intervals``, on i.i.d. shards and on label-sorted shards (``partition =
  "similarity"``, similarity 0: each rank sees two or three classes);
- CIFAR-10 (the same sweep over I) when ``--cifar DIR`` holds the binary batches; otherwise it
  says so and skips it.

    python benchmarks/reproduce/resnet_mnist.py [--epochs 12] [--seeds 0 1] [--width 8] [--cifar DIR]
        [--jobs 1]

Writes the section ``resnet-mnist`` of ``docs/results/prsgd.md`` and the figures under
``docs/results/resnet-mnist/``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.launch import add_mpiexec_option  # noqa: E402
from benchmarks.common.sections import mean_sd, replace_section  # noqa: E402
from benchmarks.common.study import Run, add_study_options, find_run, study_runs, sweep_file  # noqa: E402
from hpcopt.report import write_report
from hpcopt.io.trace import read_trace

CIFAR_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
RANKS = 4
BATCH = 32
MNIST_TRAIN = 4000
CIFAR_TRAIN = 50000


@dataclass(frozen=True)
class Case:
    """One configuration (run once per seed)."""

    group: str  # "sweep", "policy", "skewed", "cifar"
    interval: int
    policy: str = "average"
    skewed: bool = False
    cifar: bool = False

    def name(self, seed: int) -> str:
        data = "cifar" if self.cifar else "skewed" if self.skewed else "iid"
        return f"{data}-I{self.interval}-{self.policy}-seed{seed}"


def cases(args: argparse.Namespace, cifar: bool) -> list[Case]:
    sweep = [Case("sweep", i) for i in args.intervals]
    policies = [Case("policy", i, p) for i in args.policy_intervals for p in ("local", "rank0")]
    skewed = [Case("skewed", i, p, skewed=True) for i in args.policy_intervals[-1:]
              for p in ("local", "average", "rank0")]
    on_cifar = [Case("cifar", i, cifar=True) for i in args.intervals] if cifar else []
    return sweep + policies + skewed + on_cifar


def study_text(args: argparse.Namespace, cifar: bool) -> str:
    """The sweep file of every run: one ``[[sweep]]`` grid per group of cases, each over the seeds
    (benchmarks/reproduce/resnet_mnist.toml is the one of the command on docs/results/prsgd.md)."""
    seeds, last = args.seeds, args.policy_intervals[-1:]
    train = {"model": "resnet", "depth": args.depth, "width": args.width, "batch_size": BATCH,
             "lr": args.lr, "momentum": args.momentum, "epochs": args.epochs,
             "eval_every": MNIST_TRAIN // RANKS // BATCH, "progress": False}
    grids: list[dict] = [
        {"ranks": [RANKS], "interval": args.intervals, "buffer_policy": ["average"], "seed": seeds},
        {"ranks": [RANKS], "interval": args.policy_intervals, "buffer_policy": ["local", "rank0"],
         "seed": seeds},
        {"ranks": [RANKS], "interval": last, "buffer_policy": ["local", "average", "rank0"],
         "partition": ["similarity"], "similarity": [0], "seed": seeds}]
    if cifar:
        grids.append({"ranks": [RANKS], "interval": args.intervals, "buffer_policy": ["average"],
                      "seed": seeds, "dataset": ["cifar10"], "path": [str(args.cifar.resolve())],
                      "augment": [True], "epochs": [args.cifar_epochs],
                      "eval_every": [CIFAR_TRAIN // RANKS // BATCH]})
    command = (f"python benchmarks/reproduce/resnet_mnist.py --epochs {args.epochs:g} --seeds "
               f"{' '.join(map(str, seeds))} --depth {args.depth} --width {args.width}")
    return sweep_file({"name": "resnet", "time": "01:00:00", "ranks_per_node": RANKS}, train, grids,
                      f"The runs of docs/results/prsgd.md's ResNet section:\n{command}")


def run_of(case: Case, seed: int, runs: list[Run]) -> Run:
    """The study's run of one case and seed."""
    return find_run(runs, RANKS, interval=case.interval, buffer_policy=case.policy, seed=seed,
                    partition="similarity" if case.skewed else None,
                    dataset="cifar10" if case.cifar else None)


def figures_of(path: Path) -> dict:
    """The figures one table row needs, read from a finished trace."""
    trace = read_trace(path / "trace.h5")
    evaluated = ~np.isnan(trace.columns["eval_accuracy"])
    last = {label: int(fields["bytes"][-1]) for label, fields in trace.comm.items()}
    return {"accuracy": float(trace.summary["eval_accuracy"]),
            "test_loss": float(trace.summary["eval_loss"]),
            "loss": float(trace.columns["loss_mean"][-1]),
            "rounds": int(trace.summary["rounds"]),
            "mbytes": last.get("average", 0) / 1e6, "kbytes_bn": last.get("buffers", 0) / 1e3,
            "wall": float(trace.summary["wall"]),
            "history": [float(a) for a in trace.columns["eval_accuracy"][evaluated]],
            "at_round": [int(r) for r in trace.columns["rounds"][evaluated]],
            "parameters": int(trace.attrs["parameters"])}


def figures_of_run(run: Run) -> dict:
    """``figures_of`` for a run of a study: the final figures from the study's table, the
    evaluations along the way and the parameter count from the trace (the table has neither)."""
    trace = read_trace(run.path / "trace.h5")
    evaluated = ~np.isnan(trace.columns["eval_accuracy"])
    return {"accuracy": run.number("eval_accuracy"), "test_loss": run.number("eval_loss"),
            "loss": run.number("train_loss"), "rounds": int(run.number("rounds")),
            "mbytes": run.number("bytes_average", 0) / 1e6,
            "kbytes_bn": run.number("bytes_buffers", 0) / 1e3,
            "wall": run.number("wall_seconds"),
            "history": [float(a) for a in trace.columns["eval_accuracy"][evaluated]],
            "at_round": [int(r) for r in trace.columns["rounds"][evaluated]],
            "parameters": int(trace.attrs["parameters"])}


def table(rows: list[tuple[str, list[dict]]], first: str) -> list[str]:
    lines = [f"| {first} | averaging rounds | MB averaged per rank | kB of BN statistics moved "
             "| test accuracy | mean of last 3 epochs | final train loss | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, runs in rows:
        r = runs[0]
        lines.append(f"| {label} | {r['rounds']} | {r['mbytes']:.2f} | {r['kbytes_bn']:.1f} | "
                     f"{mean_sd([x['accuracy'] for x in runs])} | "
                     f"{mean_sd([statistics.mean(x['history'][-3:]) for x in runs])} | "
                     f"{mean_sd([x['loss'] for x in runs])} | "
                     f"{statistics.median(x['wall'] for x in runs):.0f} |")
    return lines


def by_epoch(rows: list[tuple[str, list[dict]]], first: str) -> list[str]:
    epochs = len(rows[0][1][0]["history"])
    shown = sorted({*range(1, epochs + 1, max(1, epochs // 7)), epochs})
    lines = [f"| {first} | " + " | ".join(f"ep. {e}" for e in shown) + " |",
             "|---|" + "---:|" * len(shown)]
    for label, runs in rows:
        cells = [statistics.mean(r["history"][e - 1] for r in runs) for e in shown]
        lines.append(f"| {label} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    return lines


def section(results: dict[Case, list[dict]], args: argparse.Namespace, cifar_note: str) -> str:
    sweep = [(str(c.interval), runs) for c, runs in results.items() if c.group == "sweep"]
    iid = sorted(((c.interval, c.policy, runs) for c, runs in results.items()
                  if c.group in ("sweep", "policy") and c.interval in args.policy_intervals),
                 key=lambda t: (t[0], t[1]))
    policies = [(f"I={i}, {p}", runs) for i, p, runs in iid]
    skewed = [(f"I={c.interval}, {c.policy}", runs) for c, runs in results.items()
              if c.group == "skewed"]
    cifar = [(str(c.interval), runs) for c, runs in results.items() if c.group == "cifar"]
    parameters = next(iter(results.values()))[0]["parameters"]
    seeds = " ".join(map(str, args.seeds))
    seconds = sum(r["wall"] for runs in results.values() for r in runs)
    lines = [
        "## ResNet-8 on MNIST-5k",
        "",
        f"`python benchmarks/reproduce/resnet_mnist.py --epochs {args.epochs:g} --seeds {seeds} "
        f"--depth {args.depth} --width {args.width}` (one study, "
        "[`benchmarks/reproduce/resnet_mnist.toml`](../../benchmarks/reproduce/resnet_mnist.toml), "
        f"run by `hpcopt sweep --local`: {RANKS} ranks of `mpiexec -n {RANKS} python -m hpcopt train` "
        f"per run, on a 2-core machine shared with other jobs; {len(results) * len(args.seeds)} runs, "
        f"{seconds / 60:.0f} min of training in all). Model: "
        f"ResNet-{args.depth}, width {args.width} ({parameters:,} parameters; the BN "
        f"statistics, {args.depth - 1} layers, travel apart), float32, batch {BATCH} per "
        f"rank, constant lr {args.lr:g}, momentum {args.momentum:g} (momentum_policy keep), "
        f"{args.epochs:g} epochs for every I, test accuracy of the averaged model (1,000 test "
        f"images) after every epoch; mean ± standard deviation over {len(args.seeds)} seeds "
        "(the test accuracy of one epoch swings by a few points at this constant learning "
        "rate, so the mean over the last 3 epochs is given too). "
        "\"MB averaged\" counts the parameter averages of the rounds (label `average`; a run "
        "ending mid-round takes one more, label `final`, not counted here); \"kB of BN "
        "statistics\" the buffer policy's traffic (label `buffers`). Figures: `hpcopt report` "
        "of the first seed's runs, in `resnet-mnist/` (steps, rounds, bytes, wall time).",
        "",
        "### Sweep over I (i.i.d. shards, buffer_policy average)",
        "",
        *table(sweep, "I"),
        "",
        "Test accuracy by epoch (mean over seeds):",
        "",
        *by_epoch(sweep, "I"),
        "",
        "![test accuracy against averaging rounds](resnet-mnist/intervals/rounds.png)",
        "",
        "### Batch-norm policies (i.i.d. shards)",
        "",
        *table(policies, "I, policy"),
        "",
        *by_epoch(policies, "I, policy"),
        "",
        "### Batch-norm policies on label-sorted shards (similarity 0)",
        "",
        *table(skewed, "I, policy"),
        "",
        *by_epoch(skewed, "I, policy"),
        "",
        "![test accuracy by step, three policies, label-sorted shards]"
        "(resnet-mnist/skewed/steps.png)",
        "",
        "### CIFAR-10",
        "",
        cifar_note,
    ]
    if cifar:
        lines += ["", *table(cifar, "I"), "", *by_epoch(cifar, "I")]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--policy-intervals", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--cifar", type=Path, default=Path("data/cifar-10-batches-bin"),
                        help="directory of the CIFAR-10 binary batches (skipped when absent)")
    parser.add_argument("--cifar-epochs", type=float, default=2)
    add_study_options(parser, runs=Path("runs/resnet-mnist"))
    parser.add_argument("--out", type=Path, default=Path("docs/results/prsgd.md"))
    parser.add_argument("--figures", type=Path, default=Path("docs/results/resnet-mnist"))
    add_mpiexec_option(parser)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    missing = [f for f in CIFAR_FILES if not (args.cifar / f).is_file()]
    has_cifar = not missing
    cifar_note = (f"ResNet-{args.depth} on CIFAR-10 (`--cifar {args.cifar}`, augmentation on), "
                  f"{args.cifar_epochs:g} epochs, one run per I and seed." if has_cifar else
                  f"Skipped: the CIFAR-10 binary batches were not found (`{args.cifar}` lacks "
                  f"{', '.join(missing[:2])}{', ...' if len(missing) > 2 else ''}). Pass "
                  "`--cifar DIR` to run the same sweep on them.")
    print(cifar_note, flush=True)
    todo = cases(args, has_cifar)
    text = study_text(args, has_cifar)
    runs = study_runs(text, args, afresh=not args.reuse)
    if runs is None:
        return
    chosen = {case: [run_of(case, seed, runs) for seed in args.seeds] for case in todo}
    directories = {case: [run.path for run in mine] for case, mine in chosen.items()}
    results = {case: [figures_of_run(run) for run in mine] for case, mine in chosen.items()}

    first = [dirs[0] for dirs in directories.values()]
    groups = {"intervals": [d for c, d in zip(directories, first) if c.group == "sweep"],
              "policies": [d for c, d in zip(directories, first)
                           if c.group in ("sweep", "policy")
                           and c.interval in args.policy_intervals],
              "skewed": [d for c, d in zip(directories, first) if c.group == "skewed"]}
    for name, paths in groups.items():
        write_report(paths, args.figures / name)
    text = section(results, args, cifar_note)
    replace_section(args.out, "resnet-mnist", text)
    print(text)


if __name__ == "__main__":
    main()
