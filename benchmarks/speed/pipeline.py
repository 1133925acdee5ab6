"""Pipeline efficiency: K gradients through 2 stages on 2 ranks vs the same K on one process.

The network is an MLP cut into two stages balanced by parameter count. Per K, the script times
one pipelined iteration (K samples through the schedule, gradients summed and averaged on each
stage; wall = the slower rank) and, on every rank at the same time (so both cores are as busy as
during the pipelined run), the single-process computation of the same K gradients with the same
layers (forward, backward, accumulate). Rounds alternate between the two, the table gives
medians. The ideal speed-up is 2K/(K + 1); the ideal bubble (idle share of a stage) is
(Delta - 1)/(K + Delta - 1); the measured bubble is each stage's time waiting on its neighbour,
and the busy time per sample shows how evenly the split shares the work.

    mpiexec -n 2 python benchmarks/speed/pipeline.py [--samples 1 2 4 8 16 32] [--repeats 7]
        [--kind 1f1b] [--inputs 1024] [--hidden 1024 1024 1024 1024] [--batch 32] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

from hpcopt.comm import Comm, node_layout
from hpcopt.nn import mlp, softmax_cross_entropy
from hpcopt.pipeline import KINDS, Pipeline, StagePlan, ideal_bubble
from hpcopt.rng import stream
from hpcopt.run.threads import configure_threads


def serial_gradients(model, params, xs, ys, samples: int) -> float:
    """K forward/backward passes of the whole model on one process; returns the seconds taken."""
    grad, total = np.zeros_like(params), np.zeros_like(params)
    model.bind(params, grad)
    start = time.perf_counter()
    for k in range(samples):
        _, dout = softmax_cross_entropy(model.forward(xs[k]), ys[k])
        model.backward(dout)
        total += grad
    total /= samples
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--kind", choices=KINDS, default="1f1b")
    parser.add_argument("--inputs", type=int, default=1024)
    parser.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024, 1024, 1024])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    comm = Comm()
    threads = configure_threads(node_layout(comm.mpi)[1])
    dtype = np.dtype(args.dtype)
    model = mlp(args.inputs, args.hidden, 10)
    params = np.zeros(model.layout.size, dtype=dtype)
    model.init(params, stream(0, "init"))
    kmax = max(args.samples)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((kmax, args.batch, args.inputs)).astype(dtype)
    ys = rng.integers(0, 10, (kmax, args.batch))
    plan = StagePlan.balanced(model, comm.size)
    block = params[plan.param_slice(model, comm.rank)].copy()
    pipe = Pipeline(model, plan, block, comm, xs.shape[1:], source=lambda k: xs[k],
                    sink=lambda k, out: softmax_cross_entropy(out, ys[k]), kind=args.kind)
    grad = np.zeros(pipe.trainable_size, dtype=dtype)
    point = block.copy()
    wall = np.zeros(1)
    rows = []
    for samples in args.samples:
        serial_gradients(model, params, xs, ys, samples)  # warm-up
        pipe.gradient(point, grad, samples)
        pipe.timing.reset()
        serial, piped = [], []
        for _ in range(args.repeats):
            comm.barrier(label="bench")
            serial.append(serial_gradients(model, params, xs, ys, samples))
            comm.barrier(label="bench")
            start = time.perf_counter()
            pipe.gradient(point, grad, samples)
            wall[0] = time.perf_counter() - start
            comm.allreduce_host_(wall, MPI.MAX, label="bench")
            piped.append(float(wall[0]))
        stages = np.zeros((comm.size, 2))
        stages[comm.rank] = pipe.timing.bubble(), 1e3 * pipe.timing.busy / pipe.timing.samples
        comm.allreduce_host_(stages, label="bench")
        rows.append((samples, statistics.median(serial), statistics.median(piped), stages))
    if comm.rank == 0:
        sizes = [plan.param_slice(model, s).stop - plan.param_slice(model, s).start
                 for s in range(comm.size)]
        print(f"pipeline benchmark: mlp {args.inputs}-{'-'.join(map(str, args.hidden))}-10, batch "
              f"{args.batch}, {dtype.name}, {comm.size} stage(s) of {sizes} parameters, "
              f"schedule {args.kind}, {threads.describe()}, median of {args.repeats}")
        print("|  K | 1 process s | pipeline s | speed-up | ideal 2K/(K+1) | bubble per stage "
              "| ideal bubble | busy ms/sample per stage |")
        print("|---:|---:|---:|---:|---:|---|---:|---|")
        for samples, serial, piped, stages in rows:
            ideal = comm.size * samples / (samples + comm.size - 1)
            bubbles = ", ".join(f"{b:.3f}" for b, _ in stages)
            busy = ", ".join(f"{ms:.1f}" for _, ms in stages)
            print(f"| {samples} | {serial:.4f} | {piped:.4f} | {serial / piped:.2f}x | "
                  f"{ideal:.2f}x | {bubbles} | {ideal_bubble(comm.size, samples):.3f} | {busy} |")
    comm.free()


if __name__ == "__main__":
    main()
