"""Reproduce the shape of the CELGC paper's LSTM results at laptop scale, with ``hpcopt train``.

Liu, Zhuang, Lei, Liao, "A Communication-Efficient Distributed Gradient Clipping Algorithm for
Training Deep Neural Networks", NeurIPS 2022: CELGC (local clipped SGD, averaging every I
steps) against naive parallel clipping (gradients averaged every step), eta = 30,
gamma = 7.5, on a character-level LSTM language model of Shakespeare (the corpus hpcopt ships
offline). One command runs every row as ``mpiexec -n RANKS python -m hpcopt train`` with a
trace into ``OUT/<row>``, then prints a table (test perplexity per epoch, averaging rounds and
bytes, clip fraction, wall time) and writes the ``hpcopt report`` plots of the I sweep and of
the other rows (PNGs in ``PLOTS/<group>``):

    python benchmarks/reproduce/celgc_reproduce.py [--out runs/celgc] [--plots docs/results/celgc]

Rows: naive; CELGC I in {2, 4, 8, 16, 32}; at I = 8: heterogeneous shards (Dirichlet alpha =
0.1 and similarity s = 0.1 over chunks labelled by play), half the workers per round, momentum
0.9 (eta = 3, gamma = 0.75: the same effective step and threshold) for CELGC and naive, and no
clipping (gamma = inf); naive and CELGC I = 8 again with seed 1, for the run-to-run spread. A
row whose trace already has its summary is not run again.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common.launch import train_run  # noqa: E402
from hpcopt.data.bptt import corpus_shard, streams_of  # noqa: E402
from hpcopt.data.text import load_corpus  # noqa: E402
from hpcopt.report import write_report  # noqa: E402
from hpcopt.io.trace import Trace, read_trace  # noqa: E402

#: Shared by every row: the paper's step size and threshold, a small one-layer LSTM.
COMMON = {"dataset": "shakespeare", "model": "lstm", "hidden": "128", "embed": "32",
          "batch-size": "16", "bptt": "50", "lr": "30", "gamma": "7.5", "seed": "0"}

#: (row name, options on top of COMMON)
ROWS: list[tuple[str, dict[str, str]]] = [
    ("naive", {"algorithm": "naive_clip", "interval": "1"}),  # it averages every step
    *((f"celgc-I{i}", {"algorithm": "celgc", "interval": str(i)}) for i in (2, 4, 8, 16, 32)),
    ("celgc-I8-dirichlet0.1", {"algorithm": "celgc", "interval": "8", "partition": "dirichlet",
                               "alpha": "0.1"}),
    ("celgc-I8-similarity0.1", {"algorithm": "celgc", "interval": "8", "partition": "similarity",
                                "similarity": "0.1"}),
    ("celgc-I8-half-participate", {"algorithm": "celgc", "interval": "8", "participation": "0.5"}),
    ("naive-momentum", {"algorithm": "naive_clip", "interval": "1", "momentum": "0.9", "lr": "3",
                        "gamma": "0.75"}),
    ("celgc-I8-momentum", {"algorithm": "celgc", "interval": "8", "momentum": "0.9", "lr": "3",
                           "gamma": "0.75"}),
    ("noclip-I8", {"algorithm": "celgc", "interval": "8", "gamma": "inf"}),
    # another seed (initial model and i.i.d. shards): the run-to-run spread the rows above carry
    ("naive-seed1", {"algorithm": "naive_clip", "interval": "1", "seed": "1"}),
    ("celgc-I8-seed1", {"algorithm": "celgc", "interval": "8", "seed": "1"}),
]
SWEEP = ["naive", *(f"celgc-I{i}" for i in (2, 4, 8, 16, 32))]
#: Plot groups besides the sweep (few runs each, so that the legends stay readable)
VARIANTS = {"heterogeneous": ["naive", "celgc-I8", "celgc-I8-dirichlet0.1", "celgc-I8-similarity0.1"],
            "participation": ["naive", "celgc-I8", "celgc-I8-half-participate"],
            "momentum": ["naive-momentum", "celgc-I8-momentum"]}


def windows_per_epoch(fraction: float, ranks: int) -> int:
    """Steps per epoch as ``hpcopt train`` counts them (on the shortest i.i.d. shard)."""
    corpus = load_corpus("shakespeare", train_fraction=fraction)
    batch, bptt = int(COMMON["batch-size"]), int(COMMON["bptt"])
    length = min(streams_of(corpus_shard(corpus.train, np.asarray(corpus.documents), "iid", r,
                                         ranks, 0), batch).shape[0] for r in range(ranks))
    return -(-(length - 1) // bptt)


def run_row(name: str, options: dict[str, str], args: argparse.Namespace, every: int) -> None:
    # --steps, not --epochs: a heterogeneous row's epoch would count the windows of its shortest
    # shard; every row takes the same number of steps, ``epochs`` passes over an i.i.d. shard
    flags = {**COMMON, **options, "corpus-fraction": str(args.fraction),
             "steps": str(args.epochs * every), "eval-every": str(every), "progress": "false"}
    train_run(args.ranks, args.out / name, flags)


def clip_fraction(trace: Trace, until: int | None = None) -> float:
    """Share of the steps (all ranks) in which clipping fired, over the whole run or over the
    trace rows up to step ``until``."""
    steps = trace.columns["step"]
    widths = np.diff(np.concatenate([[0], steps]))
    kept = steps <= (steps[-1] if until is None else until)
    return float(np.sum(trace.columns["clip_fraction"][kept] * widths[kept]) / np.sum(widths[kept]))


def row_figures(name: str, args: argparse.Namespace, every: int) -> str:
    trace = read_trace(args.out / name / "trace.h5")
    cols, steps = trace.columns, trace.columns["step"]
    per_epoch = [cols["eval_perplexity"][np.flatnonzero(steps == e * every)[-1]]
                 if np.any(steps == e * every) else math.nan for e in range(1, args.epochs)]
    per_epoch.append(trace.summary["eval_perplexity"])
    clipped = clip_fraction(trace)
    average = {k: int(v[-1]) for k, v in trace.comm["average"].items() if k != "seconds"}
    ppl = " ".join(f"{p:7.2f}" for p in per_epoch)
    return (f"| {name:<26} | {ppl} | {trace.summary['rounds']:6d} | {average['bytes'] / 1e6:8.1f} "
            f"| {clipped:6.1%} | {trace.summary['wall']:6.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "celgc")
    parser.add_argument("--plots", type=Path, default=ROOT / "docs" / "results" / "celgc")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.3,
                        help="share of every play's training text used (corpus_fraction)")
    parser.add_argument("--rows", nargs="*", help="run only these rows (default: all)")
    args = parser.parse_args()
    args.out, args.plots = args.out.resolve(), args.plots.resolve()  # the children run in ROOT
    every = windows_per_epoch(args.fraction, args.ranks)
    rows = [(n, o) for n, o in ROWS if not args.rows or n in args.rows]
    print(f"{args.ranks} ranks, {args.epochs} epochs of {every} steps, corpus fraction "
          f"{args.fraction}, LSTM {COMMON['embed']}-{COMMON['hidden']}, "
          f"{COMMON['batch-size']} streams x {COMMON['bptt']} tokens per rank and step", flush=True)
    for name, options in rows:
        run_row(name, options, args, every)
    epochs = " ".join(f"ep {e:<4d}" for e in range(1, args.epochs + 1))
    print(f"\n| {'row':<26} | {epochs} | rounds | avg MB   | clip   | wall s |")
    print(f"|{'-' * 28}|{'-' * (8 * args.epochs)}|--------|----------|--------|--------|")
    for name, _ in rows:
        print(row_figures(name, args, every))
    names = [n for n, _ in rows]
    groups = {group: [n for n in members if n in names]
              for group, members in {"sweep": SWEEP, **VARIANTS}.items()}
    for group, members in groups.items():
        if len(members) > 1:
            write_report([args.out / n for n in members], args.plots / group)
            (args.plots / group / "report.md").unlink()  # the table above; it names local paths
    print(f"\nplots: {', '.join(f'{args.plots}/{group}' for group in groups)}")


if __name__ == "__main__":
    main()
