"""The emulated cluster the tests run on: 2 nodes x 2 ranks, every link shaped to 100 Mbit/s
(benchmarks/cluster/emulated.py). It needs ``ip netns add`` (root); where that is not permitted
the tests that need it are skipped with the reason, and only the fork-launcher fallback runs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from benchmarks.cluster.emulated import EmulatedCluster, Job, namespaces_unavailable
from tests.command_line import ROOT
from tests.interrupts import interrupted_by_sigterm
from tests.timeouts import scaled

NODES, RANKS_PER_NODE, RATE = 2, 2, "100mbit"
#: Hard limit on any one job on the cluster: a job that would hang fails instead.
JOB_TIMEOUT = scaled(120)


@pytest.fixture(scope="package")
def cluster() -> Iterator[EmulatedCluster]:
    """The cluster, made once for the tests of this package and removed after the last of them,
    so that neither it nor its SIGTERM handler outlives them in a run that goes on with other
    tests (the handlers a test finds must not depend on which tests ran before it)."""
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"no emulated cluster: {reason}")
    with interrupted_by_sigterm(), EmulatedCluster(NODES, RANKS_PER_NODE, RATE) as made:
        yield made


@pytest.fixture
def nodes(cluster: EmulatedCluster) -> Iterator[EmulatedCluster]:
    """The session's cluster, with every process a test left on it killed after the test."""
    yield cluster
    cluster.kill_jobs()


def job_env() -> dict[str, str]:
    """The ranks' environment: this checkout first on the module path, hydra's own timeout."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, MPIEXEC_TIMEOUT=str(int(JOB_TIMEOUT)))


def hpcopt_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hpcopt", *args]


def run_hpcopt(cluster: EmulatedCluster, *args: str, netmod: str = "ofi") -> Job:
    """``python -m hpcopt ARGS`` on every rank of the cluster, to its end."""
    return cluster.mpiexec(hpcopt_command(*args), netmod, JOB_TIMEOUT, job_env(), ROOT)
