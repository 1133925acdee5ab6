"""Pipeline schedules as data, checked without MPI: order, in-flight bound, simulated execution."""

import pytest

from hpcopt.errors import HpcoptError
from hpcopt.pipeline import (
    BACKWARD,
    FORWARD,
    KINDS,
    ideal_bubble,
    max_in_flight,
    schedule,
    schedules,
    simulate,
)

SMALL = [(d, k) for d in range(1, 9) for k in (1, 2, 3, 7, 8, 9, 16, 33)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stages,samples", SMALL)
def test_each_sample_once_forward_in_order_and_before_its_backward(kind, stages, samples):
    for stage in range(stages):
        ops = schedule(kind, stage, stages, samples)
        forwards = [k for op, k in ops if op == FORWARD]
        backwards = [k for op, k in ops if op == BACKWARD]
        assert forwards == list(range(samples))
        assert backwards == list(range(samples))
        assert all(ops.index((FORWARD, k)) < ops.index((BACKWARD, k)) for k in range(samples))


@pytest.mark.parametrize("stages,samples", SMALL)
def test_in_flight_bounds(stages, samples):
    for stage in range(stages):
        assert max_in_flight(schedule("gpipe", stage, stages, samples)) == samples
        peak = max_in_flight(schedule("1f1b", stage, stages, samples))
        assert peak == min(samples, stages - stage)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stages,samples", SMALL)
def test_slot_k_mod_n_is_never_shared_by_two_samples_in_flight(kind, stages, samples):
    for stage in range(stages):
        ops = schedule(kind, stage, stages, samples)
        n, busy = max_in_flight(ops), {}
        for op, k in ops:
            if op == FORWARD:
                assert k % n not in busy
                busy[k % n] = k
            else:
                assert busy.pop(k % n) == k


@pytest.mark.parametrize("kind", KINDS)
def test_no_deadlock_and_ideal_makespan_for_every_depth_up_to_8_and_k_up_to_128(kind):
    for stages in range(1, 9):
        for samples in range(1, 129):
            sim = simulate(schedules(kind, stages, samples))
            assert sim.makespan == 2 * (samples + stages - 1)
            for stage in range(stages):
                assert sim.bubble(stage) == pytest.approx(ideal_bubble(stages, samples))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stages,samples", [(4, 6), (3, 1), (8, 16)])
def test_simulated_execution_respects_cross_stage_dependencies(kind, stages, samples):
    f, b = 1.0, 2.0
    sim = simulate(schedules(kind, stages, samples), forward_time=f, backward_time=b)
    for s in range(stages):
        for k in range(samples):
            if s > 0:
                assert sim.forward_finish[s][k] >= sim.forward_finish[s - 1][k] + f
            if s < stages - 1:
                assert sim.backward_finish[s][k] >= sim.backward_finish[s + 1][k] + b
            assert sim.backward_finish[s][k] >= sim.forward_finish[s][k] + b
    # both schedules take (K + Delta - 1)(F + B) when a backward costs two forwards
    assert sim.makespan == (samples + stages - 1) * (f + b)


def test_simulation_detects_deadlock_and_malformed_schedules():
    crossed = [[(FORWARD, 0), (BACKWARD, 0), (FORWARD, 1), (BACKWARD, 1)],
               [(FORWARD, 1), (FORWARD, 0), (BACKWARD, 0), (BACKWARD, 1)]]
    with pytest.raises(RuntimeError, match="deadlock"):
        simulate(crossed)
    with pytest.raises(RuntimeError, match="deadlock"):
        simulate([[(BACKWARD, 0), (FORWARD, 0)]])
    with pytest.raises(RuntimeError, match="not run"):
        simulate([[(FORWARD, 0)], [(FORWARD, 0), (BACKWARD, 0)]])


def test_ideal_bubble_and_bad_arguments():
    assert ideal_bubble(1, 5) == 0
    assert ideal_bubble(2, 16) == pytest.approx(1 / 17)
    with pytest.raises(HpcoptError, match="unknown pipeline schedule"):
        schedule("zigzag", 0, 2, 4)
    with pytest.raises(ValueError):
        schedule("gpipe", 2, 2, 4)
    with pytest.raises(ValueError):
        schedule("1f1b", 0, 2, 0)
