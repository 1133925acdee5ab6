"""The learning-rate warmup and the cosine schedule (hpcopt/algorithms/schedules.py): their
values against a plain serial reference and values worked by hand, the run's trace lr column,
and the guard that runs without them compute the bits hpcopt computed before they existed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from hpcopt import train
from hpcopt.algorithms.data_parallel import ScheduledSGD
from hpcopt.algorithms.schedules import Schedule
from hpcopt.config import build_config, check_resume
from hpcopt.errors import HpcoptError
from hpcopt.io.trace import read_trace
from tests.stored import assert_near_stored

DATA = Path(__file__).resolve().parents[1] / "data" / "schedules"


def reference_lr(t: int, lr: float, warmup: int, total: int) -> float:
    """Linear warmup to lr over ``warmup`` steps (step warmup - 1 at lr), then cosine from lr
    to 0 at step ``total``, plainly."""
    if t < warmup:
        return lr * (t + 1) / warmup
    progress = min(1.0, (t - warmup) / (total - warmup))
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))


@pytest.mark.parametrize("lr, warmup, total", [(4e-4, 1000, 24_000), (0.1, 0, 50), (1.0, 7, 8),
                                              (0.3, 5, 200)])
def test_cosine_with_warmup_matches_the_plain_reference_at_every_step(lr, warmup, total):
    schedule = Schedule("cosine", lr, warmup=warmup, total_steps=total)
    for t in range(total + 3):  # past T: a rank whose local_steps exceed interval
        assert schedule(t) == pytest.approx(reference_lr(t, lr, warmup, total), rel=1e-15, abs=0)


def test_cosine_with_warmup_by_hand():
    """lr 1, W = 4, T = 12: 1/4, 2/4, 3/4, 1 while warming up, then 1 at t = W, 1/2 half way
    through the decay, (1 + cos(7 pi / 8)) / 2 at the last step, 0 from T on."""
    schedule = Schedule("cosine", 1.0, warmup=4, total_steps=12)
    assert [schedule(t) for t in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert schedule(8) == pytest.approx(0.5, abs=1e-16)
    assert schedule(11) == pytest.approx((1 + math.cos(7 * math.pi / 8)) / 2, rel=1e-15)
    assert schedule(11) > 0 and schedule(12) == schedule(20) == 0.0


def test_warmup_scales_the_other_schedules_and_zero_changes_no_value():
    step = Schedule("step", 1.0, decay=0.5, milestones=(3,), warmup=2)
    assert [step(t) for t in range(5)] == [0.5, 1.0, 1.0, 0.5, 0.5]
    constant = Schedule("constant", 0.2, warmup=4)
    assert [constant(t) for t in range(5)] == [0.2 * 1 / 4, 0.2 * 2 / 4, 0.2 * 3 / 4, 0.2, 0.2]
    for kind in ("constant", "step", "sqrt_nt", "cosine"):
        plain = Schedule(kind, 0.3, decay=0.5, milestones=(4, 9), workers=3, total_steps=20)
        assert plain.warmup == 0
        assert all(plain(t) == plain.base(t) for t in range(25)), kind


def test_a_negative_warmup_and_an_unknown_schedule_are_refused_in_one_line():
    with pytest.raises(HpcoptError, match="warmup must be >= 0 steps, got -1"):
        build_config(None, {"warmup": "-1"})
    with pytest.raises(HpcoptError, match="unknown schedule 'cos'.*cosine"):
        build_config(None, {"schedule": "cos"})


def test_the_run_length_is_fixed_with_the_cosine_schedule():
    stored = build_config(None, {"steps": "20", "schedule": "cosine"})
    with pytest.raises(HpcoptError, match="cosine step size depends on the number of steps"):
        check_resume(stored, build_config(None, {"steps": "40", "schedule": "cosine"}))
    check_resume(stored, build_config(None, {"steps": "20", "schedule": "cosine", "eval_every": "5"}))


SMALL = {"dataset": "digits", "hidden": "12", "batch_size": "8", "steps": "10", "dtype": "float64",
         "seed": "3", "progress": "false"}
#: The runs of tests/data/schedules/NAME-x.npy: the model after 10 steps, written by the hpcopt
#: before warmup and the cosine schedule existed (1 rank, float64).
GOLDEN = {"diloco-constant": {"algorithm": "diloco", "interval": "4"},
          "prsgd-step": {"momentum": "0.9", "interval": "3", "schedule": "step", "milestones": "5",
                         "decay": "0.5"}}


def lr_before_warmup(algorithm: ScheduledSGD, t: int) -> float:
    """lr_t as the hpcopt before warmup computed it (its ``Schedule.__call__``), for the
    schedules of GOLDEN."""
    if algorithm.schedule == "constant":
        return algorithm.lr
    assert algorithm.schedule == "step"
    return algorithm.lr * algorithm.decay ** sum(1 for m in algorithm.milestones if m <= t)


@pytest.mark.parametrize("name", GOLDEN)
@pytest.mark.parametrize("warmup", [None, "0"])
def test_runs_without_warmup_compute_the_bits_they_computed_before_it_existed(name, warmup,
                                                                              monkeypatch):
    """Bitwise: the run is the same run with every lr_t computed as before warmup existed
    (``ScheduledSGD.lr_at`` replaced by ``lr_before_warmup``), both on this machine. Within a
    few ulp (tests.stored): the model stored by the hpcopt before warmup, on the machine that
    ran it (another CPU's BLAS kernels round differently)."""
    options = {**SMALL, **GOLDEN[name]} | ({"warmup": warmup} if warmup else {})
    _, state = train(build_config(None, options), verbose=False)
    steps: list[int] = []
    monkeypatch.setattr(ScheduledSGD, "lr_at",
                        lambda algorithm, t: steps.append(t) or lr_before_warmup(algorithm, t))
    _, before = train(build_config(None, options), verbose=False)
    assert set(range(10)) <= set(steps)
    np.testing.assert_array_equal(state.x, before.x)
    assert_near_stored(state.x, np.load(DATA / f"{name}-x.npy"), "x")


def test_the_trace_lr_column_follows_warmup_and_cosine(tmp_path):
    """A diloco run's trace rows (every step) carry lr_{t-1}, the step size of the row's last step."""
    options = {**SMALL, "algorithm": "diloco", "interval": "4", "steps": "12", "schedule": "cosine",
               "warmup": "3", "trace_every": "1", "lr": "0.01", "out": str(tmp_path / "run")}
    train(build_config(None, options), verbose=False)
    trace = read_trace(tmp_path / "run" / "trace.h5")
    steps, lrs = trace.columns["step"], trace.columns["lr"]
    assert list(steps) == list(range(1, 13))
    np.testing.assert_allclose(lrs, [reference_lr(int(s) - 1, 0.01, 3, 12) for s in steps],
                               rtol=1e-15, atol=0)
    assert trace.config.algorithm.warmup == 3
