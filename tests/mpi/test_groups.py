"""Two-level averaging periods (hpcopt/algorithms/groups.py) under MPI at any world size: the
serial float64 reference of tests/reference.py with the outer optimizers and the shared-memory
path, a checkpoint at every tick changing no bit, and the traffic per label with its modelled
seconds. Groups are of 2 ranks on an even world (of 1 rank otherwise: 2 does not divide it);
at 2 ranks the group is the world and a group round is a global average, checked bit for bit
against PR-SGD averaging every group_interval steps."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt import train
from hpcopt.comm import GROUP_LABEL
from hpcopt.comm.costmodel import comm_modelled, get_profile
from tests.conftest import host, on_devices
from tests.mpi.test_optimizers import DILOCO, assert_shared, run_in_process, small_config, state_arrays
from tests.reference import celgc_reference, prsgd_reference, streaming_reference, worker_parts

pytestmark = pytest.mark.mpi


def group_size(size: int) -> int:
    return 2 if size % 2 == 0 else 1


CASES = [
    {"momentum": 0.9, "interval": 4, "group_interval": 2},  # T = 14: a partial last round with a group round
    {**DILOCO, "momentum_policy": "average", "interval": 6, "group_interval": 2, "steps": 12},
    {"algorithm": "slowmo", "slow_momentum": 0.6, "interval": 4, "group_interval": 1, "steps": 8},
    {"outer_optimizer": "sgd", "outer_lr": 1.2, "outer_momentum": 0.5, "interval": 4,
     "group_interval": 2, "averaging": "shm"},
]


# on the GPU: the group's Comm takes this one's device transport
@pytest.mark.parametrize("overrides, device", on_devices(CASES, CASES[1:2]), indirect=["device"])
def test_two_level_periods_match_the_serial_reference(comm, overrides, device):
    config = small_config(group_size=group_size(comm.size), device=device, **overrides)
    _, state = train(config, comm, verbose=False)
    np.testing.assert_allclose(host(state.x), prsgd_reference(config, comm.size), rtol=1e-10,
                               atol=1e-12)
    assert_shared(comm, state)
    if overrides.get("averaging") == "shm" and comm.size > 1:
        assert comm.group(group_size(comm.size), GROUP_LABEL).averager is not None  # the node's window


STREAMED = [
    # DiLoCo per fragment with group rounds between, one fragment in flight at a time
    {**DILOCO, "fragments": 3, "overlap": 1, "interval": 6, "group_interval": 2, "steps": 14},
    # a group round after every step that ends no round, fragments applied within their step
    {"momentum": 0.9, "fragments": 2, "fragment_mix": 0.5, "interval": 4, "group_interval": 1,
     "steps": 13},
]


@pytest.mark.parametrize("overrides", STREAMED)
def test_group_rounds_between_streamed_fragments_match_the_serial_reference(comm, overrides):
    """Two-level periods with Streaming DiLoCo: each model its group's mean after steps
    s % I1 == 0, s % I != 0, before the fragments' turn (tests/reference.py)."""
    config = small_config(group_size=group_size(comm.size), **overrides)
    _, state = train(config, comm, verbose=False)
    np.testing.assert_allclose(host(state.x), streaming_reference(config, comm.size), rtol=1e-10,
                               atol=1e-12)
    assert_shared(comm, state)


@pytest.mark.parametrize("overrides", [
    {"momentum": 0.9, "interval": 4, "group_interval": 2},
    {**DILOCO, "interval": 6, "group_interval": 3, "participation": 0.5, "clip_norm": "global",
     "steps": 12},
])
def test_celgc_inside_two_level_periods_matches_the_serial_reference(comm, overrides):
    """Local clipping with group rounds at the start of steps t % I1 == 0 that start no round
    (every group member, whatever the global round's participation): tests/reference.py."""
    config = small_config(algorithm="celgc", gamma=1.5 * float(overrides.get("lr", 0.1)),
                          group_size=group_size(comm.size), **overrides)
    summary, state = train(config, comm, verbose=False)
    algo, parts = config.algorithm, worker_parts(config, comm.size)
    inner = {key: getattr(algo, key) for key in (
        "momentum", "nesterov", "weight_decay", "momentum_policy", "inner_optimizer")}
    models, counts = celgc_reference(
        parts[0].workload.x0, [p.workload.problem.oracle for p in parts], config.run.steps,
        algo.interval, lr=parts[0].algorithm.lr_at, gamma=algo.gamma, base_lr=algo.lr,
        participation=algo.participation, seed=config.run.seed, clip_norm=algo.clip_norm,
        outer_optimizer=algo.outer_optimizer, outer_lr=algo.outer_lr,
        outer_momentum=algo.outer_momentum, finish=True, group_size=algo.group_size,
        group_interval=algo.group_interval, **inner)
    np.testing.assert_allclose(host(state.x), models[comm.rank], rtol=1e-10, atol=1e-12)
    assert int(state.clip_count) == counts[comm.rank]
    assert 0 < summary.clip_fraction < 1
    if group_size(comm.size) > 1:  # one group round at each step that starts none of the I rounds
        steps, every = config.run.steps, algo.group_interval
        expected = sum(1 for t in range(steps) if t % algo.interval and t % every == 0)
        assert comm.stats.totals(GROUP_LABEL).calls == expected


@pytest.mark.parametrize("overrides", [
    {**STREAMED[0], "steps": 8},
    {"algorithm": "celgc", "gamma": 0.15, "momentum": 0.9, "interval": 4, "group_interval": 2,
     "steps": 7},  # group rounds and fragments in flight across the checkpoints
    # ticks after group rounds, at global rounds and mid-round after outer steps
    {**DILOCO, "second_moment_policy": "reset", "interval": 4, "group_interval": 2, "steps": 7},
    {"algorithm": "slowmo", "momentum": 0.9, "interval": 2, "group_interval": 1, "steps": 5},
])
def test_a_checkpoint_at_every_tick_changes_no_bit(comm, shared_dir, overrides):
    config = small_config(group_size=group_size(comm.size), **overrides)
    state, ticks = run_in_process(config, comm, shared_dir)
    plain, _ = run_in_process(config, comm)
    assert ticks == list(range(1, config.run.steps + 1))
    expected, got = state_arrays(plain), state_arrays(state)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_group_rounds_cost_their_formula_and_are_modelled_on_the_group(comm):
    """T = 14, I = 4, I1 = 2: 3 rounds with one group round each, and one more in the partial
    last round; each a float32 allreduce of d values over G ranks."""
    steps, interval, every, g = 14, 4, 2, group_size(comm.size)
    config = small_config(steps=steps, interval=interval, group_interval=every, group_size=g,
                          dtype="float32", network="eth10")
    summary, state = train(config, comm, verbose=False)
    d = state.x.size
    rows = {(op, label): (calls, nbytes) for op, label, calls, nbytes, _ in comm.stats.as_rows()}
    group_rounds = (steps // interval) * (interval // every - 1) + (steps % interval) // every
    assert rows["allreduce", GROUP_LABEL] == (group_rounds, group_rounds * d * 4)
    assert rows["allreduce", "average"] == (steps // interval, steps // interval * d * 4)
    assert comm.stats.ranks == {GROUP_LABEL: g}
    eth10 = get_profile("eth10")
    modelled = comm_modelled(comm.stats.counters, comm.size, eth10, label_ranks=comm.stats.ranks)
    assert modelled[GROUP_LABEL] == pytest.approx(group_rounds * eth10.allreduce(d * 4, g), rel=1e-12)
    assert (modelled[GROUP_LABEL] == 0) == (g == 1)
    assert summary.modelled_per_round == pytest.approx(
        {"average": eth10.allreduce(d * 4, comm.size), GROUP_LABEL: eth10.allreduce(d * 4, g)}, rel=1e-12)
    assert f"{GROUP_LABEL} {1e3 * eth10.allreduce(d * 4, g):.3f} ms" in "\n".join(summary.lines())
    assert summary.rounds == steps // interval
    assert (summary.group_rounds, summary.group_bytes_per_rank) == (group_rounds, group_rounds * d * 4)


def test_groups_of_the_whole_world_are_prsgd_at_the_group_interval_bit_for_bit(comm):
    if group_size(comm.size) != comm.size and comm.size > 1:
        pytest.skip("the groups are not the world at this size")
    options = {"momentum": 0.9, "inner_optimizer": "sgd", "steps": 12}
    _, two_level = train(small_config(interval=6, group_interval=2, group_size=comm.size, **options),
                         comm, verbose=False)
    _, prsgd = train(small_config(interval=2, **options), comm, verbose=False)
    np.testing.assert_array_equal(two_level.x, prsgd.x)
