"""hpcopt.run.threads: 1 BLAS thread per rank by default, and the user's thread variable wins."""

from __future__ import annotations

import os

import pytest
import threadpoolctl

from hpcopt.run import threads
from hpcopt.run.threads import (
    THREAD_VARIABLES,
    ThreadChoice,
    available_cores,
    configure_threads,
    threads_per_rank,
    user_thread_setting,
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def limits_calls(monkeypatch):
    """Record threadpool_limits calls instead of changing this test process's pools."""
    calls: list[dict] = []
    monkeypatch.setattr(threadpoolctl, "threadpool_limits", lambda **kw: calls.append(kw))
    return calls


@pytest.mark.parametrize("cores, ranks, expected", [
    (2, 1, 2), (2, 2, 1), (2, 4, 1), (16, 4, 4), (16, 3, 5), (16, 32, 1), (8, 0, 8), (1, 1, 1),
])
def test_threads_per_rank(cores, ranks, expected):
    assert threads_per_rank(cores, ranks) == expected


def test_available_cores():
    n = available_cores()
    assert 1 <= n <= (os.cpu_count() or 1)


def test_no_user_setting(clean_env):
    assert user_thread_setting() is None


@pytest.mark.parametrize("env, expected", [
    ({"OMP_NUM_THREADS": "3"}, ("OMP_NUM_THREADS", 3)),
    ({"MKL_NUM_THREADS": " 4 "}, ("MKL_NUM_THREADS", 4)),
    ({"OPENBLAS_NUM_THREADS": "2", "BLIS_NUM_THREADS": "6"}, ("OPENBLAS_NUM_THREADS", 2)),
    ({"OMP_NUM_THREADS": "5", "OPENBLAS_NUM_THREADS": "2"}, ("OMP_NUM_THREADS", 5)),
    ({"OMP_NUM_THREADS": "", "BLIS_NUM_THREADS": "7"}, ("BLIS_NUM_THREADS", 7)),
    ({"OMP_NUM_THREADS": "0"}, ("OMP_NUM_THREADS", 1)),
    ({"OMP_NUM_THREADS": "many"}, ("OMP_NUM_THREADS", 1)),
])
def test_user_setting_read_in_order(clean_env, env, expected):
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert user_thread_setting() == expected


def test_configure_respects_user_variable(clean_env, limits_calls):
    clean_env.setenv("OPENBLAS_NUM_THREADS", "3")
    choice = configure_threads(ranks_on_node=4)
    assert choice.threads == 3
    assert "OPENBLAS_NUM_THREADS=3" in choice.reason
    assert limits_calls == []  # the user's setting is left alone


def test_configure_limits_each_rank_to_one_thread_and_names_its_share(clean_env, limits_calls, monkeypatch):
    """1 thread per rank whatever the cores (benchmarks/speed/blas_threads.py); the reason says
    what OMP_NUM_THREADS would give each rank its share of the cores."""
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    choice = configure_threads(ranks_on_node=4)
    assert choice == ThreadChoice(1, "hpcopt's default; 8 core(s) / 4 rank(s) on this node; "
                                     "OMP_NUM_THREADS=2 would give each rank its share")
    assert limits_calls == [{"limits": 1}]
    assert choice.describe().startswith("1 BLAS thread(s) per rank")


@pytest.mark.parametrize("cores", [1, 2])
def test_a_node_without_spare_cores_gets_one_thread_and_no_hint(clean_env, limits_calls, monkeypatch, cores):
    monkeypatch.setattr(threads, "available_cores", lambda: cores)
    choice = configure_threads(ranks_on_node=4)
    assert choice == ThreadChoice(1, f"hpcopt's default; {cores} core(s) / 4 rank(s) on this node")
    assert limits_calls == [{"limits": 1}]
