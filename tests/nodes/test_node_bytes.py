"""Bytes by where they went, on two emulated nodes of two ranks (tests/nodes/launch.py): a
group average on a node's communicator is counted in-node, the global average across nodes;
the trace, the summary (its group averages' own split too) and the cost model (in-node calls at
memory speed) carry the split."""

from __future__ import annotations

import pytest

from tests.nodes.launch import run_on_nodes

JOB = """
import shutil
import tempfile
import pytest
from hpcopt import train
from hpcopt.comm import Comm
from hpcopt.comm.costmodel import MEMORY, get_profile
from hpcopt.io.trace import read_trace
from tests.mpi.test_optimizers import small_config

comm = Comm()
out = comm.mpi.bcast(tempfile.mkdtemp(prefix="hpcopt-test-") if comm.rank == 0 else None)
config = small_config(group_size="{group}", group_interval=2, network="eth10", out=out + "/run")
summary, state = train(config, comm, verbose=False)
group, world = comm.stats.totals("group_average"), comm.stats.totals("average")
assert group.calls > 0 and world.calls > 0
assert group.in_node_bytes == (group.bytes if {in_node} else 0)
assert world.in_node_bytes == 0  # the world spans both nodes
in_node = comm.stats.totals().in_node_bytes  # the summary's own reduction is across nodes
assert summary.in_node_bytes_per_rank == comm.mpi.allreduce(in_node) / comm.size
assert summary.group_bytes_per_rank == comm.mpi.allreduce(group.bytes) / comm.size
assert summary.group_in_node_bytes_per_rank == comm.mpi.allreduce(group.in_node_bytes) / comm.size
assert summary.group_in_node_bytes_per_rank <= summary.in_node_bytes_per_rank
assert summary.group_rounds == group.calls  # one allreduce a group round
nbytes, eth10 = state.x.nbytes, get_profile("eth10")
node_level = MEMORY.allreduce(nbytes, 2) if {in_node} else eth10.allreduce(nbytes, 2)
assert summary.modelled_per_round["group_average"] == pytest.approx(node_level, rel=1e-12)
two_levels = MEMORY.allreduce(nbytes, 2) + eth10.allreduce(nbytes, 2)
assert summary.modelled_per_round["average"] == pytest.approx(two_levels, rel=1e-12)
if comm.rank == 0:
    trace = read_trace(out + "/run/trace.h5")
    assert (trace.attrs["network_nodes"], trace.attrs["network_per_node"]) == (2, 2)
    assert trace.comm["group_average"]["in_node_bytes"][-1] == group.in_node_bytes
    assert trace.comm["average"]["in_node_bytes"][-1] == 0
    print("checked", flush=True)
    shutil.rmtree(out)
comm.free()
"""


@pytest.mark.parametrize("per_node, group, in_node", [
    (2, "node", True),  # blocks: each node's group average stays in the node
    (1, "2", False),    # round-robin: a group of 2 consecutive ranks spans both nodes
])
def test_bytes_are_counted_traced_and_modelled_where_they_went(per_node, group, in_node):
    job = run_on_nodes(4, hosts=2, per_node=per_node, code=JOB.format(group=group, in_node=in_node))
    assert job.returncode == 0, job.describe()
    assert job.stdout.count("checked") == 1, job.describe()
