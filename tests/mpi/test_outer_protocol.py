"""The outer optimizer as a piece with its own state (hpcopt/algorithms/outer.py, ``Outer``):
an outer optimizer from outside the package, with two moments of the pseudo-gradient, runs the
same under whole-model rounds and under Streaming DiLoCo's fragments, where the fragments once
called the package's own outer step directly (the outside one's moments then stayed zero and
its rounds were plain averages). Checked against the serial float64 reference at any world
size."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest

from hpcopt.algorithms import LocalSGD
from hpcopt.build import build_run
from tests.conftest import host
from tests.mpi.test_optimizers import small_config
from tests.reference import streaming_reference

pytestmark = pytest.mark.mpi

LR, BETA1, BETA2, EPS = 0.05, 0.8, 0.9, 1e-3


@dataclass(frozen=True)
class MomentsOuter:
    """Adam without bias correction on Delta = anchor - mean: m <- b1 m + (1 - b1) Delta,
    v <- b2 v + (1 - b2) Delta^2, anchor <- anchor - lr m / (sqrt(v) + eps)."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("anchor", "own_m", "own_v")

    def new_state(self, x):
        return {"anchor": x.copy(), "own_m": np.zeros_like(x), "own_v": np.zeros_like(x)}

    def step(self, mean, state, scratch, eta):
        anchor, m, v = state["anchor"], state["own_m"], state["own_v"]
        scratch[...] = anchor - mean
        m *= BETA1
        m += (1 - BETA1) * scratch
        v *= BETA2
        v += (1 - BETA2) * scratch * scratch
        anchor -= LR * m / (np.sqrt(v) + EPS)
        mean[...] = anchor

    def describe(self) -> str:
        return "outer moments"


class MomentsReference:
    """The same outer step, plainly, for tests/reference.py."""

    def __init__(self, x0):
        self.anchor, self.m, self.v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)

    def step(self, mean, eta):
        delta = self.anchor - mean
        self.m = BETA1 * self.m + (1 - BETA1) * delta
        self.v = BETA2 * self.v + (1 - BETA2) * delta ** 2
        self.anchor = self.anchor - LR * self.m / (np.sqrt(self.v) + EPS)
        return self.anchor.copy()


@dataclass(frozen=True, kw_only=True)
class WithMomentsOuter(LocalSGD):
    """PR-SGD with the outside outer optimizer."""

    @property
    def outer(self) -> MomentsOuter:
        return MomentsOuter()


def run(config, comm, algorithm_class):
    """Train ``config`` with ``algorithm_class`` (a subclass of its algorithm's) in its place, as
    the training loop steps it: (the algorithm, its final state)."""
    parts = build_run(config, comm)
    algorithm = algorithm_class(**{f.name: getattr(parts.algorithm, f.name)
                                   for f in dataclasses.fields(parts.algorithm) if f.init})
    state = algorithm.init(parts.workload.x0.copy(), comm)
    for _ in range(parts.local_steps):
        algorithm.step(state, parts.workload.problem.oracle, comm)
    if not algorithm.synchronized(state):
        algorithm.finish(state, comm, label="final")
    return algorithm, state


@dataclass(frozen=True, kw_only=True)
class CountingOuterSteps(LocalSGD):
    """PR-SGD that records the part of the model each outer step is taken on."""

    taken: list = dataclasses.field(default_factory=list, compare=False)

    def outer_step(self, state, eta, mean=None, part=slice(None)):
        self.taken.append((part.start, part.stop))
        super().outer_step(state, eta, mean, part)


def test_every_fragment_takes_the_algorithms_own_outer_step(comm):
    """Fragments sent after steps 2, 4, ..., 14 (offsets 0, 2, 4 of H = 6): seven outer steps,
    each through ``outer_step``, on its fragment's slice."""
    config = small_config(fragments=3, interval=6, steps=14, outer_optimizer="nesterov")
    algorithm, _ = run(config, comm, CountingOuterSteps)
    bounds = algorithm.timing.bounds
    assert algorithm.taken == [bounds[p] for p in (1, 2, 0, 1, 2, 0, 1)]


@pytest.mark.parametrize("overrides", [
    {"steps": 12},                                               # whole-model rounds
    {"fragments": 3, "interval": 6, "steps": 14},                # fragments in turn
    {"fragments": 2, "overlap": 1, "fragment_mix": 0.5, "steps": 13},
])
def test_an_outside_outer_with_moments_runs_under_rounds_and_fragments(comm, overrides):
    config = small_config(momentum=0.9, **overrides)
    _, state = run(config, comm, WithMomentsOuter)
    np.testing.assert_allclose(host(state.x), streaming_reference(config, comm.size, MomentsReference),
                               rtol=1e-10, atol=1e-12)
    moments = [host(state.own_m), host(state.own_v)]
    assert all(np.abs(moment).max() > 0 for moment in moments)  # the outer step was taken
    for arrays in comm.mpi.allgather(moments):  # shared: the same on every rank
        for got, ours in zip(arrays, moments):
            np.testing.assert_array_equal(got, ours)
