"""Streaming fragments without a wire on several emulated nodes by the rails (``--node-round
rails``, hpcopt/comm/node_reduce.py; tests/nodes/launch.py): the serial float64 reference of
tests/reference.py, the same bits on every rank, a checkpoint at every tick (reductions in
flight included) changing no bit, and what a rank counts: the cross-node sum of its 1/K slice
of each fragment, K rails sharing each link, the in-node stages in-node."""

from __future__ import annotations

import pytest

from tests.nodes.launch import run_on_nodes

STREAMING = """
import shutil
import tempfile
from pathlib import Path
import numpy as np
from hpcopt import train
from hpcopt.comm import Comm
from hpcopt.comm.wire_nodes import NODE_LABEL, chunk_bounds
from tests.mpi.test_optimizers import DILOCO, assert_shared, run_in_process, small_config, state_arrays
from tests.reference import streaming_reference

comm = Comm()
config = small_config(node_round="rails", **{extra})
_, state = train(config, comm, verbose=False)
np.testing.assert_allclose(state.x, streaming_reference(config, comm.size), rtol=1e-10, atol=1e-12)
assert_shared(comm, state)
everyone = comm.mpi.allgather(state.x)
assert all(np.array_equal(x, everyone[0]) for x in everyone)  # the same bits on every rank
rails = comm.rails()
assert comm.stats.rails["fragments"] == rails
calls = comm.stats.totals("fragments", "iallreduce")
node = comm.stats.totals(NODE_LABEL)
assert calls.calls > 0 and calls.in_node_bytes == 0 and node.across_bytes == 0 and node.in_node_calls > 0
owner = comm.node_place[0] < rails  # a node's ranks from K up own no slice
assert (0 < calls.bytes < calls.calls * state.x.nbytes) if owner else calls.bytes == 0  # slices
directory = Path(comm.mpi.bcast(tempfile.mkdtemp(prefix="hpcopt-test-") if comm.rank == 0 else None))
resumed, ticks = run_in_process(config, comm, directory)
plain, _ = run_in_process(config, comm)
expected, got = state_arrays(plain), state_arrays(resumed)
assert sorted(got) == sorted(expected)
for name in expected:
    np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
comm.mpi.Barrier()
if comm.rank == 0:
    shutil.rmtree(directory)
    print("checked", rails, flush=True)
comm.free()
"""


@pytest.mark.parametrize("extra", [
    # DiLoCo per fragment, one in flight at a time, the run ending with one in flight
    'dict(DILOCO, fragments=3, overlap=1, interval=6, steps=14)',
    # three fragments in flight at once, a mix
    'dict(algorithm="slowmo", slow_momentum=0.6, slow_lr=0.9, fragments=4, overlap=3, '
    'fragment_mix=0.7, steps=15)',
    # tau = 0: posted and completed within the step
    'dict(fragments=2, fragment_mix=0.5, momentum=0.9, steps=13)',
])
@pytest.mark.parametrize("hosts, per_node, ranks, rails", [(2, 2, 4, 2), (2, 1, 4, 2), (2, 3, 5, 2)])
def test_fragments_by_the_rails_match_the_serial_reference_and_resume_bitwise(extra, hosts, per_node,
                                                                              ranks, rails):
    job = run_on_nodes(ranks, hosts=hosts, per_node=per_node, code=STREAMING.format(extra=extra))
    assert job.returncode == 0, job.describe()
    assert f"checked {rails}" in job.stdout, job.describe()
