"""The inner optimizers' step on NumPy vectors, block by block (hpcopt.algorithms.inner):
the bits of the whole-vector operations, and no temporary vector of the model's size."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hpcopt.algorithms.inner import BLOCK, adamw_step
from hpcopt.algorithms.local_sgd import LocalSGD
from tests.memory import peak_allocation

OPTIONS = [
    {"momentum": 0.0},
    {"momentum": 0.9},
    {"momentum": 0.9, "nesterov": True},
    {"momentum": 0.9, "weight_decay": 5e-4},
    {"momentum": 0.5, "nesterov": True, "weight_decay": 1e-2},
    {"inner_optimizer": "adamw", "weight_decay": 0.1},
]


def state_of(algorithm: LocalSGD, d: int, dtype: type, seed: int = 0) -> SimpleNamespace:
    rng = np.random.default_rng(seed)
    vector = lambda: rng.standard_normal(d).astype(dtype)  # noqa: E731
    adamw = algorithm.adamw
    return SimpleNamespace(
        x=vector(), grad=vector(), step=3, steps_in_round=1,
        momentum=vector() if algorithm.momentum > 0 else None,
        exp_avg=vector() if adamw else None, exp_avg_sq=np.abs(vector()) if adamw else None)


def whole_vector_step(algorithm: LocalSGD, s: SimpleNamespace, lr: float) -> None:
    """The step as hpcopt took it before it was blocked: each operation on whole vectors."""
    if algorithm.adamw:
        adamw_step(s.x, s.grad, s.exp_avg, s.exp_avg_sq, lr, beta1=algorithm.adam_beta1,
                   beta2=algorithm.adam_beta2, eps=algorithm.adam_eps,
                   weight_decay=algorithm.weight_decay, k1=s.step + 1, k2=s.step + 1)
        return
    if algorithm.weight_decay:
        s.grad += algorithm.weight_decay * s.x
    direction = s.grad
    if s.momentum is not None:
        s.momentum *= algorithm.momentum
        s.momentum += s.grad
        direction = s.momentum
        if algorithm.nesterov:
            direction = s.grad + algorithm.momentum * s.momentum
    s.x -= lr * direction


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", OPTIONS)
def test_a_blocked_step_holds_the_bits_of_the_whole_vector_step(options, dtype):
    algorithm = LocalSGD(lr=0.05, interval=4, **options)
    d = 2 * BLOCK + 3  # two whole blocks and a short one
    blocked, whole = state_of(algorithm, d, dtype), state_of(algorithm, d, dtype)
    for _ in range(3):
        algorithm.inner_step(blocked, 0.05)
        whole_vector_step(algorithm, whole, 0.05)
        blocked.grad[...] = whole.grad = state_of(algorithm, d, dtype, seed=blocked.step).grad
        blocked.step = whole.step = blocked.step + 1
    for field in ("x", "momentum", "exp_avg", "exp_avg_sq"):
        if getattr(whole, field) is not None:
            assert getattr(blocked, field).tobytes() == getattr(whole, field).tobytes(), field


@pytest.mark.parametrize("options", OPTIONS)
def test_a_step_allocates_no_vector_of_the_models_size(options):
    """Every temporary is one block's: a step reads and writes each vector once from memory
    (the whole-vector step made a temporary of d values, 4 d bytes here)."""
    algorithm = LocalSGD(lr=0.05, interval=4, **options)
    d = 16 * BLOCK
    state = state_of(algorithm, d, np.float32)
    algorithm.inner_step(state, 0.05)  # warm
    _, peak = peak_allocation(lambda: algorithm.inner_step(state, 0.05))
    assert peak <= 2 * 4 * BLOCK < 4 * d // 4


def test_an_empty_model_steps():
    algorithm = LocalSGD(lr=0.05, momentum=0.9, interval=4)
    state = state_of(algorithm, 0, np.float64)
    algorithm.inner_step(state, 0.05)
    assert state.x.size == 0
