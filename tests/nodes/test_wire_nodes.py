"""The compressed round on several emulated nodes (hpcopt/comm/wire_nodes.py,
tests/nodes/launch.py): every rank gets the same bits, equal to the serial float64/numpy
reference of the same algorithm (tests/reference.py, ``hierarchical_wire_mean``), rounds after
rounds of error feedback; a leader's cross-node bytes per round stay about one message however
many nodes there are, and the other ranks send nothing across; with the rails every rank of a
node sends its 1/K share of that; training through it matches the serial PR-SGD reference on
the job's node map, and a checkpoint at every tick changes no bit."""

from __future__ import annotations

import pytest

from tests.nodes.launch import run_on_nodes

#: Three rounds through ``node_round``'s path, each the reference's bits on every rank; a check
#: of the bytes follows (ROUNDS, RAILS)
ROUND_LOOP = """
import numpy as np
from hpcopt.comm import Comm
from hpcopt.comm.core import node_indices
from hpcopt.comm.codec import message_bytes
from hpcopt.comm.wire import compressed_mean
from hpcopt.comm.wire_nodes import NODE_LABEL, chunk_bounds
from tests.reference import hierarchical_wire_mean

comm = Comm()
nodes, d, wire = node_indices(comm.mpi), 3001, "{wire}"
errors = [np.zeros(d) for _ in range(comm.size)]
error = np.zeros(d)
for r in range(3):
    messages = [np.random.default_rng([r, i]).standard_normal(d) * (1 + i) for i in range(comm.size)]
    mean = compressed_mean(messages[comm.rank].copy(), error, wire, comm, "average", "{node_round}")
    expected = hierarchical_wire_mean(messages, errors, wire, nodes, "{node_round}")
    np.testing.assert_array_equal(mean, expected)  # the reference's bits, on every rank
    np.testing.assert_array_equal(error, errors[comm.rank])
    everyone = comm.mpi.allgather(mean)
    assert all(np.array_equal(m, mean) for m in everyone)
"""

ROUNDS = """
leader, size = nodes.index(nodes[comm.rank]) == comm.rank, len(set(nodes))
sizes = [message_bytes(wire, hi - lo) for lo, hi in chunk_bounds(d, size)]
across = comm.stats.totals("average").across_bytes
assert across == (3 * (sum(sizes) if leader else 0)), (across, sizes)
assert comm.stats.totals(NODE_LABEL).across_bytes == 0
assert comm.stats.totals(NODE_LABEL).in_node_bytes > 0
everyone = comm.mpi.gather((comm.rank, across // 3, message_bytes(wire, d)), root=0)
if comm.rank == 0:
    for r, a, m in everyone:
        print("rank", r, "across per round", a, "message", m, flush=True)
comm.free()
"""


def across_per_round(stdout: str) -> dict[int, tuple[int, int]]:
    return {int(w[1]): (int(w[5]), int(w[7])) for w in (line.split() for line in stdout.splitlines())
            if w[:1] == ["rank"]}


@pytest.mark.parametrize("wire", ["bfloat16", "int8"])
@pytest.mark.parametrize("hosts, per_node, ranks", [(2, 2, 4), (2, 1, 4), (3, 1, 3), (4, 1, 4)])
def test_every_rank_gets_the_references_bits_and_cross_node_bytes_stay_flat(wire, hosts, per_node, ranks):
    code = ROUND_LOOP.format(wire=wire, node_round="leader") + ROUNDS
    job = run_on_nodes(ranks, hosts=hosts, per_node=per_node, code=code)
    assert job.returncode == 0, job.describe()
    sent = across_per_round(job.stdout)
    assert sorted(sent) == list(range(ranks)), job.describe()
    leaders = [rank for rank, (bytes_, _) in sent.items() if bytes_]
    assert len(leaders) == hosts  # one leader a node; the others send nothing across
    for rank in leaders:
        across, message = sent[rank]
        assert message <= across <= message + 8 * hosts  # one message (int8: a scale per chunk more)


RAILS = """
rails, hosts = comm.rails(), len(set(nodes))
s = [i for i in range(comm.size) if nodes[i] == nodes[comm.rank]].index(comm.rank)
lo, hi = chunk_bounds(d, rails)[s] if s < rails else (0, 0)
chunks = [message_bytes(wire, b - a) for a, b in chunk_bounds(hi - lo, hosts)] if s < rails else [0]
across = comm.stats.totals("average").across_bytes
assert across == 3 * sum(chunks), (across, chunks)
assert comm.stats.rails["average"] == rails and comm.stats.ranks.get("average", hosts) == hosts
assert comm.stats.totals(NODE_LABEL).across_bytes == 0
if comm.rank == 0:
    print("rails", rails, flush=True)
comm.free()
"""


@pytest.mark.parametrize("wire", ["bfloat16", "int8"])
@pytest.mark.parametrize("hosts, per_node, ranks, rails", [(2, 2, 4, 2), (2, 1, 4, 2), (2, 3, 5, 2),
                                                           (3, 2, 6, 2), (2, 3, 6, 3)])
def test_the_rails_give_every_rank_the_references_bits_and_share_the_bytes(wire, hosts, per_node,
                                                                          ranks, rails):
    """Block and round-robin placement, a node with a rank more than the rails (it owns none),
    3 nodes and 3 rails."""
    code = ROUND_LOOP.format(wire=wire, node_round="rails") + RAILS
    job = run_on_nodes(ranks, hosts=hosts, per_node=per_node, code=code)
    assert job.returncode == 0, job.describe()
    assert f"rails {rails}" in job.stdout, job.describe()


TRAINING = """
import shutil
import tempfile
from pathlib import Path
import numpy as np
from hpcopt import train
from hpcopt.comm import Comm
from hpcopt.comm.core import node_indices
from tests.mpi.test_optimizers import DILOCO, assert_shared, run_in_process, small_config, state_arrays
from tests.reference import prsgd_reference

comm = Comm()
nodes = node_indices(comm.mpi)
config = small_config(wire="{wire}", node_round="{node_round}", **{extra})
_, state = train(config, comm, verbose=False)
np.testing.assert_allclose(state.x, prsgd_reference(config, comm.size, nodes), rtol=1e-10, atol=1e-10)
flat = prsgd_reference(config, comm.size)  # the round on one node: another algorithm
assert np.allclose(state.x, flat, rtol=1e-10, atol=1e-10) == ("{node_round}" == "flat")
assert_shared(comm, state)
everyone = comm.mpi.allgather(state.x)
assert all(np.array_equal(x, everyone[0]) for x in everyone)  # the round leaves the same bits
# a checkpoint written and read back at every tick changes no bit (the leaders' errors included)
directory = Path(comm.mpi.bcast(tempfile.mkdtemp(prefix="hpcopt-test-") if comm.rank == 0 else None))
resumed, _ = run_in_process(config, comm, directory)
plain, _ = run_in_process(config, comm)
expected, got = state_arrays(plain), state_arrays(resumed)
assert "wire_error" in got and sorted(got) == sorted(expected)
for name in expected:
    np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
comm.mpi.Barrier()
if comm.rank == 0:
    shutil.rmtree(directory)
    print("checked", flush=True)
comm.free()
"""


@pytest.mark.parametrize("wire, extra", [
    ("bfloat16", "DILOCO"),                 # the pseudo-gradients are sent
    ("int8", "dict(momentum=0.9, steps=8)"),  # plain averaging: the models are sent
])
@pytest.mark.parametrize("per_node, node_round", [(2, "leader"), (1, "leader"), (2, "rails"),
                                                 (1, "rails"), (2, "flat")])
def test_training_through_the_hierarchical_round_matches_the_serial_reference(wire, extra, per_node,
                                                                              node_round):
    """Every ``node_round``, the rails with block and round-robin placement."""
    job = run_on_nodes(4, hosts=2, per_node=per_node,
                       code=TRAINING.format(wire=wire, extra=extra, node_round=node_round))
    assert job.returncode == 0, job.describe()
    assert "checked" in job.stdout
