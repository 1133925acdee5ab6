"""Shared test set-up.

Under ``mpiexec ... pytest --with-mpi`` a failing test on one rank would leave the other ranks
waiting in the next collective forever. The hook below prints the failure (prefixed with the
rank) and aborts the whole MPI job at once, turning a hang into a failure in well under a second.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


def _world_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size() if MPI.Is_initialized() else 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or not item.config.getoption("with_mpi", default=False):
        return
    if _world_size() > 1:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
        lines = [*str(report.longrepr).splitlines(), f"FAILED {item.nodeid}: aborting all ranks"]
        # straight to file descriptor 2: pytest may be capturing sys.stderr at this point
        os.write(2, "".join(f"[rank {rank}] {line}\n" for line in lines).encode())
        MPI.COMM_WORLD.Abort(1)


@pytest.fixture
def shared_dir(comm):
    """One temporary directory for all ranks (made by rank 0), removed after the test; a test
    module may override it to put files in it first."""
    path = comm.mpi.bcast(tempfile.mkdtemp(prefix="hpcopt-test-") if comm.rank == 0 else None)
    yield Path(path)
    comm.mpi.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def comm():
    """A counted hpcopt Comm over a duplicate of COMM_WORLD, freed after the test."""
    from hpcopt.comm import Comm

    c = Comm()
    yield c
    c.free()
