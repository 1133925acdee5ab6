"""Nodes on the emulated cluster: MPI's shared-memory split gives one group per node (and, as a
fallback without namespaces, per host of hydra's fork launcher), and the shared-memory average
keeps the ranks of a node off the link: one buffer per node crosses it per round."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.cluster.emulated import UPLINK
from tests.cluster.conftest import JOB_TIMEOUT, ROOT, job_env

JOB = [sys.executable, "-m", "tests.cluster.node_averaging"]


def facts(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def nodes_of(result: dict) -> list[list[int]]:
    """The node groups MPI formed, each once, in rank order."""
    return sorted({tuple(r["node"]) for r in result["ranks"]})


@pytest.mark.parametrize("netmod", ["ofi", "ucx"])
def test_one_group_per_node_and_one_buffer_per_node_crosses_its_link(cluster, netmod):
    job = cluster.mpiexec([*JOB, "--device", UPLINK, "--rounds", "4"], netmod, JOB_TIMEOUT,
                          job_env(), ROOT)
    assert job.returncode == 0, job.describe()
    result = facts(job.stdout)
    assert nodes_of(result) == [(0, 1), (2, 3)]  # hydra's -ppn 2 puts ranks 0, 1 on node 0
    namespaces = {r["rank"]: r["netns"] for r in result["ranks"]}
    assert namespaces[0] == namespaces[1] != namespaces[2] == namespaces[3]  # a group is a node
    per_round = [r["sent"] / result["rounds"] / result["buffer_bytes"]
                 for r in result["ranks"] if r["sent"] is not None]
    assert len(per_round) == 2, result
    # the node's ranks meet in shared memory; each half of the node's sum crosses once (the
    # other node's half comes back): one buffer out per node and round, plus the headers
    assert all(0.9 <= share <= 1.2 for share in per_round), (per_round, job.describe())


def test_fork_launcher_hosts_are_nodes_without_namespaces():
    """The fallback where namespaces are not permitted: hydra's fork launcher with two host
    names gives MPI two nodes on one machine (no network between them is emulated)."""
    command = ["timeout", "-k", "5", str(int(JOB_TIMEOUT)), "mpiexec", "-launcher", "fork",
               "-hosts", "nodea,nodeb", "-n", "4", "-ppn", "2", *JOB, "--rounds", "1"]
    done = subprocess.run(command, capture_output=True, text=True, env=job_env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert nodes_of(facts(done.stdout)) == [(0, 1), (2, 3)]
