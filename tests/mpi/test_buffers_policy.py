"""Batch-norm running statistics at an averaging round, at any world size (1 to 4 ranks):

    mpiexec -n N python -m pytest --with-mpi -p no:cacheprovider tests/mpi/test_buffers_policy.py

Each rank trains a small CNN with batch norm on its own data (shifted by the rank, so the
statistics differ) for one PR-SGD round, then applies the buffer policy; tests taking
``device`` run again with the model, data and statistics on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt.algorithms.buffers import BUFFERS_LABEL, check_buffer_policy, sync_buffers
from hpcopt.algorithms.local_sgd import LocalSGD
from hpcopt.data.sampler import MinibatchSampler
from hpcopt.errors import HpcoptError
from hpcopt.nn import plain_cnn
from hpcopt.problems.classification import ClassificationProblem
from hpcopt.rng import stream
from tests.conftest import host, use_device

pytestmark = pytest.mark.mpi

STEPS = 3  # local steps in the round


def one_round(comm, policy, device="cpu"):
    """(statistics before the policy, after it, PR-SGD state, problem) after one round on
    ``device``."""
    backend = use_device(comm, device).backend
    model = plain_cnn(1, (6, 6), 3, channels=(2, 3), hidden=4, batch_norm=True)
    x0 = np.zeros(model.layout.size)
    model.init(x0, stream(0, "init"))
    buffers = model.buffer_layout.zeros(backend, np.float64)
    model.init_buffers(buffers)
    model.bind_buffers(buffers)
    data = stream(0, "data", comm.rank)
    features = backend.asarray(comm.rank + data.standard_normal((16, 1, 6, 6)))
    labels = backend.asarray(data.integers(0, 3, 16))
    sampler = MinibatchSampler(np.arange(16), 4, seed=0, rank=comm.rank)
    problem = ClassificationProblem(model, features, labels, sampler, backend)
    algorithm = LocalSGD(lr=0.1, interval=STEPS)
    state = algorithm.init(backend.asarray(x0), comm)
    for _ in range(STEPS):
        algorithm.step(state, problem.oracle, comm)
    assert state.rounds == 1 and state.steps_in_round == 0  # the parameters were just averaged
    before = buffers.copy()
    sync_buffers(buffers, policy, comm)
    return before, buffers, state, problem


def gathered(comm, array):
    """Every rank's ``array``, stacked on the host."""
    return np.stack(comm.mpi.allgather(host(array)))


def traffic(comm):
    return [row for row in comm.stats.as_rows() if row[1] == BUFFERS_LABEL]


def test_average_gives_every_rank_the_mean_statistics(comm, device):
    before, after, state, _ = one_round(comm, "average", device)
    all_after = gathered(comm, after)
    assert (all_after == all_after[0]).all()
    np.testing.assert_allclose(host(after), gathered(comm, before).mean(axis=0), rtol=1e-12,
                               atol=1e-15)
    assert (gathered(comm, state.x) == host(state.x)).all()
    assert [row[:4] for row in traffic(comm)] == [("allreduce", BUFFERS_LABEL, 1, after.nbytes)]


def test_local_keeps_each_ranks_own_statistics(comm, device):
    before, after, _, _ = one_round(comm, "local", device)
    np.testing.assert_array_equal(host(after), host(before))
    everyone = gathered(comm, after)
    for i in range(comm.size):
        for j in range(i):
            assert not np.allclose(everyone[i], everyone[j])
    assert traffic(comm) == []


def test_rank0_gives_every_rank_the_statistics_of_rank_0(comm, device):
    before, after, _, _ = one_round(comm, "rank0", device)
    np.testing.assert_array_equal(host(after), gathered(comm, before)[0])
    assert [row[:4] for row in traffic(comm)] == [("bcast", BUFFERS_LABEL, 1, after.nbytes)]


def test_evaluation_uses_the_statistics_it_is_given(comm, device):
    _, buffers, state, problem = one_round(comm, "local", device)
    scratch = sync_buffers(buffers.copy(), "average", comm, label="eval")
    data, xp = stream(1, "eval"), comm.backend.xp
    features = xp.asarray(data.standard_normal((10, 1, 6, 6)))
    labels = xp.asarray(data.integers(0, 3, 10))
    grads = xp.zeros_like(state.x)
    given = problem.evaluate(state.x, grads, features, labels, comm, buffers=scratch)
    assert problem.model.buffers is buffers  # the training statistics are bound again
    own = problem.evaluate(state.x, grads, features, labels, comm)
    problem.model.bind_buffers(scratch)
    assert problem.evaluate(state.x, grads, features, labels, comm) == given
    assert (own.loss != given.loss) == (comm.size > 1)


@pytest.mark.parametrize("policy", ["local", "average", "rank0"])
def test_a_model_without_buffers_moves_nothing(comm, policy):
    sync_buffers(np.zeros(0), policy, comm)
    assert traffic(comm) == []


def test_unknown_policy_is_a_user_error(comm):
    with pytest.raises(HpcoptError, match="local, average, rank0"):
        sync_buffers(np.zeros(3), "mean", comm)
    assert check_buffer_policy("rank0") == "rank0"
