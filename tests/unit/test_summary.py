"""The run summary says what happened: at 1 rank no byte leaves the rank, whatever the counters
hold (they count the messages' sizes); a resumed run's time is all its jobs', and it says so."""

from __future__ import annotations

import pytest

from hpcopt.problems.classification import Evaluation
from hpcopt.run.data_parallel import Summary
from hpcopt.run.threads import ThreadChoice


def summary(workers: int, **given: float) -> Summary:
    return Summary(**{"steps": 16, "rounds": 2, "final": Evaluation(0.9, 0.8, 100), "train_loss": 1.0,
                      "wall_seconds": 1.0, "comm_seconds": 0.01, "bytes_per_rank": 2.01e6,
                      "average_bytes_per_rank": 1.34e6, "in_node_bytes_per_rank": 0.5e6,
                      "parameters": 167_178, "workers": workers, "samples_per_second": 100.0,
                      "threads": ThreadChoice(1, "test"), **given})


def communicated(workers: int) -> str:
    [line] = [line for line in summary(workers).lines() if line.startswith("communicated")]
    return line.removeprefix("communicated").strip()


def test_one_rank_communicates_nothing():
    assert communicated(1) == "nothing (1 rank: its averages and reductions move no bytes)"


@pytest.mark.parametrize("workers", [2, 4])
def test_several_ranks_report_bytes_per_rank_the_averaging_share_and_where_they_went(workers):
    assert communicated(workers) == ("2.01 MB per rank (1.34 MB averaging the 167,178 parameters; "
                                     "0.50 MB in-node, 1.51 MB across nodes)")


def test_a_two_level_run_reports_its_group_averages_and_where_they_went():
    lines = summary(4, group_rounds=6, group_bytes_per_rank=0.4e6, group_in_node_bytes_per_rank=0.3e6).lines()
    assert "group averages    0.40 MB per rank in 6 rounds (0.30 MB in-node, 0.10 MB across nodes)" in lines
    assert not [line for line in summary(4).lines() if line.startswith("group averages")]
    assert not [line for line in summary(1, group_rounds=6, group_bytes_per_rank=0.4e6).lines()
                if line.startswith("group averages")]


def test_a_resumed_runs_time_says_it_is_all_its_jobs():
    [line] = [line for line in summary(2, wall_seconds=12.3, earlier_seconds=8.2).lines()
              if line.startswith("time")]
    assert line == ("time              12.3 s (all jobs of the resumed run; this job 4.1 s), "
                    "0.1% in communication")
    [line] = [line for line in summary(2).lines() if line.startswith("time")]
    assert line == "time              1.0 s, 1.0% in communication"


def test_a_resumed_pipeline_runs_time_says_it_is_all_its_jobs():
    from hpcopt.run.pipeline import PipelineSummary

    run = PipelineSummary(steps=6, samples=4, stages=2, train_loss=1.0, final_loss=0.5, bubble=0.2,
                          bubble_ideal=0.2, tau=1e-3, modelled_seconds=0.05, wall_seconds=2.5, messages=48,
                          threads=ThreadChoice(1, "test"), earlier_seconds=1.5)
    [line] = [line for line in run.lines() if line.startswith("time")]
    assert line == ("time              2.50 s (all jobs of the resumed run; this job 1.00 s) measured, "
                    "0.05 s modelled (tau 1.000 ms per op)")
