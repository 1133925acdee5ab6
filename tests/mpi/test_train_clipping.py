"""CELGC and the naive clipping baseline run through ``train()`` (as the command line runs them):
the same models and clip counts as the serial references in tests/reference.py, and the data
partitions by label (dirichlet, similarity) through the config; on CPU, and on the GPU where
the device path differs (compared on host copies)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt import train
from hpcopt.config import build_config
from tests.conftest import host, on_devices
from tests.reference import celgc_reference, naive_clip_reference, worker_parts

pytestmark = pytest.mark.mpi


def small_config(**overrides):
    base = dict(dataset="digits", hidden="12", batch_size="8", steps="23", dtype="float64",
                lr="0.1", interval="4", progress="false", seed="3", algorithm="celgc", gamma="0.15")
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, {k: v for k, v in base.items() if v != "None"})


def reference_inputs(config, size):
    parts = worker_parts(config, size)
    schedule = parts[0].algorithm.lr_at
    return parts[0].workload.x0, [p.workload.problem.oracle for p in parts], schedule


CASES = [
    {},
    {"momentum": 0.9, "nesterov": "true", "weight_decay": 1e-3, "momentum_policy": "average"},
    {"clip_norm": "global", "participation": 0.5, "interval": 3},
    {"partition": "dirichlet", "alpha": 0.3},
    {"partition": "similarity", "similarity": 0.25, "momentum": 0.5},
    # batch norm: its statistics change no step, so the parameters follow the reference
    {"model": "plain_cnn", "hidden": None, "channels": "3,4", "batch_norm": "true", "momentum": 0.5, "gamma": 0.5},
]


# on the GPU: the update rules (the partitions are made on the host before training)
@pytest.mark.parametrize("overrides, device", on_devices(CASES, CASES[:3]), indirect=["device"])
def test_celgc_through_train_matches_the_serial_reference(comm, overrides, device):
    config = small_config(device=device, **overrides)
    summary, state = train(config, comm, verbose=False)
    algo, steps = config.algorithm, config.run.steps
    x0, oracles, schedule = reference_inputs(config, comm.size)
    models, counts = celgc_reference(x0, oracles, steps, algo.interval, lr=schedule, gamma=algo.gamma,
                                     base_lr=algo.lr, momentum=algo.momentum,
                                     nesterov=algo.nesterov, weight_decay=algo.weight_decay,
                                     momentum_policy=algo.momentum_policy,
                                     participation=algo.participation, seed=config.run.seed,
                                     clip_norm=algo.clip_norm)
    # train() ends with the "final" average over every rank
    np.testing.assert_allclose(host(state.x), sum(models) / comm.size, rtol=1e-10, atol=1e-12)
    assert int(state.clip_count) == counts[comm.rank]
    assert summary.clip_fraction == sum(counts) / (steps * comm.size)
    assert 0 < summary.clip_fraction < 1
    assert summary.rounds == -(-steps // algo.interval)


def test_naive_clip_through_train_matches_the_serial_reference(comm, device):
    config = small_config(algorithm="naive_clip", momentum=0.9, weight_decay=1e-3, interval=8,
                          device=device)
    summary, state = train(config, comm, verbose=False)
    x0, oracles, schedule = reference_inputs(config, comm.size)
    model, count = naive_clip_reference(x0, oracles, config.run.steps, lr=schedule, gamma=0.15,
                                        base_lr=config.algorithm.lr, momentum=0.9, weight_decay=1e-3)
    np.testing.assert_allclose(host(state.x), model, rtol=1e-10, atol=1e-12)
    assert int(state.clip_count) == count
    assert summary.clip_fraction == count / config.run.steps
