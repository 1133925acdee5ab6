"""Several nodes on one machine: MPICH's hydra takes a job's nodes from its host list, so
``mpiexec -launcher fork -hosts node0,node1 -ppn P`` starts every rank here but gives each
host's ranks a shared-memory split of their own (``Split_type(COMM_TYPE_SHARED)``): P ranks a
node in blocks, ranks 0..P-1 on node0, and with ``-ppn 1`` round-robin, rank r on node r mod
hosts. Open MPI's launcher has no such node map: there these tests skip."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from tests.faults.jobs import Job, run_job


def needs_hydra() -> None:
    """Skip unless this MPI is MPICH (its hydra launcher makes the node map)."""
    if "MPICH" not in MPI.Get_library_version():
        pytest.skip("emulated nodes need MPICH's hydra launcher (-launcher fork -hosts)")


def run_on_nodes(ranks: int, hosts: int, per_node: int, args: list[str] | None = None,
                 code: str | None = None) -> Job:
    """``python -m hpcopt ARGS`` (or ``python -c CODE``) on ``ranks`` ranks over ``hosts``
    emulated nodes, ``per_node`` consecutive ranks on a node at a time (1: round-robin)."""
    needs_hydra()
    names = ",".join(f"node{i}" for i in range(hosts))
    return run_job(args or [], ranks, python_code=code,
                   mpiexec_args=("-launcher", "fork", "-hosts", names, "-ppn", str(per_node)))
