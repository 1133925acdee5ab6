"""Options that run but that users rarely mean: rank 0 warns of them in one line each when the
run starts (``warnings`` of the data-parallel algorithms), and trains as asked."""

from __future__ import annotations

import pytest

from hpcopt.build import build_algorithm
from hpcopt.config import build_config
from tests.runs import fresh_train

SMALL = {"dataset": "digits", "hidden": "16", "steps": "8", "interval": "4", "progress": "false"}


def warnings_of(options: dict[str, str], total_steps: int = 8) -> tuple[str, ...]:
    return build_algorithm(build_config(None, options), 2, total_steps).warnings()


def test_a_warmup_longer_than_the_run_is_warned_of():
    assert warnings_of({"warmup": "8"}) == ()
    [warning] = warnings_of({"warmup": "40"})
    assert warning.startswith("warmup 40 is longer than the run (8 steps): the step size is still "
                              "warming up at the end, at 8/40 of the schedule's lr")
    assert warnings_of({"preset": "diloco-paper"}, 100)[0].startswith("warmup 1000 is longer")


@pytest.mark.parametrize("policy", ["keep", "reset"])
def test_averaging_adamws_first_moment_without_its_second_is_warned_of(policy):
    """Where a rank's gradient of a parameter is 0 its v stays 0 while the averaged m is not."""
    adamw = {"inner_optimizer": "adamw", "lr": "0.01", "momentum_policy": "average"}
    [warning] = warnings_of({**adamw, "second_moment_policy": policy})
    assert warning.startswith(f"momentum_policy average with adamw and second_moment_policy {policy}: ")
    assert "pass --second-moment-policy average too" in warning
    assert warnings_of({**adamw, "second_moment_policy": "average"}) == ()
    assert warnings_of({"momentum": "0.9", "momentum_policy": "average"}) == ()  # sgd has no v


def test_rank_0_prints_each_warning_as_one_line_and_trains(capfd):
    fresh_train(build_config(None, {**SMALL, "warmup": "40"}))
    lines = capfd.readouterr().err.splitlines()
    assert [line for line in lines if line.startswith("hpcopt: warning: warmup 40 is longer")] == lines
    assert len(lines) == 1
