"""PR-SGD converges to the known optimum of synthetic problems, at any world size (least
squares on CPU and on the GPU)."""

import dataclasses

import numpy as np
import pytest

from hpcopt.algorithms.local_sgd import LocalSGD
from hpcopt.algorithms.schedules import Schedule
from hpcopt.data.partition import iid_partition
from hpcopt.data.sampler import MinibatchSampler
from hpcopt.data.synthetic import least_squares, logistic_regression
from tests.conftest import host, use_device
from tests.reference import options_of

pytestmark = pytest.mark.mpi


def run_prsgd(problem, comm, steps, interval, schedule, batch=4, device="cpu"):
    """The final model (on the host) of PR-SGD on ``problem``, its data and state on ``device``."""
    backend = use_device(comm, device).backend
    n = problem.targets.shape[0]
    shard = iid_partition(n, comm.rank, comm.size, seed=1)
    sampler = MinibatchSampler(shard, batch, seed=2, rank=comm.rank)
    data = dataclasses.replace(problem, features=backend.asarray(problem.features),
                               targets=backend.asarray(problem.targets))

    def oracle(x, g):
        idx = sampler.next_batch()
        g[...] = data.gradient(x, idx)
        return data.loss(x, idx)

    algorithm = LocalSGD(**options_of(schedule), interval=interval)
    state = algorithm.init(backend.xp.zeros(problem.x_star.size), comm)
    for _ in range(steps):
        algorithm.step(state, oracle, comm)
    return host(state.x)


@pytest.mark.parametrize("interval", [1, 4, 16])
def test_noiseless_least_squares_reaches_the_exact_solution(comm, interval, device):
    problem = least_squares(n=96, d=5, noise=0.0, seed=0)
    x = run_prsgd(problem, comm, steps=480, interval=interval, schedule=Schedule("constant", 0.1),
                  device=device)
    # interpolation regime: every stochastic gradient vanishes at x*, local SGD converges to it
    assert np.linalg.norm(x - problem.x_star) < 1e-6 * np.linalg.norm(problem.x_star)


def test_logistic_regression_approaches_the_optimal_value(comm):
    problem = logistic_regression(n=200, d=4, l2=0.1, seed=0)
    start_gap = problem.loss(np.zeros(4)) - problem.f_star
    schedule = Schedule("step", 0.5, decay=0.2, milestones=(150, 300, 450))
    x = run_prsgd(problem, comm, steps=600, interval=8, schedule=schedule)
    assert problem.loss(x) - problem.f_star < 2e-3 * start_gap
