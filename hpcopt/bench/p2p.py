"""OSU-style point-to-point benchmark between ranks 0 and 1: latency and bandwidth against size.

    mpiexec -n 2 python -m hpcopt bench p2p [--max-bytes 4M] [--json F]

- latency (osu_latency): ping-pong of one message; one-way latency = round trip / 2, the median
  over repetitions;
- bandwidth (osu_bw): rank 0 posts ``--window`` non-blocking sends back to back, rank 1 the
  matching receives, then rank 1 answers with a 1-byte acknowledgement; bandwidth = window *
  size / time, the median over repetitions.

Ranks above 1 wait. The last line fits the alpha-beta model's point-to-point cost
``alpha + n beta`` (hpcopt.comm.costmodel) to the latencies.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from ..comm.costmodel import NetworkProfile
from ..comm.mpi_support import mpi_library
from ..errors import HpcoptError
from .common import Parser, fmt_bytes, parse_bytes, sizes_between, write_json

TAG, ACK = 11, 12


def latency(mpi: MPI.Comm, nbytes: int, reps: int) -> float:
    """Median one-way time of a ping-pong of ``nbytes`` between ranks 0 and 1 (rank 0's view)."""
    rank = mpi.Get_rank()
    buf = np.zeros(max(nbytes, 1), dtype=np.uint8)[:nbytes]
    times = np.empty(reps)
    for r in range(reps):
        start = time.perf_counter()
        if rank == 0:
            mpi.Send(buf, dest=1, tag=TAG)
            mpi.Recv(buf, source=1, tag=TAG)
        elif rank == 1:
            mpi.Recv(buf, source=0, tag=TAG)
            mpi.Send(buf, dest=0, tag=TAG)
        times[r] = (time.perf_counter() - start) / 2
    return float(np.median(times))


def bandwidth(mpi: MPI.Comm, nbytes: int, reps: int, window: int) -> float:
    """Median bytes per second of ``window`` back-to-back messages of ``nbytes`` from 0 to 1."""
    rank = mpi.Get_rank()
    bufs = [np.zeros(nbytes, dtype=np.uint8) for _ in range(window)]
    ack = np.zeros(1, dtype=np.uint8)
    rates = np.empty(reps)
    for r in range(reps):
        start = time.perf_counter()
        if rank == 0:
            MPI.Request.Waitall([mpi.Isend(b, dest=1, tag=TAG) for b in bufs])
            mpi.Recv(ack, source=1, tag=ACK)
        elif rank == 1:
            MPI.Request.Waitall([mpi.Irecv(b, source=0, tag=TAG) for b in bufs])
            mpi.Send(ack, dest=0, tag=ACK)
        rates[r] = window * nbytes / (time.perf_counter() - start)
    return float(np.median(rates))


def fit_p2p(sizes: list[int], seconds: list[float]) -> NetworkProfile:
    """Least-squares ``t = alpha + n beta`` with relative errors (each point weighted 1/t)."""
    n, t = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    design = np.column_stack([np.ones_like(n), n]) / t[:, None]
    alpha, beta = (max(0.0, float(c)) for c in np.linalg.lstsq(design, np.ones_like(t), rcond=None)[0])
    return NetworkProfile("fitted-p2p", alpha, beta)


def measure(mpi: MPI.Comm, sizes: list[int], reps: int, window: int) -> list[dict[str, Any]]:
    """Per size (rank 0's figures, broadcast): {"bytes", "latency_s", "bandwidth_Bps"}."""
    rows = []
    for nbytes in sizes:
        scaled = max(3, reps if nbytes <= 64 << 10 else reps // 4)  # fewer repetitions for large sizes
        latency(mpi, nbytes, 2)  # warm-up
        lat = latency(mpi, nbytes, scaled)
        bw = bandwidth(mpi, nbytes, max(3, scaled // 4), window) if nbytes else float("nan")
        lat, bw = mpi.bcast((lat, bw), root=0)
        rows.append({"bytes": nbytes, "latency_s": lat, "bandwidth_Bps": bw})
        mpi.Barrier()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="hpcopt bench p2p", description=__doc__.splitlines()[0])
    p.add_argument("--min-bytes", type=parse_bytes, default="1", help="smallest message (1, 64K, 4M)")
    p.add_argument("--max-bytes", type=parse_bytes, default="4M", help="largest message")
    p.add_argument("--factor", type=int, default=4, help="each size is this many times the last")
    p.add_argument("--reps", type=int, default=200, help="ping-pongs per size up to 64 KB (a quarter above)")
    p.add_argument("--window", type=int, default=16, help="messages in flight in the bandwidth test")
    p.add_argument("--json", type=Path, help="also write the results here (rank 0)")
    args = p.parse_args(argv)
    if args.reps < 1 or args.window < 1:
        raise HpcoptError("--reps and --window must be >= 1")
    mpi = MPI.COMM_WORLD.Dup()
    try:
        if mpi.Get_size() < 2:
            raise HpcoptError("hpcopt bench p2p needs 2 ranks (mpiexec -n 2 python -m hpcopt bench p2p)")
        rows = measure(mpi, [0, *sizes_between(args.min_bytes, args.max_bytes, args.factor)],
                       args.reps, args.window)
        if mpi.Get_rank() != 0:
            return 0
        print(f"# hpcopt bench p2p: ranks 0 and 1 of {mpi.Get_size()}, {mpi_library()}, "
              f"{os.cpu_count()} cpu(s), load {os.getloadavg()[0]:.2f}; medians over repetitions")
        print("| size | latency us | bandwidth MB/s |\n|---:|---:|---:|")
        for r in rows:
            bw = "-" if r["bytes"] == 0 else f"{r['bandwidth_Bps'] / 1e6:,.1f}"
            print(f"| {fmt_bytes(r['bytes'])} | {1e6 * r['latency_s']:.2f} | {bw} |")
        fitted = fit_p2p([r["bytes"] for r in rows], [r["latency_s"] for r in rows])
        print(f"# fitted alpha + n beta: alpha {1e6 * fitted.alpha:.2f} us, bandwidth "
              f"{fitted.bandwidth / 1e9:.2f} GB/s "
              f"-> --network alpha={fitted.alpha:.3g},beta={fitted.beta:.3g}")
        write_json(args.json, {"ranks": mpi.Get_size(), "mpi": mpi_library(), "results": rows,
                               "fit": {"alpha": fitted.alpha, "beta": fitted.beta}})
        return 0
    finally:
        mpi.Free()
