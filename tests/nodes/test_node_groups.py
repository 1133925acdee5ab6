"""``--group-size node`` on emulated nodes (tests/nodes/launch.py): with round-robin placement
the groups are each node's ranks, not consecutive ones, matching the serial reference; a
numeric group that spans nodes, or on several nodes splits one, gets one warning line from
rank 0 and the run goes on."""

from __future__ import annotations

import pytest

from tests.faults.jobs import SMALL
from tests.nodes.launch import run_on_nodes

#: Rank 0 checks the run against the serial reference with the job's node map, and that
#: consecutive groups would have given another model (so the check tells them apart).
NODE_GROUPS = """
import numpy as np
from hpcopt import train
from hpcopt.comm import Comm
from hpcopt.comm.core import node_indices
from tests.mpi.test_optimizers import small_config
from tests.reference import prsgd_reference

comm = Comm()
nodes = node_indices(comm.mpi)
config = small_config(group_size="node", group_interval=2, momentum=0.9)
_, state = train(config, comm, verbose=False)
if comm.rank == 0:
    np.testing.assert_allclose(state.x, prsgd_reference(config, comm.size, nodes), rtol=1e-10, atol=1e-12)
    consecutive = prsgd_reference(small_config(group_size=2, group_interval=2, momentum=0.9), comm.size)
    assert not np.allclose(state.x, consecutive, rtol=1e-6), "the node map made no difference"
    print("nodes", nodes, "groups", comm.stats.ranks, flush=True)
comm.free()
"""


def test_node_groups_follow_round_robin_placement():
    job = run_on_nodes(4, hosts=2, per_node=1, code=NODE_GROUPS)
    assert job.returncode == 0, job.describe()
    assert "nodes (0, 1, 0, 1) groups {'group_average': 2}" in job.stdout
    assert "warning" not in job.stderr


@pytest.mark.parametrize("per_node, group_size, warning", [
    (1, "2", "group_size 2: group 0 (ranks 0-1) spans 2 nodes"),       # round-robin
    (4, "2", None),  # one node of 4: groups within it are the only two-level schedule there
    (2, "2", None),                                                      # blocks of 2: the nodes
    (1, "node", None),
])
def test_a_numeric_group_that_misses_the_nodes_is_warned_about_once(per_node, group_size, warning):
    args = ["train", *SMALL, "--steps", "8", "--group-size", group_size, "--group-interval", "2",
            "--progress", "true"]
    job = run_on_nodes(4, hosts=2, per_node=per_node, args=args)
    assert job.returncode == 0, job.describe()
    warnings = [line for line in job.stderr.splitlines() if line.startswith("hpcopt: warning:")]
    assert warnings == ([] if warning is None else [warnings[0]]), job.describe()
    if warning is not None:
        assert warning in warnings[0]
    assert "steps             8 per rank" in job.stdout  # the run went on to its end
