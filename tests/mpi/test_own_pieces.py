"""Pieces from outside the package (docs/examples/own_pieces.py), registered by call and chosen
by their flags: the outer optimizer ``lion`` against its serial float64 reference under
whole-model rounds, fragments, a wire and group rounds; the reducer ``float64_sum`` bit for bit
the plain mean on float64 models under the same, and reached (its float64 message is twice a
float32 model's); a run of both resumed bit for bit (the reader of a resumed run's files runs in
a process of its own, which imports the module that registered them)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcopt.algorithms import outer_optimizers, reducers
from hpcopt.build import build_algorithm
from tests.conftest import host
from tests.mpi.test_optimizers import small_config
from tests.reference import streaming_reference
from tests.runs import fresh_train

pytestmark = pytest.mark.mpi

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


@pytest.fixture(autouse=True)
def own_pieces(monkeypatch):
    """The example module imported as a user's script imports it (it registers its pieces);
    afterwards the registries hold the built-ins only again."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delitem(sys.modules, "own_pieces", raising=False)
    yield importlib.import_module("own_pieces")
    outer_optimizers.unregister("lion")
    reducers.unregister("float64_sum")


class LionReference:
    """Lion on the pseudo-gradient, plainly (tests/reference.py's outer optimizers' interface)."""

    kind = "lion"

    def __init__(self, x0, lr, beta1, beta2):
        self.anchor, self.m = x0.copy(), np.zeros_like(x0)
        self.lr, self.beta1, self.beta2 = lr, beta1, beta2

    def step(self, mean, eta):
        delta = self.anchor - mean
        self.anchor = self.anchor - self.lr * np.sign(self.beta1 * self.m + (1 - self.beta1) * delta)
        self.m = self.beta2 * self.m + (1 - self.beta2) * delta
        return self.anchor.copy()


@pytest.mark.parametrize("overrides", [
    {"steps": 12},                                                   # whole-model rounds
    {"fragments": 3, "interval": 6, "steps": 14},                    # fragments in turn
    {"fragments": 2, "overlap": 1, "fragment_mix": 0.5, "steps": 13},
    {"wire": "int8", "steps": 12},                                   # pseudo-gradients on a wire
    {"fragments": 2, "wire": "bfloat16", "steps": 12},
    {"group_size": 1, "group_interval": 2, "steps": 12},             # group rounds between
])
def test_a_registered_outer_optimizer_is_its_reference_in_every_kind_of_round(comm, overrides):
    config = small_config(momentum=0.9, outer_optimizer="lion", outer_lr=0.01, outer_momentum=0.8,
                          **overrides)
    assert build_algorithm(config, comm.size, 16).outer.describe() == "outer lion (lr 0.01, betas 0.8, 0.99)"
    _, state = fresh_train(config)
    expected = streaming_reference(config, comm.size, lambda x0: LionReference(x0, 0.01, 0.8, 0.99))
    np.testing.assert_allclose(host(state.x), expected, rtol=1e-10, atol=1e-12)
    assert np.abs(host(state.lion_m)).max() > 0  # its own state, declared: a checkpoint holds it
    for got in comm.mpi.allgather(host(state.lion_m)):
        np.testing.assert_array_equal(got, host(state.lion_m))


@pytest.mark.parametrize("overrides", [
    {},
    {"outer_optimizer": "nesterov"},
    {"fragments": 3, "interval": 6},
    {"group_size": 1, "group_interval": 2, "outer_optimizer": "lion", "outer_lr": 0.01},
])
def test_a_registered_reducer_takes_every_round_and_is_the_mean(comm, overrides):
    """On float64 models the float64 sum is the plain mean's (to rounding: MPI promises no
    blocking Allreduce the bits of the Iallreduce a fragment's plain mean posts; Open MPI at 3
    ranks sums them in other orders); on float32 ones its message (float64) is twice the plain
    mean's bytes, so it took every round."""
    for dtype in ("float64", "float32"):
        plain, plain_state = fresh_train(small_config(dtype=dtype, **overrides))
        own, own_state = fresh_train(small_config(dtype=dtype, wire="float64_sum", **overrides))
        if dtype == "float64":
            np.testing.assert_allclose(host(own_state.x), host(plain_state.x), rtol=1e-12, atol=1e-14)
            assert own.average_bytes_per_rank == plain.average_bytes_per_rank
        else:
            assert own.average_bytes_per_rank == 2 * plain.average_bytes_per_rank > 0


def test_a_run_of_registered_pieces_resumes_bitwise(comm, shared_dir):
    options = dict(outer_optimizer="lion", outer_lr=0.01, wire="float64_sum", fragments=2,
                   steps=16, checkpoint_every=4, momentum=0.9)
    _, whole = fresh_train(small_config(out=str(shared_dir / "whole"), **options))
    fresh_train(small_config(out=str(shared_dir / "part"), **{**options, "steps": 8}))
    summary, resumed = fresh_train(small_config(out=str(shared_dir / "part"), **options),
                                   resume=shared_dir / "part")
    assert summary.steps == 16
    for name in ("x", "anchor", "lion_m", "momentum", "in_flight"):
        np.testing.assert_array_equal(host(getattr(resumed, name)), host(getattr(whole, name)))
