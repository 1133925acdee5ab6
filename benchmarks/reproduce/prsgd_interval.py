"""PR-SGD fidelity: where accuracy falls as I grows, against I* = T^(1/4)/N^(3/4); and the
heterogeneous-worker variant (rank i runs its own I_i local steps per round).

Yu, Yang, Zhu (AAAI 2019) prove the O(1/sqrt(NT)) rate, with linear speed-up, for any interval
I <= T^(1/4)/N^(3/4) (T: iterations per worker) with lr = sqrt(N)/(L sqrt(T)). That is a
sufficient condition with unknown constants, so only its shape can be checked: is there an I
past which accuracy falls, and is it near I*? Here:

- the sweep: the default MLP on MNIST-5k (or ``--dataset digits``), the same number of epochs
  for every I, I = 1, 2, 4, ... up to T (I = T: one average, at the end), for N in ``--ranks``,
  several seeds; the fall is the smallest I from which the mean test accuracy stays more than
  ``--drop`` below the one of I = 1;
- the heterogeneous variant (``local_steps``, already an hpcopt option): 4 ranks standing for
  workers whose speeds are 7:5:3:1 steps per unit of time, the same number of rounds for
  I_i = 14, 10, 6, 2 (every worker busy for 2 units a round), I = 2 on every rank (all wait
  for the slowest: 2 units a round) and I = 8 on every rank (the same 32 steps a round as the
  heterogeneous one, but 8 units a round); test accuracy of the averaged model at every round.

The runs are one study (``[[sweep]]`` grids: one per N, one per heterogeneous configuration;
``benchmarks/reproduce/prsgd_interval.toml`` is the one of the command on docs/results/prsgd.md,
``--write-study FILE`` writes the one of other options). The script runs it with ``python -m
hpcopt sweep FILE --local -j JOBS --out RUNS`` (a rerun only trains what is missing, ``--fresh``
retrains), gathers it with ``python -m hpcopt collect RUNS``, or only reads a study run
elsewhere (``--study DIR``); the final figures come from the study's table, the evaluations
along the way from the traces. Writes the sections ``prsgd-interval`` and
``prsgd-heterogeneous`` of ``--page`` and the numbers to ``--json``; ``--from-json`` only
rewrites the sections.

    python benchmarks/reproduce/prsgd_interval.py [--epochs 20] [--seeds 0 1 2] [--ranks 2 4]
        [--rounds 80] [--dataset mnist5k] [--jobs 1] [--page docs/results/prsgd.md]
    python benchmarks/reproduce/prsgd_interval.py ... --study DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.launch import add_mpiexec_option  # noqa: E402
from benchmarks.common.sections import mean_sd, replace_section  # noqa: E402
from benchmarks.common.study import Run, add_study_options, find_run, study_runs, sweep_file  # noqa: E402
from benchmarks.reproduce.resnet_mnist import BATCH, MNIST_TRAIN, figures_of_run  # noqa: E402

#: Training images of the data sets the sweep can use (MNIST-5k: 5,000 less the 20% test split).
TRAIN_SAMPLES = {"mnist5k": MNIST_TRAIN, "digits": 1438}
#: The heterogeneous cluster: steps per unit of time of the 4 workers, and the runs compared.
SPEEDS = (7, 5, 3, 1)
HETEROGENEOUS = (  # (name, nominal I, local_steps)
    ("I_i = 14, 10, 6, 2", 8, (14, 10, 6, 2)),
    ("I = 2 on every rank", 2, ()),
    ("I = 8 on every rank", 8, ()),
)


def steps_per_epoch(dataset: str, ranks: int) -> int:
    """Local steps per epoch: the rank's shard over the batch (a partial batch is dropped)."""
    return TRAIN_SAMPLES[dataset] // ranks // BATCH


def threshold(total: int, ranks: int) -> float:
    """The theory's largest interval with linear speed-up, I* = T^(1/4) / N^(3/4)."""
    return total ** 0.25 / ranks ** 0.75


def intervals(total: int, largest: int) -> list[int]:
    """1, 2, 4, ... below min(total, largest), then that bound (I = T: one average at the end)."""
    top = min(total, largest)
    return [2 ** k for k in range(top.bit_length()) if 2 ** k < top] + [top]


def round_time(local_steps: Iterable[int]) -> float:
    """A round's time on the cluster of ``SPEEDS``: the slowest worker's I_i / speed_i."""
    return max(steps / speed for steps, speed in zip(local_steps, SPEEDS))


def sweep_grids(args: argparse.Namespace) -> list[dict]:
    """The sweep's grids, one per N: every I up to T and every seed, ``--epochs`` each."""
    grids = []
    for ranks in args.ranks:
        per_epoch = steps_per_epoch(args.dataset, ranks)
        grids.append({"ranks": [ranks], "interval": intervals(round(args.epochs * per_epoch), args.largest),
                      "seed": args.seeds, "epochs": [args.epochs], "eval_every": [per_epoch]})
    return grids


def heterogeneous_grids(args: argparse.Namespace) -> list[dict]:
    """The heterogeneous comparison's grids, one per configuration: 4 ranks, ``--rounds`` rounds."""
    grids = []
    for _, interval, local in HETEROGENEOUS if args.rounds else ():
        grid = {"ranks": [len(SPEEDS)], "interval": [interval], "seed": args.seeds,
                "steps": [args.rounds * interval], "eval_every": [1 if local else interval]}
        grids.append({**grid, "local_steps": [list(local)]} if local else grid)
    return grids


def study_text(args: argparse.Namespace) -> str:
    """The sweep file of every run this page needs (benchmarks/reproduce/prsgd_interval.toml is
    the one of the command on docs/results/prsgd.md)."""
    job = {"name": args.dataset, "time": "01:00:00", "ranks_per_node": max([*args.ranks, len(SPEEDS)])}
    train = {"dataset": args.dataset, "lr": args.lr, "progress": False}
    return sweep_file(job, train, sweep_grids(args) + heterogeneous_grids(args),
                      f"The runs of docs/results/prsgd.md's interval sections:\n{command_of(args)}")


def sweep(args: argparse.Namespace, runs: list[Run]) -> list[dict]:
    """Every (N, I, seed) of the sweep: the run's figures."""
    records = []
    for grid in sweep_grids(args):
        [ranks], [epochs], [per_epoch] = grid["ranks"], grid["epochs"], grid["eval_every"]
        for interval in grid["interval"]:
            for seed in args.seeds:
                run = find_run(runs, ranks, interval=interval, seed=seed, epochs=epochs, local_steps=None)
                records.append({"ranks": ranks, "interval": interval, "seed": seed,
                                "total": round(epochs * per_epoch), **figures_of_run(run)})
    return records


def heterogeneous(args: argparse.Namespace, runs: list[Run]) -> list[dict]:
    """Every (configuration, seed) of the heterogeneous comparison, 4 ranks, ``--rounds`` rounds."""
    records = []
    for name, interval, local in HETEROGENEOUS:
        for seed in args.seeds:
            run = find_run(runs, len(SPEEDS), interval=interval, seed=seed, steps=args.rounds * interval,
                           local_steps=list(local) if local else None)
            steps = local or (interval,) * len(SPEEDS)
            records.append({"name": name, "local_steps": list(steps), "seed": seed,
                            "round_time": round_time(steps), **figures_of_run(run)})
    return records


def fall_start(values: dict[int, float], worse: Callable[[float, float], bool]) -> int | None:
    """The smallest I from which every larger I's value is ``worse(value, value at I = 1)``."""
    start = None
    for interval in sorted(values, reverse=True):
        if not worse(values[interval], values[1]):
            break
        start = interval
    return start


def grouped(records: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    """Records by the values of ``keys``, in order of first appearance."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups


def figures(runs: list[dict]) -> dict[str, list[float]]:
    """Per seed: final test accuracy and loss, the mean test accuracy over the epochs, the local
    models' train loss of the last window."""
    return {"accuracy": [r["accuracy"] for r in runs],
            "curve": [statistics.mean(r["history"]) for r in runs],
            "test_loss": [r["test_loss"] for r in runs], "loss": [r["loss"] for r in runs]}


def falls(by_i: dict[tuple, list[dict]], cfg: dict) -> dict[str, int | None]:
    """Where each measure starts to fall (None: it does not, up to the largest I)."""
    per_i = {i: figures(runs) for (i,), runs in by_i.items()}
    mean = {key: {i: statistics.mean(f[key]) for i, f in per_i.items()}
            for key in ("accuracy", "curve", "test_loss")}
    drop, rise = cfg["drop"], cfg["loss_rise"]
    return {"accuracy": fall_start(mean["accuracy"], lambda v, b: v < b - drop),
            "curve": fall_start(mean["curve"], lambda v, b: v < b - drop),
            "test_loss": fall_start(mean["test_loss"], lambda v, b: v > b * (1 + rise))}


def sweep_section(data: dict) -> str:
    cfg, records = data["config"], data["sweep"]
    lines = [
        "## The interval condition I <= T^(1/4) / N^(3/4)",
        "",
        f"`{cfg['command']}`: MLP 784-512-256-10 on {cfg['dataset']}, float32, batch {BATCH} per "
        f"rank, constant lr {cfg['lr']:g} (not the theory's sqrt(N)/(L sqrt(T))), i.i.d. shards, "
        f"{cfg['epochs']:g} epochs for every I (T local steps per rank), the averaged model "
        f"tested on 1,000 test images after every epoch; mean ± sd over {len(cfg['seeds'])} "
        "seeds. I = T is one average, at the end (before it, each epoch's test is of the "
        "average the ranks would have). \"Over the epochs\": the mean of the per-epoch test "
        "accuracies (the theory bounds an average over the run, not the last iterate). "
        "\"Local train loss\": the local models' mean minibatch loss over the last trace "
        "window, before the last average. A measure falls from the smallest I from which it "
        f"stays worse than at I = 1: accuracy by more than {cfg['drop']:g}, test loss by more "
        f"than {cfg['loss_rise']:.0%}.",
        "",
    ]
    summary = ["| N | T | I* = T^(1/4)/N^(3/4) | final accuracy falls from I = | accuracy over "
               "the epochs falls from I = | test loss rises from I = |",
               "|---:|---:|---:|---:|---:|---:|"]
    for (ranks,), mine in grouped(records, "ranks").items():
        total = mine[0]["total"]
        by_i = grouped(mine, "interval")
        lines += [f"### N = {ranks}: T = {total}, I* = {threshold(total, ranks):.2f}", "",
                  "| I | averaging rounds | final test accuracy | test accuracy over the epochs "
                  "| final test loss | local train loss |", "|---:|---:|---:|---:|---:|---:|"]
        for (interval,), runs in by_i.items():
            f = figures(runs)
            lines.append(f"| {interval} | {runs[0]['rounds']} | {mean_sd(f['accuracy'])} | "
                         f"{mean_sd(f['curve'])} | {mean_sd(f['test_loss'])} | "
                         f"{mean_sd(f['loss'])} |")
        lines.append("")
        fall = falls(by_i, cfg)
        summary.append(f"| {ranks} | {total} | {threshold(total, ranks):.2f} | " + " | ".join(
            str(fall[k]) if fall[k] is not None else f"none up to {max(i for i, in by_i)}"
            for k in ("accuracy", "curve", "test_loss")) + " |")
    return "\n".join(lines + ["Summary:", "", *summary]) + "\n"


def heterogeneous_section(data: dict) -> str:
    cfg, records = data["config"], data["heterogeneous"]
    groups = grouped(records, "name")
    history = next(iter(groups.values()))[0]["at_round"]
    shown = [r for r in history if r in (1, 2, 5, 10, 20, 40) or r == history[-1]]
    lines = [
        "## The heterogeneous-worker variant (per-rank local steps)",
        "",
        f"`{cfg['command']}`: 4 ranks standing for workers of speeds "
        f"{':'.join(map(str, SPEEDS))} (local steps per unit of time); hpcopt's `local_steps` "
        f"option gives rank i its own I_i. Same model, data and lr as above, {cfg['rounds']} "
        "rounds for every configuration; test accuracy of the averaged model after each round "
        f"(mean over {len(cfg['seeds'])} seeds; ± sd at the last round). \"Time per round\": the "
        "slowest worker's I_i / speed_i on that cluster (modelled: the ranks here run at the "
        "same speed, so this is not measured).",
        "",
        "| configuration | steps per round (all ranks) | time per round | "
        + " | ".join(f"round {r}" for r in shown) + " | final |",
        "|---|---:|---:|" + "---:|" * (len(shown) + 1),
    ]
    for (name,), runs in groups.items():
        at = runs[0]["at_round"]
        cells = [statistics.mean(r["history"][at.index(k)] for r in runs) for k in shown]
        lines.append(f"| {name} | {sum(runs[0]['local_steps'])} | {runs[0]['round_time']:g} | "
                     + " | ".join(f"{c:.4f}" for c in cells)
                     + f" | {mean_sd([r['accuracy'] for r in runs])} |")
    marks = time_marks(min(cfg["rounds"] * runs[0]["round_time"] for runs in groups.values()))
    lines += ["", "At equal modelled time (units of the slowest worker's step; accuracy after the "
              "last round completed by then):", "",
              "| configuration | " + " | ".join(f"t = {t:g}" for t in marks) + " |",
              "|---|" + "---:|" * len(marks)]
    for (name,), runs in groups.items():
        at = runs[0]["at_round"]
        done = [int(t // runs[0]["round_time"]) for t in marks]
        lines.append(f"| {name} | " + " | ".join(
            f"{statistics.mean(r['history'][at.index(k)] for r in runs):.4f} ({k} round{'s' * (k != 1)})"
            if k in at else "–" for k in done) + " |")
    return "\n".join(lines) + "\n"


def time_marks(horizon: float) -> list[float]:
    """Modelled times at which the configurations are compared, up to ``horizon`` (when the
    quickest configuration has done all its rounds)."""
    return [t for t in (4, 8, 16, 40, 80, 160, 320, 640) if t <= horizon]


def write(data: dict, args: argparse.Namespace) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=1))
    sections = {"prsgd-interval": sweep_section(data) if data["sweep"] else "",
                "prsgd-heterogeneous": heterogeneous_section(data) if data["heterogeneous"] else ""}
    for name, text in sections.items():
        if text:
            replace_section(args.page, name, text)
            print(text)


def command_of(args: argparse.Namespace) -> str:
    return (f"python benchmarks/reproduce/prsgd_interval.py --dataset {args.dataset} --epochs "
            f"{args.epochs:g} --seeds {' '.join(map(str, args.seeds))} --ranks "
            f"{' '.join(map(str, args.ranks))} --rounds {args.rounds}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=list(TRAIN_SAMPLES), default="mnist5k")
    parser.add_argument("--epochs", type=float, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--largest", type=int, default=1 << 30, help="the largest I swept")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--drop", type=float, default=0.01,
                        help="accuracy below I = 1's by more than this counts as a fall")
    parser.add_argument("--loss-rise", type=float, default=0.05,
                        help="test loss above I = 1's by more than this share counts as a fall")
    parser.add_argument("--rounds", type=int, default=80,
                        help="rounds of the heterogeneous comparison (0: skip it)")
    parser.add_argument("--runs", type=Path, default=Path("runs/prsgd-interval"),
                        help="the study directory: its runs are kept, a rerun only trains what is "
                        "missing (it holds the study of one set of options)")
    parser.add_argument("--fresh", action="store_true", help="retrain runs already in --runs")
    add_study_options(parser)
    parser.add_argument("--page", type=Path, default=Path("docs/results/prsgd.md"))
    parser.add_argument("--json", type=Path, default=Path("docs/results/prsgd/interval.json"))
    parser.add_argument("--from-json", type=Path, help="only rewrite the sections from this JSON")
    add_mpiexec_option(parser)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.from_json:
        write(json.loads(args.from_json.read_text()), args)
        return
    text = study_text(args)
    runs = study_runs(text, args, afresh=args.fresh)
    if runs is None:
        return
    config = {"command": command_of(args), "dataset": args.dataset, "epochs": args.epochs,
              "lr": args.lr, "seeds": args.seeds, "drop": args.drop, "loss_rise": args.loss_rise,
              "rounds": args.rounds}
    data = {"config": config, "sweep": sweep(args, runs),
            "heterogeneous": heterogeneous(args, runs) if args.rounds else []}
    write(data, args)


if __name__ == "__main__":
    main()
