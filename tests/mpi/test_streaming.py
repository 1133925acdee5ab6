"""Streaming fragments (hpcopt/algorithms/streaming.py) under MPI at any world size, in-process:
the serial float64 reference of tests/reference.py, the state written to a checkpoint and read
back at every tick (reductions in flight included) without changing a bit of the run, and the
traffic of label "fragments" to the byte. The whole-run resume (trace included) is the
``streaming`` case of tests/mpi/test_resume.py."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt import train
from hpcopt.comm import IN_FLIGHT
from hpcopt.comm.costmodel import PROFILES, comm_modelled
from tests.conftest import host
from tests.mpi.test_optimizers import DILOCO, assert_shared, run_in_process, small_config, state_arrays
from tests.reference import streaming_reference

pytestmark = pytest.mark.mpi

# the digits MLP (hidden 12): parameters of 768, 12, 120 and 10 values
CASES = [
    # DiLoCo per fragment, one fragment in flight at a time (tau < H / P), the run ends with
    # a fragment in flight (sent at 14, due at 15)
    {**DILOCO, "fragments": 3, "overlap": 1, "interval": 6, "steps": 14},
    # outer average with a mix: tau = 0 completes within the step
    {"fragments": 2, "fragment_mix": 0.5, "momentum": 0.9, "steps": 13},
    # three fragments in flight at once (tau >= H / P), SlowMo's eta at each fragment's step
    {"algorithm": "slowmo", "slow_momentum": 0.6, "slow_lr": 0.9, "fragments": 4, "overlap": 3,
     "fragment_mix": 0.7, "schedule": "step", "milestones": "7", "decay": 0.5, "steps": 15},
    # FedAdam per fragment (its two moments sliced like the anchor)
    {"outer_optimizer": "fedadam", "outer_lr": 0.02, "outer_momentum": 0.9, "outer_tau": 1e-2, "fragments": 2,
     "overlap": 1, "interval": 4, "steps": 13},
    # one fragment (the whole model), overlapped
    {"outer_optimizer": "sgd", "outer_lr": 1.1, "outer_momentum": 0.5, "overlap": 2, "steps": 11},
    # PR-SGD whose whole-model round overlaps the next 3 steps, delayed averaging (the local
    # progress kept), heavy-ball momentum; the run ends with a round in flight (sent at 12)
    {"overlap": 3, "overlap_rule": "delayed", "interval": 4, "momentum": 0.9, "steps": 14},
    # the delayed rule per fragment, with DiLoCo's outer step and a mix
    {**DILOCO, "fragments": 3, "overlap": 2, "overlap_rule": "delayed", "fragment_mix": 0.7,
     "interval": 6, "steps": 14},
]
DELAYED = 5  # the whole-model round under the delayed rule


@pytest.mark.parametrize("overrides", CASES)
def test_streaming_matches_the_serial_reference(comm, overrides):
    config = small_config(**overrides)
    _, state = train(config, comm, verbose=False)
    np.testing.assert_allclose(host(state.x), streaming_reference(config, comm.size), rtol=1e-10,
                               atol=1e-12)
    assert_shared(comm, state)


@pytest.mark.parametrize("case", [0, 2, DELAYED])
def test_a_checkpoint_at_every_tick_changes_no_bit(comm, shared_dir, case):
    """Every tick of more than a round is checkpointed and resumed, some with reductions in
    flight (one, and three at once; under the delayed rule the whole model's), the last one
    too: the run ends with the same bits in every field."""
    overrides = {**CASES[case], "steps": {0: 8, 2: 6, DELAYED: 9}[case]}
    config = small_config(**overrides)
    state, ticks = run_in_process(config, comm, shared_dir)
    plain, _ = run_in_process(config, comm)
    assert ticks == list(range(1, config.run.steps + 1))
    schedule = config_schedule(config, comm)
    assert max(len(schedule.in_flight(t)) for t in ticks) == (3 if case == 2 else 1)
    assert schedule.in_flight(ticks[-1])  # drained by the final average
    expected, got = state_arrays(plain), state_arrays(state)
    assert sorted(got) == sorted(expected) and "in_flight" in got
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_the_delayed_rule_keeps_the_steps_taken_in_flight(comm):
    """PR-SGD with its round in flight: the delayed rule differs from Streaming DiLoCo's replace
    (which drops the steps taken meanwhile), and sends one iallreduce of the whole model a round,
    none blocking."""
    base = {"overlap": 2, "interval": 4, "steps": 12, "lr": 0.2}
    _, replaced = train(small_config(**base), comm, verbose=False)
    comm.stats.reset()
    _, state = train(small_config(**base, overlap_rule="delayed"), comm, verbose=False)
    assert not np.allclose(host(state.x), host(replaced.x), rtol=1e-6)
    counters = comm.stats.counters
    assert counters[("iallreduce", "fragments")].calls == 12 // 4
    assert counters[("iallreduce", "fragments")].bytes == 3 * state.x.nbytes
    assert "average" not in comm.stats.labels()


def config_schedule(config, comm):
    from hpcopt.build import build_run

    return build_run(config, comm).algorithm.timing


def test_fragments_traffic_matches_the_formulas(comm):
    """Label "fragments": one iallreduce per fragment and sync, of the fragment's bytes, counted
    when it completes (the one in flight at the end by the final drain); no "average" label;
    its seconds in flight are at least those the rank was held. The network model hides the
    reductions behind the seconds between post and wait; the summary gives its seconds a round."""
    steps, interval = 14, 6
    config = small_config(**{**DILOCO, "fragments": 3, "overlap": 2, "interval": interval,
                             "steps": steps, "dtype": "float32", "network": "eth1"})
    summary, state = train(config, comm, verbose=False)
    sizes, offsets = (768, 12, 120 + 10), (0, 2, 4)  # the cuts nearest to 910/3 and 2*910/3
    assert [b - a for a, b in config_schedule(config, comm).bounds] == list(sizes)
    syncs = [len([s for s in range(1, steps + 1) if (s - o) % interval == 0]) for o in offsets]
    counters = comm.stats.counters
    fragments = counters[("iallreduce", "fragments")]
    assert (fragments.calls, fragments.bytes) == (sum(syncs), 4 * sum(n * k for n, k in zip(sizes, syncs)))
    assert (counters[(IN_FLIGHT, "fragments")].calls, counters[(IN_FLIGHT, "fragments")].bytes) == (0, 0)
    assert counters[(IN_FLIGHT, "fragments")].seconds >= fragments.seconds
    assert comm.stats.totals("fragments").seconds == fragments.seconds  # in flight: not spent
    assert "average" not in comm.stats.labels()
    assert counters[("allreduce", "final")].bytes == 4 * state.x.size
    assert summary.average_bytes_per_rank == fragments.bytes
    modelled = comm_modelled(counters, comm.size, PROFILES["eth1"])["fragments"]
    full = sum(k * PROFILES["eth1"].allreduce(4 * n, comm.size) for n, k in zip(sizes, syncs))
    hidden = counters[(IN_FLIGHT, "fragments")].seconds - fragments.seconds
    assert modelled == pytest.approx(max(0.0, full - hidden), abs=1e-12)
    per_round = f"{summary.modelled_seconds / (steps // interval):.4f} s a round"
    assert summary.rounds == steps // interval and per_round in "\n".join(summary.lines())
