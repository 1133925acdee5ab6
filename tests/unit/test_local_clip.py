"""CELGC and the naive baseline: validation, the participant draw, the clipped step size."""

import math

import numpy as np
import pytest

from hpcopt.algorithms.local_clip import LocalClip, NaiveParallelClip
from hpcopt.algorithms.participation import Participating, participants
from hpcopt.algorithms.reducers import PLAIN, WireMean
from hpcopt.errors import HpcoptError

LR = {"lr": 0.5}
STEP = {"lr": 2.0, "schedule": "step", "decay": 0.1, "milestones": (10,)}


@pytest.mark.parametrize("kwargs, message", [
    ({"gamma": 0.0}, "gamma must be > 0"),
    ({"gamma": -1.0}, "gamma must be > 0"),
    ({"gamma": math.nan}, "gamma must be > 0"),
    ({"interval": 0}, "interval I must be >= 1"),
    ({"participation": 0.0}, r"participation fraction must be in \(0, 1\]"),
    ({"participation": 1.5}, r"participation fraction must be in \(0, 1\]"),
    ({"clip_norm": "max"}, "unknown clipping norm 'max'"),
    ({"momentum": 1.0}, r"momentum must be in \[0, 1\)"),
    ({"nesterov": True}, "nesterov needs momentum"),
    ({"weight_decay": -0.1}, "weight_decay must be >= 0"),
    ({"momentum_policy": "sum"}, "unknown momentum_policy 'sum'"),
    ({"seed": -1}, "seed must be >= 0"),
])
def test_bad_hyper_parameters_are_user_errors(kwargs, message):
    kwargs = {"gamma": 1.0, **kwargs}
    with pytest.raises(HpcoptError, match=message):
        LocalClip(**LR, **kwargs)


def test_bad_step_size_is_a_user_error_and_the_baseline_validates_too():
    with pytest.raises(HpcoptError, match="lr must be > 0"):
        LocalClip(lr=0.0, gamma=1.0)
    with pytest.raises(HpcoptError, match="gamma must be > 0"):
        NaiveParallelClip(**LR, gamma=0.0)
    assert LocalClip(**LR, gamma=math.inf).gamma == math.inf


def test_step_size_is_min_of_eta_and_gamma_over_norm_and_gamma_decays_with_eta():
    algorithm = LocalClip(**STEP, gamma=1.0)
    assert algorithm.step_size(0, 0.1) == 2.0                     # threshold gamma/eta = 0.5
    assert algorithm.step_size(0, 4.0) == pytest.approx(0.25)     # gamma / ||g||
    assert algorithm.step_size(10, 0.1) == pytest.approx(0.2)     # eta decayed, not clipped
    assert algorithm.step_size(10, 4.0) == pytest.approx(0.025)   # gamma decayed with eta
    assert algorithm.step_size(0, 0.0) == 2.0                     # + 1e-10: no division by zero
    assert LocalClip(**LR, gamma=math.inf).step_size(3, 1e30) == 0.5


@pytest.mark.parametrize("norm_dtype", [np.float32, np.float64])
def test_a_device_norm_gives_the_same_step_size_without_leaving_the_device(xp, norm_dtype):
    """On the GPU the norm stays a 0-d device array (no transfer a step): the step size must be
    the float rule's value exactly, for a float32 model's norm too."""
    algorithm = LocalClip(**STEP, gamma=1.0)
    for t, value in [(0, 0.1), (0, 4.0), (10, 4.0), (0, 0.0), (3, 1.7)]:
        norm = xp.asarray(value, dtype=norm_dtype)
        size = algorithm.step_size(t, norm)
        assert type(size) is (float if xp is np else type(norm))
        assert float(size) == algorithm.step_size(t, float(norm_dtype(value)))


@pytest.mark.parametrize("fraction, size, count", [(0.5, 4, 2), (0.5, 3, 2), (0.7, 10, 7),
                                                   (0.01, 5, 1), (1.0, 6, 6), (0.99, 6, 6)])
def test_participants_are_ceil_fraction_n_distinct_ranks(fraction, size, count):
    draws = [participants(fraction, 3, r, size) for r in range(20)]
    assert all(d.size == count and np.unique(d).size == count for d in draws)
    assert all(0 <= d.min() and d.max() < size and np.all(np.diff(d) > 0) for d in draws)
    assert all(np.array_equal(d, participants(fraction, 3, r, size)) for r, d in enumerate(draws))
    if 0 < count < size:
        assert len({tuple(d) for d in draws}) > 1  # a new subset each round


@pytest.mark.parametrize("algorithm", ["celgc", "prsgd", "diloco", "slowmo"])
def test_participation_is_an_option_of_every_rounds_reducer(algorithm):
    """The reducer of a round over a subset wraps the plain mean or the wire; at participation 1
    it is the reducer itself (nothing changes)."""
    from hpcopt.algorithms.registration import registry

    def reducer(**options):
        return registry()[algorithm](lr=0.5, seed=3, **options).reducer

    assert reducer() is PLAIN
    assert reducer(participation=0.5) == Participating(PLAIN, 0.5, 3)
    assert reducer(participation=0.5, wire="int8") == Participating(WireMean("int8"), 0.5, 3)


@pytest.mark.parametrize("options, message", [
    ({"clip_norm": "global", "local_steps": (2, 3)}, "clip_norm global applies only when every rank"),
    ({"participation": 0.5, "fragments": 2, "overlap": 1}, "participation is not built with fragments"),
])
def test_the_pairs_that_cannot_make_sense_stay_refused(options, message):
    with pytest.raises(HpcoptError, match=message):
        LocalClip(**LR, gamma=1.0, **options)


def test_participation_is_refused_with_a_registered_reducer_of_ones_own():
    """A reducer of one's own takes its mean over every rank: a subset is built for the plain
    mean and the wires only."""
    from hpcopt.algorithms import Piece, reducers

    class Everyone:
        declared = ()
        in_flight = False

        def new_state(self, x):
            return {}

        def mean_(self, x, state, part, comm, label):
            comm.average_(x, label=label)

    reducers.register("everyone", Piece(lambda options: Everyone()))
    try:
        assert isinstance(LocalClip(**LR, gamma=1.0, wire="everyone").reducer, Everyone)
        with pytest.raises(HpcoptError, match="participation applies only to the plain mean and the wires"):
            LocalClip(**LR, gamma=1.0, wire="everyone", participation=0.5)
    finally:
        reducers.unregister("everyone")
