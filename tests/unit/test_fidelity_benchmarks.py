"""The arithmetic of benchmarks/reproduce/prsgd_interval.py and pprs_fidelity.py: the intervals
swept, the theory's threshold, where a measure starts to fall, a round's time on the modelled
cluster, the per-iteration pipeline figures read from trace rows, and the interval study's file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: the benchmarks package

from benchmarks.reproduce import pprs_fidelity, prsgd_interval  # noqa: E402


def test_intervals_run_from_one_to_the_whole_run():
    assert prsgd_interval.intervals(620, 1 << 30) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 620]
    assert prsgd_interval.intervals(62, 8) == [1, 2, 4, 8]
    assert prsgd_interval.intervals(1, 8) == [1]


def test_threshold_is_t_to_the_quarter_over_n_to_three_quarters():
    assert prsgd_interval.threshold(16, 1) == pytest.approx(2.0)
    assert prsgd_interval.threshold(1240, 2) == pytest.approx(1240 ** 0.25 / 2 ** 0.75)


def test_fall_start_needs_every_larger_interval_worse():
    worse = lambda v, base: v < base - 0.01  # noqa: E731
    assert prsgd_interval.fall_start({1: 0.94, 2: 0.95, 4: 0.92, 8: 0.925, 16: 0.90}, worse) == 4
    assert prsgd_interval.fall_start({1: 0.94, 2: 0.90, 4: 0.94}, worse) is None
    assert prsgd_interval.fall_start({1: 0.94, 2: 0.94}, worse) is None


def test_round_time_is_the_slowest_workers():
    assert prsgd_interval.round_time((14, 10, 6, 2)) == 2
    assert prsgd_interval.round_time((8, 8, 8, 8)) == 8


def test_reach_is_the_first_evaluation_at_or_below_the_target():
    run = {"step": [0, 10, 20, 30], "loss": [4.0, 2.0, 0.5, 0.4]}
    assert pprs_fidelity.reach(run, 0.5) == 20
    assert pprs_fidelity.reach(run, 0.1) is None


def test_per_iteration_skips_the_first_window():
    def row(step: int, wall: float, busy: tuple[float, float], idle: tuple[float, float]) -> dict:
        return {"step": step, "wall": wall, "tau": 1e-3, "busy_0": busy[0], "busy_1": busy[1],
                "idle_0": idle[0], "idle_1": idle[1]}

    history = [row(5, 9.0, (99, 99), (99, 99)), row(10, 10.0, (1.0, 2.0), (3.0, 1.0)),
               row(15, 11.0, (1.0, 1.0), (1.0, 2.0)), row(20, 13.0, (2.0, 2.0), (2.0, 2.0))]
    figures = pprs_fidelity.per_iteration(history, 2)
    assert figures["measured"] == pytest.approx(4.0 / 5)  # median of 4/5, 3/5, 4/5
    assert figures["wall"] == pytest.approx(1.0 / 5)  # median of 1/5, 1/5, 2/5
    assert figures["bubble"] == pytest.approx(11.0 / 20.0)


def test_the_study_file_is_the_one_of_the_pages_command():
    """benchmarks/reproduce/prsgd_interval.toml is what the script runs for the command that
    docs/results/prsgd.md names, and hpcopt sweep takes it: 78 runs, one per (N, I, seed) and
    per (configuration, seed)."""
    from hpcopt.study.spec import load_study, tasks

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduce" / "prsgd_interval.toml"
    args = prsgd_interval.parse_args("--epochs 20 --seeds 0 1 2 --ranks 2 4 --rounds 80".split())
    assert path.read_text() == prsgd_interval.study_text(args)
    found = tasks(load_study(path))
    assert len(found) == 3 * (12 + 11 + 3) and [t.ranks for t in found] == [2] * 36 + [4] * 42
    hetero = [t for t in found if "--local-steps" in t.args]
    assert len(hetero) == 3 and hetero[0].args[-2:] == ("--local-steps", "14,10,6,2")
