"""The cost model of the wall clock per step (hpcopt.comm.costmodel.StepModel): a step's compute
plus the modelled seconds of the calls, the compute fitted to a run that communicates nothing,
and the trace window that leaves the start-up out."""

import math

import numpy as np
import pytest

from hpcopt.comm.costmodel import StepModel, fit_compute, fit_round_compute, trace_window
from hpcopt.errors import HpcoptError


def test_the_wall_is_the_steps_compute_plus_the_calls_modelled_seconds():
    model = StepModel(compute=0.02)
    assert model.wall(10, 0.5) == pytest.approx(0.2 + 0.5)
    assert model.per_step(10, 0.5) == pytest.approx(0.07)
    assert math.isnan(model.per_step(0, 0.5))
    with pytest.raises(HpcoptError, match="compute seconds"):
        StepModel(-1.0)
    with pytest.raises(HpcoptError, match="compute seconds"):
        StepModel(math.inf)


def test_the_compute_is_fitted_to_a_run_less_its_calls():
    assert fit_compute(wall=3.0, measured_comm=1.0, steps=100).compute == pytest.approx(0.02)
    assert fit_compute(wall=1.0, measured_comm=1.5, steps=10).compute == 0.0  # never negative
    with pytest.raises(HpcoptError, match="steps"):
        fit_compute(1.0, 0.0, 0)


def test_the_window_starts_at_the_first_row():
    steps = np.array([4, 8, 12, 16])
    wall = np.array([1.0, 1.5, 2.0, 2.6])
    modelled = np.array([0.3, 0.4, 0.5, 0.6])
    assert trace_window(steps, wall, modelled) == pytest.approx((12.0, 1.6, 0.3))
    assert trace_window(steps, wall, modelled, first=2) == pytest.approx((4.0, 0.6, 0.1))
    with pytest.raises(HpcoptError, match="more than 4 rows"):
        trace_window(steps, wall, modelled, first=3)


def test_a_window_of_a_run_predicted_from_its_parts():
    """A synthetic run: 0.05 s of compute a step and a 0.2 s average every 4 steps, traced every
    4 steps; the model with the fitted compute gives the run's wall back."""
    steps = np.arange(4, 33, 4)
    wall = 0.05 * steps + 0.2 * (steps // 4) + 1.0  # 1 s of start-up before the first step
    modelled = 0.2 * (steps // 4)
    n, seconds, priced = trace_window(steps, wall, modelled)
    assert StepModel(0.05).per_step(n, priced) == pytest.approx(seconds / n)


def test_a_compressed_rounds_seconds_outside_its_calls_count_once_a_round():
    model = StepModel(compute=0.02, round_compute=0.1)
    assert model.wall(16, 0.5, rounds=2) == pytest.approx(0.32 + 0.2 + 0.5)
    assert model.per_step(16, 0.5) == pytest.approx((0.32 + 0.5) / 16)  # no rounds: no codec
    assert fit_round_compute(0.3, 0.1) == pytest.approx(0.2)
    assert fit_round_compute(0.1, 0.3) == 0.0  # calls modelled longer than the round: nothing outside
    with pytest.raises(HpcoptError, match="a round's compute"):
        StepModel(0.02, round_compute=-0.1)
