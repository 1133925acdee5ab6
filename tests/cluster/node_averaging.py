"""Run on every rank of an emulated cluster: which ranks MPI groups as a node, and the bytes each
node sends on its link while ``Comm(averaging="shm")`` averages a buffer ``--rounds`` times.

Rank 0 prints one JSON line: per rank its node group (world ranks) and network namespace, and
per node the bytes its link sent during the rounds (read by the node's first rank from the
kernel's counter of the link, inside the node), with the buffer's size. Every rank checks that
every average is right (exit 1 if not)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
from mpi4py import MPI

from hpcopt.comm import Comm


def sent_bytes(device: str) -> int:
    return int(Path(f"/sys/class/net/{device}/statistics/tx_bytes").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="", help="the node's link (none: bytes not counted)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--elements", type=int, default=1 << 19)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    members = node.allgather(rank)
    comm = Comm(averaging="shm")
    buf = np.empty(args.elements, dtype=np.float32)
    expected = [np.float32(sum(range(size)) / size + r) for r in range(args.rounds + 1)]

    def average(r: int) -> None:
        buf[:] = rank + r
        comm.average_(buf)
        if not np.all(buf == expected[r]):
            raise SystemExit(f"rank {rank}: round {r} averaged to {buf[:4]}, not {expected[r]}")

    average(0)  # the window, the node split and the connections are made here, uncounted
    counting = bool(args.device) and node.Get_rank() == 0
    world.Barrier()
    before = sent_bytes(args.device) if counting else 0
    for r in range(1, args.rounds + 1):
        average(r)
    world.Barrier()
    sent = sent_bytes(args.device) - before if counting else None
    facts = world.gather({"rank": rank, "node": members, "netns": os.readlink("/proc/self/ns/net"),
                          "sent": sent}, root=0)
    comm.free()
    node.Free()
    if rank == 0:
        print(json.dumps({"ranks": facts, "buffer_bytes": buf.nbytes, "rounds": args.rounds}), flush=True)


if __name__ == "__main__":
    main()
