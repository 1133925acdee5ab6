"""Shared test set-up.

Array tests take the ``xp`` fixture (numpy, then cupy) or ``device`` ("cpu", then "gpu"): the
cupy/gpu case is marked ``gpu`` and skipped, with the reason, where CuPy finds no GPU. On the
emulated CuPy of tests/emulated_gpu (first on PYTHONPATH) those cases run without a GPU.

Under ``mpiexec ... pytest --with-mpi`` a failing test on one rank would leave the other ranks
waiting in the next collective forever. The hook below prints the failure (prefixed with the
rank) and aborts the whole MPI job at once, turning a hang into a failure in well under a second.
An MPI test marked ``sizes(2, 4)`` runs only at those world sizes (tests/run.sh runs the MPI
tests at 1, 2, 3 and 4 ranks).

A test that needs an optional package (torch, the tensorboard extra, safetensors) is marked
``extra``, so that ``tests/run.sh extras`` runs just those once the packages are installed. A
test skipped for such a package without the mark (or a test module skipped at collection that
does not declare it) fails the session: an unmarked one would be run by neither pass.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest


def _world_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size() if MPI.Is_initialized() else 1


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("sizes")
    if marker is not None and item.config.getoption("with_mpi", default=False):
        from mpi4py import MPI

        size = MPI.COMM_WORLD.Get_size()
        if size not in marker.args:
            pytest.skip(f"runs at {', '.join(map(str, marker.args))} rank(s) only, not at {size}")


# a skip reason that names an optional package, and the tests skipped so without the mark
OPTIONAL_PACKAGE = re.compile(r"\b(torch|tensorboard\w*|safetensors)\b")
_unmarked_extras: list[str] = []


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped and OPTIONAL_PACKAGE.search(_skip_reason(report)):
        source = Path(str(report.fspath)).read_text()
        if "pytest.mark.extra" not in source:
            _unmarked_extras.append(f"{report.nodeid} (add `pytestmark = pytest.mark.extra`)")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _unmarked_extras:
        lines = "\n".join(f"  {name}" for name in _unmarked_extras)
        print(f"\nskipped for an optional package but not marked `extra` (tests/run.sh extras "
              f"would never run them):\n{lines}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and item.get_closest_marker("extra") is None
            and OPTIONAL_PACKAGE.search(_skip_reason(report))):
        _unmarked_extras.append(f"{item.nodeid} (add @pytest.mark.extra)")
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


@functools.lru_cache(maxsize=1)
def gpu_missing() -> str | None:
    """Why the GPU cases cannot run here, or None when they can."""
    try:
        import cupy
    except ImportError:
        return "no GPU here: CuPy is not installed (pip install 'hpcopt[gpu]')"
    try:
        count = cupy.cuda.runtime.getDeviceCount() if cupy.cuda.is_available() else 0
    except Exception as exc:  # a missing driver raises from the runtime
        return f"no GPU here: CUDA is not usable ({exc})"
    return None if count else "no GPU here: CuPy finds no CUDA device"


def skip_without_gpu() -> None:
    reason = gpu_missing()
    if reason:
        pytest.skip(reason)


def pytest_report_header(config) -> str:
    reason = gpu_missing()
    if reason:
        return f"GPU cases: skipped ({reason})"
    import cupy

    emulated = " (EMULATED: tests/emulated_gpu, host memory, no GPU)" if getattr(
        cupy, "EMULATED", False) else ""
    return f"GPU cases: CuPy {cupy.__version__}{emulated}"


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module of the test: numpy, then cupy where a GPU is present."""
    if request.param == "numpy":
        return np
    skip_without_gpu()
    import cupy

    return cupy


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request) -> str:
    """The --device of the test's runs: "cpu", then "gpu" where a GPU is present."""
    if request.param == "gpu":
        skip_without_gpu()
    return request.param


def host(array: Any) -> np.ndarray:
    """A NumPy array with the values of ``array`` (a NumPy or CuPy array, or a scalar)."""
    if isinstance(array, np.ndarray) or np.isscalar(array):
        return np.asarray(array)
    import cupy

    return cupy.asnumpy(array)


def on_devices(cases: Sequence[Any], gpu_cases: Sequence[Any]) -> list[Any]:
    """Parametrize values ``(case, device)``: every case on "cpu", then ``gpu_cases`` again on
    "gpu" (marked ``gpu``), for a test that takes ``device`` indirectly (``indirect=["device"]``)
    and runs on the GPU only the cases where its path differs."""
    return [*((case, "cpu") for case in cases),
            *(pytest.param(case, "gpu", marks=pytest.mark.gpu) for case in gpu_cases)]


def use_device(comm: Any, device: str) -> Any:
    """``comm`` with the backend of ``device`` ("gpu": this rank's GPU by its node-local rank,
    selected as train() selects it), so Comm accepts that device's buffers."""
    if device == "gpu":
        from hpcopt.backend import get_backend
        from hpcopt.comm import node_layout

        comm.backend = get_backend("gpu", local_rank=node_layout(comm.mpi)[0])
    return comm


@pytest.fixture
def gpu_comm(comm):
    """``comm`` with this rank's GPU backend (skipped where there is no GPU)."""
    skip_without_gpu()
    return use_device(comm, "gpu")


def data_pointer(array: Any) -> int:
    """The address of a NumPy or CuPy array's data (to check that a buffer was not reallocated)."""
    interface = getattr(array, "__cuda_array_interface__", None) or array.__array_interface__
    return interface["data"][0]
