"""hpcopt: distributed optimization over MPI (PR-SGD, CELGC, SlowMo, PPRS) on one engine.

Importing hpcopt is cheap: it loads neither MPI, CuPy, h5py nor matplotlib; the names below
are imported on first use.

- ``train(config, ..., workload=None)``: run a configured algorithm (``hpcopt.run``);
- ``Config``, ``build_config``: the run's configuration (``hpcopt.config``);
- ``Workload``: a data-parallel problem from user code (``hpcopt.workload``);
- ``Comm``: the communicator every byte goes through (``hpcopt.comm``);
- ``registry()``: the registered algorithm classes by name (``hpcopt.algorithms.registration``);
- ``HpcoptError``: what the library raises for bad input (the CLI prints it, exit 2).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "train": "hpcopt.run",
    "Config": "hpcopt.config",
    "build_config": "hpcopt.config",
    "Workload": "hpcopt.workload",
    "Comm": "hpcopt.comm",
    "HpcoptError": "hpcopt.errors",
    "registry": "hpcopt.algorithms.registration",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hpcopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
