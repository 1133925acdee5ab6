"""Every test here runs only where CuPy finds a CUDA device (or on the emulated CuPy of
tests/emulated_gpu); everywhere else each is skipped with the reason, so the suite still
collects them. All of them carry the ``gpu`` marker."""

from __future__ import annotations

import pytest

from tests.conftest import skip_without_gpu
from tests.gpu.tiny_images import write_tiny_mnist
from tests.mpi.lm_corpus import write_tiny_ptb


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/gpu/" in item.nodeid:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(autouse=True)
def _needs_gpu():
    skip_without_gpu()


@pytest.fixture
def shared_dir(shared_dir, comm):
    """The shared directory with a tiny PTB corpus (``ptb/``) and image set (``images/``), so
    the GPU tests need no data-set package."""
    if comm.rank == 0:
        write_tiny_ptb(shared_dir / "ptb")
        write_tiny_mnist(shared_dir / "images")
    comm.mpi.Barrier()
    return shared_dir


@pytest.fixture
def cupy():
    import cupy

    return cupy
