"""A real Slurm for the tests: a controller and 2 slurmd nodes of network namespaces
(benchmarks/cluster/slurm.py), made once for the session and removed at its end (also on
SIGTERM or SIGHUP). Where it cannot be made (not root, Slurm or munge not installed, ``ip netns
add`` refused) every test here is skipped with the reason."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from benchmarks.cluster.slurm import SlurmCluster, slurm_unavailable

NODES = 2


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    reason = slurm_unavailable()
    if reason:
        pytest.skip(f"no Slurm cluster: {reason}")
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with SlurmCluster(NODES) as made:
            yield made
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture
def cluster(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, with every job a test left cancelled and every node back after it."""
    yield slurm
    slurm.client(["scancel", "-u", "root"], check=False)
    slurm.revive()
    slurm.client(["scontrol", "update", "nodename=ALL", "state=resume"], check=False)
