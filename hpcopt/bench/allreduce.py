"""OSU-style allreduce benchmark with the nccl-tests bandwidths, and the cost model fitted to it.

    mpiexec -n 2 python -m hpcopt bench allreduce [--min-bytes 4K] [--max-bytes 16M] [--json F]
                                                  [--within node] [--stream]

For each message size it times, interleaved over repetitions (a barrier before each call, the
slowest rank's time kept, the median over repetitions reported; the JSON also holds the median
of the least rank's time, ``last_arrival``: the call's own, without waiting for a late rank),
over all ranks, or with ``--within node`` over each node's ranks, every node at once:

  raw        ``MPI_Allreduce(IN_PLACE)`` of the whole buffer, then ``buf /= n``
  <mode>     ``Comm(averaging=mode).average_(buf)`` for each ``--averaging`` mode (default
             auto) of a private buffer
  <mode>-shared  the same of ``comm.shared_like(buf)``, where that mode puts it in node-shared
             memory: averaged there in place, with no copy into a window (what training does
             with the model's flat vector)

Bandwidths as nccl-tests defines them: algbw = bytes / time; busbw = algbw * 2(n-1)/n, the
rate each rank's link runs at in a ring allreduce, comparable across rank counts. The last
lines fit the alpha-beta model (hpcopt.comm.costmodel.fit_allreduce, in the form the model prices
with) to the first ``--averaging`` mode and print the ``--network`` value that replays it, with
the model's error at each size.

Across nodes, ``--stream`` also measures one raw TCP stream of the largest size from the first
node to the second in the same run (hpcopt/bench/stream.py), and prints each case's fraction of
it: the bytes a node's link must carry in an allreduce of n bytes over m nodes, 2 (m-1)/m n (n
at 2 nodes, whatever the algorithm), per second, over the stream's bytes per second.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from ..comm import AVERAGING_MODES, Comm
from ..comm.costmodel import NetworkProfile, fit_allreduce
from ..comm.mpi_support import mpi_library
from ..errors import HpcoptError
from .common import (
    Parser,
    fmt_bytes,
    parse_bytes,
    repetitions,
    sizes_between,
    write_json,
)
from .stream import stream_rate

#: ``--help``'s account of the table's cases and columns (the module docstring has the detail).
COLUMNS = ("Cases: raw = MPI_Allreduce(IN_PLACE) of the whole buffer, then buf /= n; auto, mpi, "
           "shm (--averaging) = hpcopt's Comm.average_ in that mode, of a private buffer; MODE-shared "
           "= the same of a node-shared buffer, averaged in place (what training does with the "
           "model). Columns per case: us = a call's microseconds (the slowest rank's, median over "
           "reps), algbw = bytes / time and busbw = algbw x 2(n-1)/n (nccl-tests' bandwidths: busbw "
           "compares across rank counts).")


def bus_factor(ranks: int) -> float:
    """nccl-tests' allreduce bus bandwidth factor 2(n-1)/n."""
    return 2 * (ranks - 1) / ranks if ranks > 1 else 1.0


def measure(mpi: MPI.Comm, sizes: list[int], modes: list[str], dtype: str = "float32",
            budget: float = 0.3, min_reps: int = 5, max_reps: int = 200) -> list[dict[str, Any]]:
    """Per size: {"bytes", "reps", "seconds" and "last_arrival": {case: median s}}
    (``_timed_cases``); the same on every rank."""
    comms = {mode: Comm(mpi, averaging=mode) for mode in modes}
    results = []
    try:
        for nbytes in sizes:
            count = max(1, nbytes // np.dtype(dtype).itemsize)
            buf = np.random.default_rng(mpi.Get_rank()).random(count).astype(dtype)
            # a Comm per size for the buffers in shared memory: freed with them, once timed
            sharing = {mode: Comm(mpi, averaging=mode) for mode in modes}
            try:
                reps, medians = _timed_cases(mpi, buf, comms, sharing, budget, min_reps, max_reps)
            finally:
                for comm in sharing.values():
                    comm.free()
            results.append({"bytes": int(buf.nbytes), "reps": reps, "seconds": medians["slowest"],
                            "last_arrival": medians["last_arrival"]})
    finally:
        for comm in comms.values():
            comm.free()
    return results


def _timed_cases(mpi: MPI.Comm, buf: np.ndarray, comms: dict[str, Comm], sharing: dict[str, Comm],
                 budget: float, min_reps: int, max_reps: int) -> tuple[int, dict[str, dict[str, float]]]:
    """(repetitions, {"slowest" and "last_arrival": {case: median s}}) of every case on ``buf``:
    per repetition the slowest rank's seconds, and the least of the ranks' (the rank that left
    the barrier last, which waited for no other: the call's own time, without the others' wait
    for it, which a loaded machine's scheduler adds); the ``<mode>-shared`` cases average a copy
    of it that ``sharing[mode]`` put in node-shared memory."""
    cases: dict[str, Callable[[], Any]] = {"raw": _raw(mpi, buf, float(mpi.Get_size()))}
    for mode, comm in comms.items():
        cases[mode] = partial(comm.average_, buf)
    for mode, comm in sharing.items():
        shared = comm.shared_like(buf)
        if shared is not buf:
            cases[f"{mode}-shared"] = partial(comm.average_, shared)
    for fn in cases.values():  # warm-up (also makes the shared-memory window once)
        fn()
    start = time.perf_counter()
    for fn in cases.values():
        fn()
    reps = repetitions((time.perf_counter() - start) / len(cases), budget, min_reps, max_reps, mpi)
    times = {name: np.empty(reps) for name in cases}
    for r in range(reps):
        for name in np.random.default_rng(r).permutation(list(cases)):  # same order on all ranks
            mpi.Barrier()
            t0 = time.perf_counter()
            cases[name]()
            times[name][r] = time.perf_counter() - t0
    medians: dict[str, dict[str, float]] = {"slowest": {}, "last_arrival": {}}
    for name in cases:
        for kind, op in (("slowest", MPI.MAX), ("last_arrival", MPI.MIN)):
            per_rep = times[name].copy()
            mpi.Allreduce(MPI.IN_PLACE, per_rep, op=op)
            medians[kind][name] = float(np.median(per_rep))
    return reps, medians


def _node_count(world: MPI.Comm) -> int:
    """How many shared-memory nodes ``world``'s ranks are on (collective)."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        return sum(world.allgather(node.Get_rank() == 0))
    finally:
        node.Free()


def _raw(mpi: MPI.Comm, buf: np.ndarray, n: float) -> Callable[[], None]:
    def raw() -> None:
        mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        np.divide(buf, n, out=buf)
    return raw


def fit(results: list[dict[str, Any]], case: str, ranks: int) -> NetworkProfile:
    """The alpha-beta profile fitted to one case's medians (in the form the model prices with:
    ``costmodel.fit_allreduce``)."""
    return fit_allreduce([r["bytes"] for r in results], [r["seconds"][case] for r in results], ranks,
                         name=f"fitted-{case}")


def table(results: list[dict[str, Any]], ranks: int) -> list[str]:
    cases = list(results[0]["seconds"])
    factor = bus_factor(ranks)
    header = " | ".join(f"{c} us | {c} algbw GB/s | {c} busbw GB/s" for c in cases)
    lines = ["| size | reps | " + header + " |",
             "|---:|---:|" + "---:|---:|---:|" * len(cases)]
    for r in results:
        cells = []
        for c in cases:
            t = r["seconds"][c]
            alg = r["bytes"] / t / 1e9
            cells += [f"{1e6 * t:.1f}", f"{alg:.3f}", f"{alg * factor:.3f}"]
        lines.append(f"| {fmt_bytes(r['bytes'])} | {r['reps']} | " + " | ".join(cells) + " |")
    return lines


def link_bytes(nbytes: int, nodes: int) -> float:
    """The bytes a node's link carries, at least, in an allreduce of ``nbytes`` over ``nodes``
    nodes: its share out in the reduce-scatter and the others' shares in the allgather."""
    return 2 * (nodes - 1) / nodes * nbytes


def link_fractions(results: list[dict[str, Any]], nodes: int, stream: float) -> list[str]:
    """The lines that give each case's link rate as a fraction of the raw stream's."""
    cases = list(results[0]["seconds"])
    lines = [f"# raw TCP stream, first node to second: {8 * stream / 1e6:.1f} Mbit/s; fraction of it each "
             f"case's link carried (2(m-1)/m x bytes / time, m = {nodes} nodes):",
             "| size | " + " | ".join(cases) + " |", "|---:|" + "---:|" * len(cases)]
    for r in results:
        cells = [f"{link_bytes(r['bytes'], nodes) / r['seconds'][c] / stream:.2f}" for c in cases]
        lines.append(f"| {fmt_bytes(r['bytes'])} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="hpcopt bench allreduce", description=__doc__.splitlines()[0], epilog=COLUMNS)
    p.add_argument("--min-bytes", type=parse_bytes, default="4K", help="smallest message (4096, 64K, 16M)")
    p.add_argument("--max-bytes", type=parse_bytes, default="16M", help="largest message")
    p.add_argument("--factor", type=int, default=4, help="each size is this many times the last")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"), help="element type")
    p.add_argument("--averaging", default="auto",
                   help=f"comma list of Comm modes ({', '.join(AVERAGING_MODES)})")
    p.add_argument("--budget", type=float, default=0.3, help="seconds of timed calls per size and case")
    p.add_argument("--min-reps", type=int, default=5, help="timed calls per size and case, at least")
    p.add_argument("--max-reps", type=int, default=200, help="timed calls per size and case, at most")
    p.add_argument("--json", type=Path, help="also write the medians here (rank 0)")
    p.add_argument("--within", choices=("world", "node"), default="world",
                   help="node: every node averages over its own ranks at once (what in-node calls cost "
                        "while the other nodes make theirs); rank 0 reports its node and fits --network's "
                        "memory_alpha and memory_beta")
    p.add_argument("--stream", action="store_true",
                   help="across nodes: also time one raw TCP stream of --max-bytes from the first node "
                        "to the second, and print each case's fraction of it")
    args = p.parse_args(argv)
    modes = [m for m in args.averaging.split(",") if m]
    if not modes or any(m not in AVERAGING_MODES for m in modes):
        raise HpcoptError(f"--averaging takes a comma list of {', '.join(AVERAGING_MODES)}")
    world = MPI.COMM_WORLD
    node = args.within == "node"
    mpi = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank()) if node else world.Dup()
    try:
        n, rank = mpi.Get_size(), world.Get_rank()
        results = measure(mpi, sizes_between(args.min_bytes, args.max_bytes, args.factor), modes,
                          args.dtype, args.budget, args.min_reps, args.max_reps)
        stream = stream_rate(world, args.max_bytes) if args.stream and not node else None
        nodes = _node_count(world)
        if rank != 0:
            return 0
        scope = f"rank 0's node of {world.Get_size()} ranks: " if node else ""
        print(f"# hpcopt bench allreduce: {scope}{n} rank(s), {args.dtype}, {mpi_library()}, "
              f"{os.cpu_count()} cpu(s), load {os.getloadavg()[0]:.2f}; median over reps of the "
              f"slowest rank; busbw = algbw * {bus_factor(n):.3f}")
        print("\n".join(table(results, n)))
        data: dict[str, Any] = {"ranks": n, "within": args.within, "dtype": args.dtype, "mpi": mpi_library(),
                                "results": results}
        if n > 1 and len(results) > 1:
            net = fit(results, modes[0], n)
            prefix = "memory_" if node else ""
            print(f"# fitted to {modes[0]}: alpha {1e6 * net.alpha:.2f} us, bandwidth "
                  f"{net.bandwidth / 1e9:.2f} GB/s -> --network {prefix}alpha={net.alpha:.3g},"
                  f"{prefix}beta={net.beta:.3g}")
            errors = [net.allreduce(r["bytes"], n) / r["seconds"][modes[0]] for r in results]
            print("# model / measured: " + ", ".join(f"{fmt_bytes(r['bytes'])} {e:.2f}"
                                                      for r, e in zip(results, errors)))
            data["fit"] = {"case": modes[0], "alpha": net.alpha, "beta": net.beta}
        if args.stream:
            if stream is None:
                print("# raw TCP stream: not measured (one node, or no address of the second node answered)")
            else:
                print("\n".join(link_fractions(results, nodes, stream)))
            data["stream"] = {"bytes_per_second": stream, "nodes": nodes}
        write_json(args.json, data)
        return 0
    finally:
        mpi.Free()
