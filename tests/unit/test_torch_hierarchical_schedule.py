"""Two-level averaging periods (hpcopt/algorithms/groups.py) against torch's
``HierarchicalModelAverager`` with periods {I1: G, I: N}: the same averages after the same
local steps only when torch's step counter starts at 1 instead of its 0 (docs/algorithms.md).

Which average a step ends with is a function of the step alone in both (hpcopt: the round's
local steps; torch: its counter), not of the world size, so one rank shows it: hpcopt's from
the calls per label in a real run's trace (a row every step), torch's from its own
``average_parameters`` with the averaging call recorded instead of made (it needs a process
group; the decision, warmup and the counter are torch's code)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from hpcopt import build_config, train
from hpcopt.io.trace import read_trace

pytestmark = pytest.mark.extra
hierarchical = pytest.importorskip(
    "torch.distributed.algorithms.model_averaging.hierarchical_model_averager")

GROUP, GLOBAL = "group", "global"


def hpcopt_averages(tmp_path, interval: int, group_interval: int, steps: int) -> list[str | None]:
    """After each local step 1..steps: the average hpcopt took (GROUP, GLOBAL or None)."""
    out = tmp_path / f"run-{interval}-{group_interval}"
    train(build_config(None, {"dataset": "digits", "hidden": "8", "steps": str(steps),
                              "interval": str(interval), "group_size": "1",
                              "group_interval": str(group_interval), "trace_every": "1",
                              "out": str(out), "progress": "false"}), verbose=False)
    trace = read_trace(out / "trace.h5")
    assert list(trace.columns["step"]) == list(range(1, steps + 1))
    group, world = (np.diff(trace.comm[label]["calls"], prepend=0)
                    for label in ("group_average", "average"))
    return [GLOBAL if w else GROUP if g else None for g, w in zip(group, world)]


def torch_averages(interval: int, group_interval: int, steps: int, first_step: int,
                   monkeypatch) -> list[str | None]:
    """After each local step 1..steps (``average_parameters`` called once per step, after the
    optimizer's, as torch's documentation does): the group torch averaged over."""
    made: list[str | None] = []
    monkeypatch.setattr(hierarchical.utils, "average_parameters_or_parameter_groups",
                        lambda params, group: made.append(group))
    averager = hierarchical.HierarchicalModelAverager.__new__(hierarchical.HierarchicalModelAverager)
    # what __init__ sets for periods {I1: G, I: N} (it asks a process group for N)
    averager.step, averager.warmup_steps = first_step, 0
    averager._periods = [group_interval, interval]
    averager.period_process_group_dict = OrderedDict([(group_interval, GROUP), (interval, GLOBAL)])
    found = []
    for _ in range(steps):
        made.clear()
        averager.average_parameters([])
        found.append(made[0] if made else None)
    return found


@pytest.mark.parametrize("interval, group_interval", [(6, 2), (8, 4), (4, 1)])
def test_two_level_periods_are_torchs_averager_with_its_counter_advanced_by_one(
        tmp_path, monkeypatch, interval, group_interval):
    steps = 2 * interval + 1
    ours = hpcopt_averages(tmp_path, interval, group_interval, steps)
    assert ours[interval - 1] == GLOBAL and ours[group_interval - 1] == GROUP
    assert ours == torch_averages(interval, group_interval, steps, 1, monkeypatch)
    by_default = torch_averages(interval, group_interval, steps, 0, monkeypatch)
    assert by_default != ours and by_default[0] == GLOBAL  # torch's own start: after step 1
    assert by_default[1:] == ours[:-1]  # one step early throughout
