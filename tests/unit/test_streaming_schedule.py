"""Streaming fragments without MPI: the cut on parameter boundaries, the schedule of sends and
completions and its bytes in flight, the refusals, and how the Comm's counters and the network
model treat a reduction's seconds in flight."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hpcopt.algorithms.streaming import FragmentSchedule, fragment_bounds
from hpcopt.build import build_algorithm
from hpcopt.comm import IN_FLIGHT, CommStats
from hpcopt.comm.costmodel import PROFILES, comm_modelled
from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from tests.reference import fragment_cuts
from tests.registered import users

DIGITS_MLP = (768, 12, 120, 10)  # the digits MLP with hidden 12


@pytest.mark.parametrize("sizes, fragments, bounds", [
    (DIGITS_MLP, 1, ((0, 910),)),
    (DIGITS_MLP, 2, ((0, 768), (768, 910))),
    (DIGITS_MLP, 3, ((0, 768), (768, 780), (780, 910))),
    (DIGITS_MLP, 4, ((0, 768), (768, 780), (780, 900), (900, 910))),
    ((5,) * 6, 3, ((0, 10), (10, 20), (20, 30))),
    ((1, 1, 100, 1, 1), 2, ((0, 2), (2, 104))),
])
def test_fragments_are_cut_on_the_parameter_boundaries_nearest_to_equal_shares(sizes, fragments, bounds):
    assert fragment_bounds(sizes, fragments) == bounds


def test_the_cut_agrees_with_the_plain_reference_on_random_models():
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = tuple(int(n) for n in rng.integers(1, 50, rng.integers(1, 12)))
        fragments = int(rng.integers(1, len(sizes) + 1))
        assert list(fragment_bounds(sizes, fragments)) == fragment_cuts(sizes, fragments), sizes


def test_more_fragments_than_parameters_is_refused():
    with pytest.raises(HpcoptError, match="fragments 5 is more than the model's 4 parameters"):
        fragment_bounds(DIGITS_MLP, 5)


def test_the_schedule_sends_at_the_offsets_and_counts_the_bytes_in_flight():
    bounds = fragment_bounds(DIGITS_MLP, 3)  # 768, 12 and 130 values; offsets 0, 2, 4 of H = 6
    sends = [FragmentSchedule(bounds, 6, 0, 1.0).sent_at(s) for s in range(13)]
    assert sends == [None, None, 1, None, 2, None, 0, None, 1, None, 2, None, 0]
    one_at_a_time = FragmentSchedule(bounds, 6, 2, 1.0)  # tau = H // P
    assert one_at_a_time.in_flight(7) == [(0, 6)] and one_at_a_time.in_flight(8) == [(1, 8)]
    assert one_at_a_time.peak_bytes(12, 4) == 4 * 768
    assert one_at_a_time.peak_bytes(5, 4) == 4 * 130  # the first round: fragment 0 not sent yet
    blocking = FragmentSchedule(bounds, 6, 0, 1.0)
    assert blocking.in_flight(6) == [] and blocking.peak_bytes(12, 8) == 8 * 768
    overlapping = FragmentSchedule(bounds, 6, 3, 1.0)  # tau > H // P: two at once
    assert overlapping.in_flight(8) == [(0, 6), (1, 8)]
    assert overlapping.peak_bytes(12, 4) == 4 * (130 + 768)  # 2 sent at 4, 0 at 6
    whole = FragmentSchedule(fragment_bounds(DIGITS_MLP, 1), 6, 1, 1.0)  # DiLoCo's round
    assert whole.peak_bytes(12, 4) == 4 * 910


def small(**overrides):
    values = {"dataset": "digits", "interval": "4", **{k: str(v) for k, v in overrides.items()}}
    return build_config(None, values)


@pytest.mark.parametrize("overrides, message", [
    ({"fragments": 0}, "fragments must be >= 1, got 0"),
    ({"fragments": 5}, "fragments 5 must be <= interval 4"),
    ({"overlap": 4}, "overlap must be in [0, interval 4), got 4"),
    ({"overlap": -1}, "overlap must be in [0, interval 4), got -1"),
    ({"fragment_mix": 0}, "fragment_mix must be in (0, 1], got 0"),
    ({"fragment_mix": 1.5}, "fragment_mix must be in (0, 1], got 1.5"),
    ({"overlap_rule": "eager"}, "unknown overlap_rule 'eager' (choose from replace, delayed)"),
    ({"overlap_rule": "delayed"}, "overlap_rule delayed needs overlap > 0"),
    ({"fragments": 2, "overlap_rule": "delayed"}, "overlap_rule delayed needs overlap > 0"),
    ({"overlap": 1, "overlap_rule": "delayed", "wire": "bfloat16"}, "wire is not built with"),
    ({"fragments": 2, "local_steps": "2,3"}, "local_steps is not built with fragments, overlap or "
     "fragment_mix: every rank sends a fragment at the same step"),
    ({"fragments": 2, "overlap": 1, "wire": "int8"}, "wire is not built with fragments, overlap or "
     "fragment_mix: only with overlap 0: a compressed fragment's reduction is blocking"),
    ({"overlap": 1, "momentum": 0.9, "momentum_policy": "average"}, "momentum_policy is not built"),
    ({"algorithm": "diloco", "fragment_mix": 0.5, "second_moment_policy": "reset"},
     "second_moment_policy is not built"),
    ({"algorithm": "celgc", "participation": 0.5, "fragments": 2, "overlap": 1},
     "participation is not built with fragments, overlap or fragment_mix: only with overlap 0"),
    ({"device": "gpu", "overlap": 1}, "fragments, overlap and fragment_mix are built for device cpu only"),
])
def test_streaming_options_out_of_range_or_not_built_are_refused(overrides, message):
    with pytest.raises(HpcoptError) as error:
        small(**overrides)
    assert message in str(error.value)


@pytest.mark.parametrize("overrides, message", [
    ({"wire": "int8", "node_round": "ring"}, "unknown node_round 'ring' (choose from leader, rails, flat"),
    ({"node_round": "rails"}, "node_round applies to a compressing wire (bfloat16, float16, int8) or to "
     "fragments without a wire, not to whole-model rounds without a wire"),
    ({"wire": "float32", "node_round": "flat"}, "not to wire float32"),
    ({"fragments": 2, "node_round": "leader"}, "node_round leader is not built for fragments without a "
     "wire: rails or flat"),
])
def test_node_rounds_not_built_are_refused(overrides, message):
    with pytest.raises(HpcoptError) as error:
        small(**overrides)
    assert message in str(error.value)


@pytest.mark.parametrize("overrides, rails", [
    ({"wire": "int8", "node_round": "rails"}, False), ({"wire": "bfloat16", "fragments": 2}, False),
    ({"fragments": 2, "overlap": 1, "node_round": "rails"}, True),
    ({"fragments": 2, "node_round": "flat"}, False), ({"fragments": 2}, False),
])
def test_node_rounds_that_are_built_build(overrides, rails):
    algorithm = build_algorithm(small(**overrides), 4, 910)
    if algorithm.wire:
        assert algorithm.reducer.node_round == overrides.get("node_round", "leader")  # '': the wire's own
    if algorithm.streaming:
        assert dataclasses.replace(algorithm, parameter_sizes=DIGITS_MLP).timing.rails == rails


def test_every_algorithm_with_fragments_builds_streamed():
    assert {"prsgd", "diloco", "slowmo", "celgc"} <= set(users("fragments"))
    for algorithm in users("fragments"):
        assert small(algorithm=algorithm, fragments=2, overlap=1, fragment_mix=0.5).algorithm.fragments == 2


def test_seconds_in_flight_are_not_seconds_spent_and_the_model_hides_behind_them():
    stats = CommStats()
    stats.record_overlapped("iallreduce", "fragments", 4000, held=0.002, hidden=0.010)
    stats.record_overlapped("iallreduce", "fragments", 4000, held=0.001, hidden=0.0)
    stats.record("allreduce", "final", 8000, 0.003)
    assert stats.totals("fragments").seconds == pytest.approx(0.003)  # held, not in flight
    assert stats.totals(op=IN_FLIGHT).seconds == pytest.approx(0.013)
    assert stats.totals().seconds == pytest.approx(0.006)
    assert (stats.totals("fragments").calls, stats.totals("fragments").bytes) == (2, 8000)
    eth1 = PROFILES["eth1"]
    modelled = comm_modelled(stats.counters, 4, eth1)
    assert modelled["fragments"] == pytest.approx(max(0.0, 2 * eth1.allreduce(4000, 4) - 0.010))
    assert modelled["final"] == pytest.approx(eth1.allreduce(8000, 4))
    hidden = CommStats()
    hidden.record_overlapped("iallreduce", "fragments", 4000, held=0.0, hidden=10.0)
    assert comm_modelled(hidden.counters, 4, eth1)["fragments"] == 0.0  # wholly overlapped


def test_delay_mode_sleeps_what_the_overlap_does_not_hide():
    stats = CommStats(delay=lambda op, nbytes, ranks: 0.05)
    stats.record_overlapped("iallreduce", "fragments", 8, held=0.0, hidden=0.02)
    assert stats.totals("fragments").seconds == pytest.approx(0.03)
    stats.record_overlapped("iallreduce", "fragments", 8, held=0.0, hidden=1.0)
    assert stats.totals("fragments").seconds == pytest.approx(0.03)  # hidden: no sleep
