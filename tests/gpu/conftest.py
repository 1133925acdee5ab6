"""Every test here runs only where CuPy finds a CUDA device (or on the emulated CuPy of
tests/emulated_gpu); everywhere else each is skipped with the reason, so the suite still
collects them. All of them carry the ``gpu`` marker."""

from __future__ import annotations

import pytest

from tests.conftest import skip_without_gpu


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/gpu/" in item.nodeid:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(autouse=True)
def _needs_gpu():
    skip_without_gpu()


@pytest.fixture
def cupy():
    import cupy

    return cupy
