"""Two-level averaging periods: the options that do not make a schedule are refused with one
line, and the cost model prices a group's label on the group's ranks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hpcopt.algorithms.groups import layout_mismatch
from hpcopt.build import build_run
from hpcopt.comm.core import OpCounter
from hpcopt.comm.costmodel import comm_modelled, get_profile, network_delay, trace_modelled
from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from tests.registered import refused


@pytest.mark.parametrize("options, message", [
    ({"group_size": "2"}, r"group_size \(--group-size\) needs group_interval > 0 \(--group-interval I1"),
    ({"group_size": "2", "group_interval": "3", "interval": "8"},
     "group_interval 3 must divide interval 8 and be smaller"),
    ({"group_size": "2", "group_interval": "8", "interval": "8"},
     "group_interval 8 must divide interval 8 and be smaller"),
    ({"group_size": "0", "group_interval": "2"}, "group_size must be >= 1, got 0"),
    ({"group_size": "nodes", "group_interval": "2"},
     "group_size must be a number of ranks or 'node', got 'nodes'"),
    ({"group_size": "2", "group_interval": "2", "local_steps": "4,8"},
     "group_interval applies only when every rank runs interval steps per round"),
    ({"algorithm": "naive_clip", "group_size": "2", "group_interval": "2"},
     refused("group_size", "naive_clip")),
])
def test_options_that_make_no_two_level_schedule_are_refused(options, message):
    with pytest.raises(HpcoptError, match=message):
        build_config(None, options)


def test_groups_that_do_not_divide_the_ranks_are_refused():
    config = build_config(None, {"dataset": "digits", "hidden": "8", "steps": "4", "interval": "4",
                                 "group_size": "2", "group_interval": "2"})
    build_run(config, SimpleNamespace(rank=0, size=4))
    with pytest.raises(HpcoptError, match=r"group_size 2 does not divide the run's 3 rank\(s\)"):
        build_run(config, SimpleNamespace(rank=0, size=3))


@pytest.mark.parametrize("group_size, nodes, mismatch", [
    (2, (0, 0, 1, 1), ""),
    (2, (0, 0, 0, 0), ""),
    (2, (0, 0, 0, 0, 1, 1, 1, 1), "node 0's 4 ranks are split over 2 groups"),
    (2, (0, 1, 0, 1), "group 0 (ranks 0-1) spans 2 nodes"),
    (4, (0, 0, 1, 1, 0, 0, 1, 1), "group 0 (ranks 0-3) spans 2 nodes"),
    (4, (0, 0, 0, 0, 1, 1, 1, 1), ""),
    (1, (0, 1), "")])
def test_groups_that_miss_the_nodes_are_named(group_size, nodes, mismatch):
    assert layout_mismatch(group_size, nodes) == mismatch


def test_node_groups_fit_any_world():
    config = build_config(None, {"dataset": "digits", "hidden": "8", "steps": "4", "interval": "4",
                                 "group_size": "node", "group_interval": "2"})
    assert config.algorithm.group_size == "node"
    build_run(config, SimpleNamespace(rank=0, size=3))


def test_a_groups_label_is_modelled_on_the_groups_ranks():
    eth10, d = get_profile("eth10"), 4000
    counters = {("allreduce", "average"): OpCounter(3, 3 * d),
                ("allreduce", "group_average"): OpCounter(5, 5 * d)}
    modelled = comm_modelled(counters, 8, eth10, label_ranks={"group_average": 2})
    assert modelled["average"] == pytest.approx(3 * eth10.allreduce(d, 8), rel=1e-12)
    assert modelled["group_average"] == pytest.approx(5 * eth10.allreduce(d, 2), rel=1e-12)
    assert eth10.allreduce(d, 2) < eth10.allreduce(d, 8)
    trace = {label: {"calls": np.array([c.calls]), "bytes": np.array([c.bytes])}
             for (_, label), c in counters.items()}
    rows = trace_modelled(trace, {}, 8, eth10, label_ranks={"group_average": 2})
    assert rows[0] == pytest.approx(sum(modelled.values()), rel=1e-12)
    delay = network_delay(eth10, 8)
    assert delay("allreduce", d, 2) == pytest.approx(eth10.allreduce(d, 2), rel=1e-12)
    assert delay("allreduce", d, 0) == pytest.approx(eth10.allreduce(d, 8), rel=1e-12)
