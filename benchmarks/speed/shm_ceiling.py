"""The node's memory ceiling for averaging, side by side with hpcopt's shared-memory average.

    mpiexec -n 2 python benchmarks/speed/shm_ceiling.py [--sizes 1M,4M,16M,64M,256M] [--json]

For every size it times, in interleaved rounds (a random order per round, the same on every
rank; a barrier before each call; the slowest rank's time; medians over rounds):

  ceiling      every rank's buffer already lives in one node-shared window (one row per rank);
               each rank sums its share of the columns in place over all rows in a fixed order
               (row 0 += row 1, += row 2, ...) and copies the sum back into the other rows.
               No MPI on the data path: barriers only (Win_sync + barrier + Win_sync), one
               before and one after. About 2.5 N bytes of main-memory traffic per rank for N
               bytes per rank at 2 ranks; it does not divide by the rank count.
  hpcopt       ``Comm(averaging="shm").average_(x)`` of ``x = comm.shared_like(buf)``: the
               model's flat vector in node-shared memory, averaged in place (what training
               does; hpcopt/comm/shm.py)
  hpcopt_copy  the same on a private buffer: copied into the window and back (the path of
               buffers not in shared memory)
  mpi          ``MPI_Allreduce(IN_PLACE)`` of a private buffer, then ``buf /= n`` (the "raw" case
               of ``hpcopt bench allreduce``)

Bandwidth is algbw = bytes / time (nccl-tests), in GB/s (1e9). Without ``--json`` rank 0
prints a table with each case's ratio to the ceiling and the load average at start and end;
with ``--json`` it prints only a JSON list, one object per size with "bytes", "reps" and
"<case>_gbps" / "<case>_ratio" for every case (ratio: to the ceiling, paired per round).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from hpcopt.bench.common import fmt_bytes, parse_bytes
from hpcopt.comm import Comm
from hpcopt.comm.mpi_support import mpi_library

CASES = ("ceiling", "hpcopt", "hpcopt_copy", "mpi")
LINE, PAGE = 64, 4096


class Ceiling:
    """Every rank's buffer in one node-shared window; in-place sum of this rank's share."""

    def __init__(self, node: MPI.Intracomm, count: int, dtype: np.dtype) -> None:
        k, me = node.Get_size(), node.Get_rank()
        row_bytes = -(-count * dtype.itemsize // PAGE) * PAGE
        self.node = node
        self.win = MPI.Win.Allocate_shared(k * row_bytes if me == 0 else 0, 1, comm=node)
        memory, _ = self.win.Shared_query(0)
        raw = np.frombuffer(memory, dtype=np.uint8)  # type: ignore[call-overload]
        self.win.Lock_all(MPI.MODE_NOCHECK)
        rows = [raw[j * row_bytes:j * row_bytes + count * dtype.itemsize].view(dtype) for j in range(k)]
        line = LINE // dtype.itemsize
        cuts = [min(count, count * j // k // line * line) for j in range(k)] + [count]
        self.share = [row[cuts[me]:cuts[me + 1]] for row in rows]
        self.row = rows[me]

    def _sync(self) -> None:
        self.win.Sync()
        self.node.Barrier()
        self.win.Sync()

    def __call__(self) -> None:
        self._sync()
        first, rest = self.share[0], self.share[1:]
        for row in rest:  # fixed order: row 0, 1, ..., k-1, summed in place into row 0
            np.add(first, row, out=first)
        for row in rest:
            np.copyto(row, first)
        self._sync()

    def free(self) -> None:
        self.win.Unlock_all()
        self.win.Free()


def mpi_average(mpi: MPI.Comm, buf: np.ndarray) -> Callable[[], None]:
    n = float(mpi.Get_size())

    def run() -> None:
        mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        np.divide(buf, n, out=buf)
    return run


def measure(mpi: MPI.Comm, node: MPI.Intracomm, nbytes: int, dtype: np.dtype,
            reps: int) -> dict[str, float]:
    count = max(1, nbytes // dtype.itemsize)
    rank = mpi.Get_rank()
    start = np.random.default_rng(rank).random(count).astype(dtype)
    ceiling = Ceiling(node, count, dtype)
    np.copyto(ceiling.row, start)
    comm = Comm(mpi, averaging="shm")
    try:
        shared = comm.shared_like(start)
        assert shared is not start, "hpcopt did not put the buffer in shared memory"
        private, plain = start.copy(), start.copy()
        cases: dict[str, Callable[[], object]] = {
            "ceiling": ceiling, "hpcopt": lambda: comm.average_(shared),
            "hpcopt_copy": lambda: comm.average_(private), "mpi": mpi_average(mpi, plain)}
        for fn in cases.values():  # warm-up: windows, plans, first touch of every page
            fn()
        times = {name: np.empty(reps) for name in cases}
        for r in range(reps):
            for name in np.random.default_rng(r).permutation(list(cases)):  # same order everywhere
                mpi.Barrier()
                t0 = time.perf_counter()
                cases[name]()
                times[name][r] = time.perf_counter() - t0
        for name in cases:
            mpi.Allreduce(MPI.IN_PLACE, times[name], op=MPI.MAX)
        out: dict[str, float] = {"bytes": count * dtype.itemsize, "reps": reps}
        for name in cases:
            out[f"{name}_gbps"] = out["bytes"] / float(np.median(times[name])) / 1e9
            out[f"{name}_ratio"] = float(np.median(times["ceiling"] / times[name]))
        return out
    finally:
        comm.free()
        ceiling.free()


def table(results: list[dict[str, float]]) -> list[str]:
    lines = ["| size | reps | " + " | ".join(f"{c} GB/s" for c in CASES) + " | "
             + " | ".join(f"{c} / ceiling" for c in CASES[1:]) + " |",
             "|---:|---:|" + "---:|" * (2 * len(CASES) - 1)]
    for r in results:
        cells = [f"{r[f'{c}_gbps']:.2f}" for c in CASES] + [f"{r[f'{c}_ratio']:.2f}" for c in CASES[1:]]
        lines.append(f"| {fmt_bytes(int(r['bytes']))} | {int(r['reps'])} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1M,4M,16M,64M,256M",
                   help="comma list of bytes per rank (4M, 64M, ...)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--reps", type=int, default=0,
                   help="rounds per size (default: 101 up to 4 MB, 41 up to 16 MB, 21 up to 64 MB, 9 above)")
    p.add_argument("--json", action="store_true", help="print only a JSON list (rank 0)")
    args = p.parse_args(argv)
    sizes = [parse_bytes(s) for s in args.sizes.split(",") if s]
    dtype = np.dtype(args.dtype)
    mpi = MPI.COMM_WORLD.Dup()
    node = mpi.Split_type(MPI.COMM_TYPE_SHARED, key=mpi.Get_rank())
    assert isinstance(node, MPI.Intracomm)
    if node.Get_size() != mpi.Get_size():
        raise SystemExit("shm_ceiling.py runs on one node (all ranks share memory)")
    load = os.getloadavg()[0]
    results = []
    for nbytes in sizes:
        reps = args.reps or (101 if nbytes <= 4 << 20 else 41 if nbytes <= 16 << 20
                             else 21 if nbytes <= 64 << 20 else 9)
        results.append(measure(mpi, node, nbytes, dtype, reps))
    if mpi.Get_rank() == 0:
        if args.json:
            json.dump(results, sys.stdout)
            print()
        else:
            print(f"# shm_ceiling: {mpi.Get_size()} ranks, {args.dtype}, {mpi_library()}, "
                  f"{os.cpu_count()} cpu(s), load {load:.2f} at start, {os.getloadavg()[0]:.2f} at "
                  "end; algbw, median over interleaved rounds of the slowest rank; ratios paired")
            print("\n".join(table(results)))
    node.Free()
    mpi.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
