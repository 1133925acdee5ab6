"""PR-SGD reproduction at laptop scale: MLP on MNIST-5k, I in {1, 2, 4, 8, 16, 32}.

The paper (Yu, Yang, Zhu, AAAI 2019) trains ResNet20 on CIFAR-10 with I in {4, 8, 16, 32} and
finds accuracy per epoch matching I = 1 with I-times fewer averaging rounds. Here: the default
MLP (784-512-256-10), the same number of epochs for every I, several seeds, 4 ranks.

    mpiexec -n 4 python benchmarks/reproduce/prsgd_mnist.py [--epochs 40] [--seeds 0 1 2] [--out docs/results/prsgd.md]

Writes the section ``mlp-mnist`` of the page (the ResNet reproduction, ``resnet_mnist.py``, has
its own section there).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.sections import mean_sd, replace_section  # noqa: E402
from hpcopt import train
from hpcopt.comm import Comm
from hpcopt.config import build_config

INTERVALS = (1, 2, 4, 8, 16, 32)


def run(interval: int, seed: int, epochs: float) -> dict:
    comm = Comm()
    steps_per_epoch = (4000 // comm.size) // 32
    config = build_config(None, {"interval": str(interval), "seed": str(seed), "epochs": str(epochs),
                                 "eval_every": str(steps_per_epoch * 5), "progress": "false"})
    summary, _ = train(config, comm, verbose=False)
    comm.free()
    return {"accuracy": summary.final.accuracy, "loss": summary.train_loss, "rounds": summary.rounds,
            "mbytes": summary.average_bytes_per_rank / 1e6, "wall": summary.wall_seconds,
            "comm_share": summary.comm_seconds / summary.wall_seconds,
            "history": [(step // steps_per_epoch, ev.accuracy) for step, ev in summary.history]}


def table(results: dict[int, list[dict]], epochs: float, seeds: list[int], size: int) -> str:
    lines = [
        "## MLP on MNIST-5k",
        "",
        f"`mpiexec -n {size} python benchmarks/reproduce/prsgd_mnist.py --epochs {epochs:g} --seeds "
        f"{' '.join(map(str, seeds))}` on a 2-core machine ({size} ranks oversubscribed). Default "
        "job: MLP 784-512-256-10, float32, batch 32 per rank, constant lr 0.1, i.i.d. shards "
        "of the 4,000 training images; test set 1,000 images. Same number of epochs for every "
        f"I; mean ± standard deviation over {len(seeds)} seeds.",
        "",
        "| I | averaging rounds | MB averaged per rank | test accuracy | final train loss "
        "| wall s | comm share |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for interval, runs in results.items():
        lines.append(
            f"| {interval} | {runs[0]['rounds']} | {runs[0]['mbytes']:.1f} | "
            f"{mean_sd([r['accuracy'] for r in runs])} | {mean_sd([r['loss'] for r in runs])} | "
            f"{statistics.median(r['wall'] for r in runs):.1f} | "
            f"{statistics.median(r['comm_share'] for r in runs):.0%} |")
    checkpoints = [epoch for epoch, _ in results[INTERVALS[0]][0]["history"]]
    lines += ["", "Test accuracy of the averaged model by epoch (mean over seeds):", "",
              "| I | " + " | ".join(f"epoch {e}" for e in checkpoints) + " |",
              "|---:|" + "---:|" * len(checkpoints)]
    for interval, runs in results.items():
        cells = [statistics.mean(r["history"][k][1] for r in runs) for k in range(len(checkpoints))]
        lines.append(f"| {interval} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("docs/results/prsgd.md"))
    args = parser.parse_args()
    results = {i: [run(i, seed, args.epochs) for seed in args.seeds] for i in INTERVALS}
    comm = Comm()
    if comm.rank == 0:
        text = table(results, args.epochs, args.seeds, comm.size)
        print(text)
        replace_section(args.out, "mlp-mnist", text)


if __name__ == "__main__":
    main()
