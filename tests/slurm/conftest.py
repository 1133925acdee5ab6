"""A real Slurm for the tests: a controller and 2 slurmd nodes of network namespaces
(benchmarks/cluster/slurm.py), made once for this package's tests and removed after the last
(also on SIGTERM or SIGHUP). Where it cannot be made (not root, Slurm or munge not installed, ``ip netns
add`` refused) every test here is skipped with the reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.cluster.slurm import SlurmCluster, slurm_unavailable
from tests.interrupts import interrupted_by_sigterm

NODES = 2


@pytest.fixture(scope="package")
def slurm() -> Iterator[SlurmCluster]:
    reason = slurm_unavailable()
    if reason:
        pytest.skip(f"no Slurm cluster: {reason}")
    with interrupted_by_sigterm(), SlurmCluster(NODES) as made:
        yield made


@pytest.fixture
def cluster(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The package's cluster, with every job a test left cancelled and every node back after it."""
    yield slurm
    slurm.client(["scancel", "-u", "root"], check=False)
    slurm.revive()
    slurm.client(["scontrol", "update", "nodename=ALL", "state=resume"], check=False)
