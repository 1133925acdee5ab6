"""One compressed averaging round across nodes, flat against hierarchical (every rank runs it).

    mpiexec ... python -m benchmarks.cluster.wire_rounds --json OUT.json [--values N] [--rounds R]
                                                        [--load 0 2]

Run across the nodes of an ``EmulatedCluster`` (benchmarks/cluster/study.py does): per variant,
``R`` rounds of ``hpcopt.comm.wire.compressed_mean`` of a message of ``N`` float32 values (the
MLP 1024,1024's 1,863,690 by default), after one round not timed:

- ``float32``: one Allreduce (the uncompressed round);
- ``<wire> flat``: the round a run on one node takes, one Allgather of every rank's payload
  (the communicator's ``in_node`` set, so ``compressed_mean`` takes that path across nodes too);
- ``<wire> hierarchical``: the round a run on several nodes takes (hpcopt/comm/wire_nodes.py);
- ``<wire> rails``: the same with the leaders' work spread over every rank of a node
  (``--node-round rails``).

``--only NAME,...`` runs those variants alone, in that order (interleaved repeats:
benchmarks/cluster/round_paths.py).

Per variant: the slowest rank's seconds a round (a barrier before and after the rounds; the
messages are made before, not timed) and the
bytes each node's link carried a round (its first rank reads the node's ``uplink`` counters:
benchmarks/cluster/emulated.py). Every variant runs once per ``--load`` level (default 0 and 2:
idle, then with two busy processes that rank 0 starts on the machine's cores for the level,
benchmarks/common/load.py). With ``--network SPEC`` (a cost-model profile) every round that is
not flat also gets the modelled seconds of its calls and the rest of its seconds, ``outside``
them (``costmodel.fit_round_compute``: a compressed round's encoding and decoding on the
slowest path). Written by rank 0 as JSON: ``levels``, per level its load (busy
processes, load average at its start and end) and the variants' results; ``results``, the first
level's.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from mpi4py import MPI

from benchmarks.common.load import add_load_option, busy
from hpcopt.comm import costmodel
from hpcopt.comm.core import Comm, OpCounter, node_indices
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


def modelled_since(comm: Comm, before: dict[tuple[str, str], OpCounter], network: costmodel.NetworkProfile,
                   layout: costmodel.NodeLayout | None) -> float:
    """The modelled seconds of the calls ``comm`` counted since its counters were ``before``."""
    since = {}
    for key, now in comm.stats.counters.items():
        was = before.get(key, OpCounter())
        since[key] = OpCounter(now.calls - was.calls, now.bytes - was.bytes, now.seconds - was.seconds,
                               now.in_node_calls - was.in_node_calls, now.in_node_bytes - was.in_node_bytes)
    return sum(costmodel.comm_modelled(since, comm.size, network, label_ranks=comm.stats.ranks,
                                       layout=layout, label_rails=comm.stats.rails).values())


def measure(comm: Comm, args: argparse.Namespace, first: bool, spans_nodes: bool) -> dict[str, dict]:
    """Every variant's seconds and link bytes a round, and with ``--network`` the modelled
    seconds of its calls and the rest, its seconds outside them (on rank 0; empty elsewhere)."""
    network = costmodel.get_profile(args.network) if args.network else None
    layout = costmodel.node_layout_of(list(node_indices(comm.mpi)), network and network.memory)
    results = {}
    rng = np.random.default_rng(comm.rank)
    messages = [rng.standard_normal(args.values, dtype=np.float32) for _ in range(args.rounds + 1)]
    for name in args.only.split(",") if args.only else VARIANTS:
        wire, flat = VARIANTS[name]
        node_round = "rails" if name.endswith(" rails") else "leader"
        comm.in_node = flat or not spans_nodes
        error = np.zeros(args.values, dtype=np.float32)
        compressed_mean(messages[0].copy(), error, wire, comm, "warm-up", node_round)
        inputs = [message.copy() for message in messages[1:]]  # the round overwrites its message
        comm.mpi.Barrier()
        before = {key: replace(counter) for key, counter in comm.stats.counters.items()}
        sent = _link_bytes(first)
        start = time.perf_counter()
        for message in inputs:
            compressed_mean(message, error, wire, comm, "average", node_round)
        comm.mpi.Barrier()
        seconds = comm.mpi.allreduce(time.perf_counter() - start, op=MPI.MAX) / args.rounds
        sent = comm.mpi.gather(_link_bytes(first) - sent if first else None)
        if comm.rank == 0:
            per_node = [b / args.rounds for b in sent if b is not None]
            results[name] = {"seconds": seconds, "link_bytes": per_node}
            if network is not None and not flat:  # a flat round's calls are counted in-node here
                modelled = modelled_since(comm, before, network, layout) / args.rounds
                results[name].update(modelled=modelled,
                                     outside=costmodel.fit_round_compute(seconds, modelled))
    comm.in_node = not spans_nodes
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--values", type=int, default=1_863_690)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--network", help="a cost-model profile (hpcopt train --network): also each round's "
                                     "modelled seconds of its calls, and its seconds outside them")
    p.add_argument("--only", default="", help="comma-separated variants, in this order (default: all)")
    add_load_option(p)
    args = p.parse_args()
    comm = Comm()
    node = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    first = node.Get_rank() == 0
    spans_nodes = not comm.in_node
    levels = []
    for level in args.load:  # rank 0 starts the busy processes; the cores are the machine's
        with busy(level if comm.rank == 0 else 0) as load:
            comm.mpi.Barrier()
            results = measure(comm, args, first, spans_nodes)
        levels.append({"load": load.as_dict(), "results": results})
    node.Free()
    comm.free()
    if comm.rank == 0:
        args.json.write_text(json.dumps({"values": args.values, "rounds": args.rounds, "ranks": comm.size,
                                         "results": levels[0]["results"], "levels": levels}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
