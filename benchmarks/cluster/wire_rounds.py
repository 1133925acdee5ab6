"""One compressed averaging round across nodes, flat against hierarchical (every rank runs it).

    mpiexec ... python -m benchmarks.cluster.wire_rounds --json OUT.json [--values N] [--rounds R]

Run across the nodes of an ``EmulatedCluster`` (benchmarks/cluster/study.py does): per variant,
``R`` rounds of ``hpcopt.comm.wire.compressed_mean`` of a message of ``N`` float32 values (the
MLP 1024,1024's 1,863,690 by default), after one round not timed:

- ``float32``: one Allreduce (the uncompressed round);
- ``<wire> flat``: the round a run on one node takes, one Allgather of every rank's payload
  (the communicator's ``in_node`` set, so ``compressed_mean`` takes that path across nodes too);
- ``<wire> hierarchical``: the round a run on several nodes takes (hpcopt/comm/wire_nodes.py);
- ``<wire> rails``: the same with the leaders' work spread over every rank of a node
  (``--node-round rails``).

``--only NAME,...`` runs those variants alone, in that order (interleaved repeats).

Per variant: the slowest rank's seconds a round (a barrier before and after the rounds) and the
bytes each node's link carried a round (its first rank reads the node's ``uplink`` counters:
benchmarks/cluster/emulated.py). Written by rank 0 as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from hpcopt.comm.core import Comm
from hpcopt.comm.wire import compressed_mean

#: The variants: name -> (wire, flat).
VARIANTS = {"float32": ("float32", False),
            "bfloat16 flat": ("bfloat16", True), "bfloat16 hierarchical": ("bfloat16", False),
            "int8 flat": ("int8", True), "int8 hierarchical": ("int8", False),
            "bfloat16 rails": ("bfloat16", False), "int8 rails": ("int8", False)}
#: The node's end of its link (benchmarks/cluster/emulated.py's UPLINK).
COUNTER = "/sys/class/net/uplink/statistics/tx_bytes"


def _link_bytes(first_on_node: bool) -> int:
    return int(Path(COUNTER).read_text()) if first_on_node else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--values", type=int, default=1_863_690)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated variants, in this order (default: all)")
    args = p.parse_args()
    names = args.only.split(",") if args.only else list(VARIANTS)
    comm = Comm()
    node = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    first = node.Get_rank() == 0
    spans_nodes = not comm.in_node
    results = {}
    rng = np.random.default_rng(comm.rank)
    for name in names:
        wire, flat = VARIANTS[name]
        node_round = "rails" if name.endswith(" rails") else "leader"
        comm.in_node = flat or not spans_nodes
        error = np.zeros(args.values, dtype=np.float32)
        compressed_mean(rng.standard_normal(args.values, dtype=np.float32), error, wire, comm, "warm-up",
                        node_round)
        comm.mpi.Barrier()
        sent = _link_bytes(first)
        start = time.perf_counter()
        for _ in range(args.rounds):
            compressed_mean(rng.standard_normal(args.values, dtype=np.float32), error, wire, comm, "average",
                            node_round)
        comm.mpi.Barrier()
        seconds = comm.mpi.allreduce(time.perf_counter() - start, op=MPI.MAX) / args.rounds
        sent = comm.mpi.gather(_link_bytes(first) - sent if first else None)
        if comm.rank == 0:
            per_node = [b / args.rounds for b in sent if b is not None]
            results[name] = {"seconds": seconds, "link_bytes": per_node}
    comm.in_node = not spans_nodes
    node.Free()
    comm.free()
    if comm.rank == 0:
        args.json.write_text(json.dumps({"values": args.values, "rounds": args.rounds,
                                         "ranks": comm.size, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
