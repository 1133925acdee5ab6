"""``hpcopt info``: versions, MPI library, world size, threads, GPU and HDF5 support."""

from __future__ import annotations

import importlib.metadata
import platform

from mpi4py import MPI

from . import __version__
from .comm import Comm, node_layout
from .comm.launcher import SRUN, Launch, detect, singleton_problem
from .comm.mpi_support import cuda_aware_mpi, mpi_library, parallel_hdf5
from .comm.staging import gpu_report
from .run.threads import configure_threads

PACKAGES = ("numpy", "mpi4py", "h5py", "threadpoolctl", "cupy-cuda12x", "matplotlib", "mlxtend",
            "scikit-learn", "torch")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _launcher_text(launch: Launch) -> str:
    if not launch.launcher:
        return "none known (a singleton, or a launcher that says nothing in the environment)"
    plugin = f", MPI plugin {launch.mpi_type or 'none'}" if launch.launcher == SRUN else ""
    started = f"{launch.processes} process(es)" if launch.processes is not None else "an unknown number"
    return f"{launch.launcher} ({started}{plugin})"


def info_lines(comm: Comm) -> list[str]:
    local_rank, local_size = node_layout(comm.mpi)
    threads = configure_threads(local_size)
    launch = detect()
    problem = singleton_problem(comm.size, mpi_library(), launch)
    size_note = f"  <-- {problem}" if problem else ""
    aware, why = cuda_aware_mpi()
    aware_text = {True: "yes", False: "no", None: "unknown"}[aware]
    gpu, transfers = gpu_report(local_rank)
    lines = [
        f"hpcopt          {__version__}",
        f"python          {platform.python_version()} ({platform.machine()})",
        *(f"{name:<15} {_version(name)}" for name in PACKAGES),
        f"MPI library     {mpi_library()} (MPI {'.'.join(map(str, MPI.Get_version()))})",
        f"world size      {comm.size} ({local_size} rank(s) on this node){size_note}",
        f"launcher        {_launcher_text(launch)}",
        f"threads         {threads.describe()}",
        f"CUDA-aware MPI  {aware_text} ({why})",
        f"GPU             {gpu}",
        f"GPU buffers     {transfers}",
        f"parallel HDF5   {'yes (h5py mpio driver)' if parallel_hdf5() else 'no (one writer per file)'}",
    ]
    return lines


def print_info(comm: Comm) -> None:
    lines = info_lines(comm)
    if comm.rank == 0:
        print("\n".join(lines), flush=True)
