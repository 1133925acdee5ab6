"""SlowMo, the algorithm added as one file (hpcopt/algorithms/slowmo.py), under MPI at any world
size: the serial float64 reference, the PR-SGD identity at beta = 0, alpha = 1, and bad options
refused. Its bitwise resume is a case of tests/mpi/test_resume.py."""

import numpy as np
import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from tests.reference import prsgd_reference
from tests.registered import refused
from tests.runs import fresh_train

pytestmark = pytest.mark.mpi


def small_config(**overrides):
    base = dict(dataset="digits", hidden="12", batch_size="8", steps="22", dtype="float64",
                lr="0.1", interval="4", progress="false", seed="3", algorithm="slowmo")
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, base)


@pytest.mark.parametrize("overrides", [
    {},
    {"slow_momentum": 0.8, "slow_lr": 0.7, "momentum": 0.9, "momentum_policy": "average"},
    {"schedule": "step", "milestones": "6,13", "decay": 0.5, "nesterov": "true", "momentum": 0.5},
    {"interval": 1, "slow_momentum": 0.3},
])
def test_distributed_slowmo_matches_the_serial_reference(comm, overrides):
    config = small_config(**overrides)
    summary, state = fresh_train(config)
    assert summary.rounds == 22 // config.algorithm.interval
    np.testing.assert_allclose(state.x, prsgd_reference(config, comm.size), rtol=1e-10, atol=1e-12)
    everyone = comm.mpi.allgather((state.anchor, state.slow_buffer))
    for anchor, slow in everyone:  # u and the round's start are the same on every rank
        np.testing.assert_array_equal(anchor, everyone[0][0])
        np.testing.assert_array_equal(slow, everyone[0][1])


def test_no_slow_momentum_and_unit_slow_step_is_prsgd(comm):
    _, slowmo = fresh_train(small_config(slow_momentum=0, slow_lr=1, momentum=0.9))
    _, prsgd = fresh_train(small_config(algorithm="prsgd", momentum=0.9))
    np.testing.assert_allclose(slowmo.x, prsgd.x, rtol=1e-12, atol=1e-14)
    _, moving = fresh_train(small_config(slow_momentum=0.5, momentum=0.9))
    assert not np.allclose(moving.x, prsgd.x)  # beta > 0 changes the trajectory


@pytest.mark.parametrize("overrides, message", [
    ({"slow_momentum": 1}, r"slow_momentum must be in \[0, 1\)"),
    ({"slow_lr": 0}, "slow_lr must be > 0"),
    ({"algorithm": "prsgd", "slow_lr": 2}, refused("slow_lr", "prsgd")),
])
def test_bad_options_are_user_errors(overrides, message):
    with pytest.raises(HpcoptError, match=message):
        small_config(**overrides)
