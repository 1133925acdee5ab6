"""A workload from user code (``hpcopt.train(config, workload=...)``): a least-squares problem
written here, not in hpcopt, trained by PR-SGD and SlowMo at any world size. It matches a serial
float64 simulation of the same ranks, resumes bit for bit, and a wrong kind of workload is
refused on every rank."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpcopt import HpcoptError, Workload, build_config, train
from hpcopt.comm import Comm
from hpcopt.data.sampler import MinibatchSampler
from hpcopt.flat import ParamLayout
from hpcopt.problems.classification import Evaluation

pytestmark = pytest.mark.mpi

FEATURES, SAMPLES, BATCH = 5, 96, 4


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((SAMPLES, FEATURES))
    return a, a @ np.arange(1.0, FEATURES + 1) + 0.1 * rng.standard_normal(SAMPLES)


class LeastSquares:
    """0.5 mean (a_i . w + c - b_i)^2 over this rank's minibatch (rows rank, rank + N, ...)."""

    def __init__(self, rank: int, size: int, seed: int = 0) -> None:
        a, b = data()
        self.a, self.b = a[rank::size], b[rank::size]
        self.sampler = MinibatchSampler(np.arange(self.b.size), BATCH, seed, rank)

    def oracle(self, params: np.ndarray, grads: np.ndarray) -> float:
        idx = self.sampler.next_batch()
        residual = self.a[idx] @ params[:-1] + params[-1] - self.b[idx]
        grads[:-1] = self.a[idx].T @ residual / idx.size
        grads[-1] = residual.mean()
        return 0.5 * float(residual @ residual) / idx.size


def workload(rank: int, size: int) -> Workload:
    problem = LeastSquares(rank, size)
    a, b = data()

    def evaluate(params: np.ndarray, scratch: np.ndarray, comm: Comm,
                 buffers: np.ndarray | None = None) -> Evaluation:
        residual = a @ params[:-1] + params[-1] - b
        return Evaluation(0.5 * float(residual @ residual) / b.size, math.nan, b.size)

    return Workload(ParamLayout.of(w=(FEATURES,), c=(1,)), problem, np.zeros(FEATURES + 1),
                    evaluate, problem.sampler.batches_per_epoch, "least squares")


def config(**options: str):
    base = {"steps": "22", "interval": "4", "lr": "0.05", "dtype": "float64", "progress": "false"}
    return build_config(None, {**base, **options})


def reference(size: int, steps: int, interval: int, lr: float) -> np.ndarray:
    """PR-SGD on ``size`` simulated ranks in float64, one after another."""
    problems = [LeastSquares(rank, size) for rank in range(size)]
    x = [np.zeros(FEATURES + 1) for _ in range(size)]
    grad = np.zeros(FEATURES + 1)
    for t in range(steps):
        for rank, problem in enumerate(problems):
            problem.oracle(x[rank], grad)
            x[rank] -= lr * grad
        if (t + 1) % interval == 0 or t + 1 == steps:
            average = np.mean(x, axis=0)
            x = [average.copy() for _ in range(size)]
    return x[0]


def fresh(cfg, comm, resume=None):
    inner = Comm()
    try:
        return train(cfg, inner, verbose=False, resume=resume,
                     workload=workload(comm.rank, comm.size))
    finally:
        inner.free()


def test_a_user_workload_matches_the_serial_reference(comm):
    summary, state = fresh(config(), comm)
    assert summary.steps == 22 and summary.rounds == 5
    np.testing.assert_allclose(state.x, reference(comm.size, 22, 4, 0.05), rtol=1e-12, atol=1e-14)
    assert summary.final.loss < 0.5 * float(np.mean(data()[1] ** 2))  # it learned something


def test_a_user_workload_resumes_bitwise(comm, shared_dir):
    whole, part = str(shared_dir / "whole"), str(shared_dir / "part")
    _, uninterrupted = fresh(config(algorithm="slowmo", steps="24", checkpoint_every="8",
                                    out=whole, momentum="0.9"), comm)
    fresh(config(algorithm="slowmo", steps="16", checkpoint_every="8", out=part,
                 momentum="0.9"), comm)
    summary, resumed = fresh(config(algorithm="slowmo", steps="24", checkpoint_every="8",
                                    out=part, momentum="0.9"), comm, resume=part)
    assert summary.steps == 24
    for name in ("x", "momentum", "anchor", "slow_buffer"):
        np.testing.assert_array_equal(getattr(resumed, name), getattr(uninterrupted, name))


def test_a_pipeline_algorithm_refuses_a_data_parallel_workload(comm):
    with pytest.raises(HpcoptError, match="pprs trains a StagedProblem, not a Workload"):
        fresh(build_config(None, {"algorithm": "pprs", "progress": "false"}), comm)
