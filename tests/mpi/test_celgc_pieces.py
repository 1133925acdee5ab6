"""CELGC as pieces of PR-SGD's one round, under MPI at any world size: with ``--wire``,
``--local-steps`` and ``--fragments`` (each refused before), through ``train()``, equal to an
independent serial reference of the composed rule (tests/reference.py:
``celgc_pieces_reference``, ``streaming_reference`` with the clipped step); partial
participation as an option of every round's reducer (PR-SGD's too, plain or through a wire);
and a checkpoint written and read back at every tick changing no bit."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt import train
from tests.mpi.test_optimizers import (
    DILOCO,
    assert_shared,
    heterogeneous,
    run_in_process,
    small_config,
    state_arrays,
)
from tests.reference import celgc_pieces_reference, prsgd_reference, streaming_reference

pytestmark = pytest.mark.mpi

CELGC = {"algorithm": "celgc", "gamma": 0.15, "steps": 16}


def tolerance(config) -> float:
    """float32 through the wire is an MPI sum in MPI's order: to float32 rounding."""
    return 1e-6 if config.algorithm.wire == "float32" else 1e-10


CASES = [
    # the reference against the pieces without the new pairs (CELGC as it was)
    {"momentum": 0.9, "momentum_policy": "average", "participation": 0.5, "steps": 15},
    {**DILOCO, "gamma": 0.014, "clip_norm": "global"},
    # the wire: the models (average) or the pseudo-gradients (an anchor) through it, over
    # each round's participants (the others send nothing and keep their error feedback)
    {"wire": "int8", "momentum": 0.9},
    {"wire": "bfloat16", **DILOCO, "gamma": 0.018, "participation": 0.5},
    {"wire": "int8", "participation": 0.5, "clip_norm": "global", "steps": 14},
    {"wire": "float32", "outer_optimizer": "sgd", "outer_lr": 1.2, "outer_momentum": 0.5},
    # per-rank round lengths: each rank's round before its steps t % I_i == 0
    {"local_steps": "RANKS", "interval": 3, "steps": 12, "momentum": 0.5},
    {"local_steps": "RANKS", "interval": 3, "steps": 12, **DILOCO, "gamma": 0.018,
     "participation": 0.5, "wire": "int8"},
    # slowmo's outer step reads eta: the lr at the previous round's last nominal step
    {"outer_optimizer": "slowmo", "outer_lr": 0.9, "outer_momentum": 0.6, "schedule": "step",
     "milestones": "6", "decay": 0.5, "wire": "bfloat16", "steps": 16},
    {"outer_optimizer": "slowmo", "outer_lr": 0.9, "outer_momentum": 0.6, "schedule": "step",
     "milestones": "5", "decay": 0.5, "local_steps": "RANKS", "interval": 3, "steps": 12},
]


def celgc_config(size: int, **overrides):
    options = {**CELGC, **overrides}
    if options.get("local_steps") == "RANKS":
        options["local_steps"] = heterogeneous(size)
    return small_config(**options)


@pytest.mark.parametrize("overrides", CASES)
def test_celgc_with_the_rounds_pieces_matches_the_serial_reference(comm, overrides):
    config = celgc_config(comm.size, **overrides)
    summary, state = train(config, comm, verbose=False)
    model, counts = celgc_pieces_reference(config, comm.size)
    np.testing.assert_allclose(state.x, model, rtol=tolerance(config), atol=tolerance(config))
    assert int(state.clip_count) == counts[comm.rank]
    assert 0 < summary.clip_fraction < 1
    assert_shared(comm, state)
    if config.algorithm.wire:
        assert np.any(state.wire_error != 0)


@pytest.mark.parametrize("overrides", [
    {"fragments": 2, "momentum": 0.9},
    {"fragments": 3, "overlap": 1, "fragment_mix": 0.5, **DILOCO, "gamma": 0.014, "interval": 6,
     "clip_norm": "global"},
    # blocking fragments: through the wire, over each round's participants
    {"fragments": 2, "wire": "int8", "participation": 0.5, **DILOCO, "gamma": 0.018},
])
def test_celgc_with_fragments_matches_the_streaming_reference_with_clipped_steps(comm, overrides):
    config = celgc_config(comm.size, **overrides)
    summary, state = train(config, comm, verbose=False)
    np.testing.assert_allclose(state.x, streaming_reference(config, comm.size), rtol=1e-10,
                               atol=1e-10)
    assert 0 < summary.clip_fraction < 1


@pytest.mark.parametrize("overrides", [
    {"participation": 0.5, "momentum": 0.9, "momentum_policy": "average"},
    {"participation": 0.5, "wire": "int8", **DILOCO},
    {"participation": 0.7, "algorithm": "slowmo", "slow_momentum": 0.6, "local_steps": "RANKS",
     "interval": 3, "steps": 12},
])
def test_partial_participation_is_an_option_of_every_round(comm, overrides):
    if overrides.get("local_steps") == "RANKS":
        overrides = {**overrides, "local_steps": heterogeneous(comm.size)}
    config = small_config(**overrides)
    _, state = train(config, comm, verbose=False)
    np.testing.assert_allclose(state.x, prsgd_reference(config, comm.size), rtol=1e-10, atol=1e-10)
    assert_shared(comm, state)


@pytest.mark.parametrize("overrides", [
    {"wire": "int8", "participation": 0.5, **DILOCO, "gamma": 0.018, "interval": 2, "steps": 6},
    {"local_steps": "RANKS", "interval": 3, "steps": 6, "momentum": 0.9},
    {"fragments": 2, "overlap": 1, "momentum": 0.9, "interval": 2, "steps": 6},
])
def test_a_checkpoint_at_every_tick_changes_no_bit(comm, shared_dir, overrides):
    config = celgc_config(comm.size, **overrides)
    state, ticks = run_in_process(config, comm, shared_dir)
    plain, _ = run_in_process(config, comm)
    steps, algo = config.run.steps, config.algorithm
    assert ticks == list(range(1, (steps // algo.interval if algo.local_steps else steps) + 1))
    expected, got = state_arrays(plain), state_arrays(state)
    assert "clip_count" in got and sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
