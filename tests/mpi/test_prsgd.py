"""PR-SGD under MPI at any world size: exact agreement with the serial float64 reference, on
CPU and (tests taking ``device``) on the GPU, whose results are compared on host copies."""

import numpy as np
import pytest

from hpcopt import train
from hpcopt.build import build_run
from hpcopt.config import build_config
from tests.conftest import data_pointer, host, on_devices, use_device
from tests.reference import minibatch_sgd_reference, prsgd_reference

pytestmark = pytest.mark.mpi


def small_config(**overrides):
    base = dict(dataset="digits", hidden="12", batch_size="8", steps="23", dtype="float64",
                lr="0.1", interval="4", progress="false", seed="3")
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, base)


CASES = [
    {},
    {"interval": 1},
    {"interval": 5, "schedule": "step", "milestones": "7,15", "decay": 0.5},
    {"momentum": 0.9, "momentum_policy": "keep"},
    {"momentum": 0.9, "nesterov": "true", "momentum_policy": "average"},
    {"momentum": 0.5, "momentum_policy": "reset", "partition": "block"},
    {"schedule": "sqrt_nt", "lr": 0.5},
]


# on the GPU: a step schedule and the momentum policies (keep, reset) that
# tests/gpu/test_gpu_mpi.py leaves out
@pytest.mark.parametrize("overrides, device", on_devices(CASES, [CASES[2], CASES[3], CASES[5]]),
                         indirect=["device"])
def test_distributed_run_matches_serial_reference(comm, overrides, device):
    config = small_config(device=device, **overrides)
    _, state = train(config, comm, verbose=False)
    expected = prsgd_reference(config, comm.size)
    np.testing.assert_allclose(host(state.x), expected, rtol=1e-10, atol=1e-12)


def test_heterogeneous_local_steps_match_reference(comm):
    steps = ",".join(str(2 + r) for r in range(comm.size))
    config = small_config(local_steps=steps, interval=3, steps=12)
    summary, state = train(config, comm, verbose=False)
    assert summary.rounds == 4
    assert summary.steps == 4 * (2 + comm.rank)
    np.testing.assert_allclose(state.x, prsgd_reference(config, comm.size), rtol=1e-10, atol=1e-12)


def test_interval_one_is_parallel_minibatch_sgd(comm):
    config = small_config(interval=1, steps=15)
    _, state = train(config, comm, verbose=False)
    np.testing.assert_allclose(state.x, minibatch_sgd_reference(config, comm.size),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("steps,interval", [(23, 4), (24, 4), (7, 1), (5, 8)])
def test_averaging_traffic_is_exactly_floor_t_over_i_rounds_of_d_values(comm, device, steps,
                                                                         interval):
    config = small_config(steps=steps, interval=interval, dtype="float32", device=device)
    summary, state = train(config, comm, verbose=False)
    rows = [r for r in comm.stats.as_rows() if r[1] == "average"]
    rounds = steps // interval
    d = state.x.size
    assert summary.rounds == rounds
    if rounds == 0:
        assert rows == []
    else:
        assert rows == [("allreduce", "average", rounds, rounds * d * 4, pytest.approx(rows[0][4]))]


def test_parameter_buffer_is_never_reallocated(comm, device):
    config = small_config(momentum=0.9, momentum_policy="average", device=device)
    parts = build_run(config, use_device(comm, device))
    state = parts.algorithm.init(parts.workload.x0, comm)
    pointers = [data_pointer(a) for a in (state.x, state.grad, state.momentum)]
    for _ in range(parts.local_steps):
        parts.algorithm.step(state, parts.workload.problem.oracle, comm)
    assert state.x is parts.workload.x0
    assert [data_pointer(a) for a in (state.x, state.grad, state.momentum)] == pointers


def test_every_rank_ends_with_the_same_model_and_learns(comm):
    config = small_config(steps=150, interval=4, lr=0.1, hidden="32", batch_size=16)
    summary, state = train(config, comm, verbose=False)
    gathered = comm.mpi.allgather(state.x.copy())
    for other in gathered:
        np.testing.assert_array_equal(other, gathered[0])
    assert summary.final.accuracy > 0.8  # digits, 10 classes: chance is 0.1
