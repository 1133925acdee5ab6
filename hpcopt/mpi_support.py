"""What the MPI and HDF5 libraries in this environment can do."""

from __future__ import annotations

import ctypes
import os

LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS")


def cuda_aware_mpi() -> tuple[bool | None, str]:
    """(answer, why): ``MPIX_Query_cuda_support`` looked up in the MPI library mpi4py loaded.

    None means the library has no such query (then the answer is unknown, and hpcopt stages
    device buffers through host memory unless ``HPCOPT_GPU_AWARE_MPI=1`` says otherwise).
    """
    override = os.environ.get("HPCOPT_GPU_AWARE_MPI", "").strip()
    if override in ("0", "1"):
        return override == "1", f"set by HPCOPT_GPU_AWARE_MPI={override}"
    from mpi4py import MPI

    try:
        query = ctypes.CDLL(MPI.__file__).MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None, "the MPI library has no MPIX_Query_cuda_support"
    query.restype = ctypes.c_int
    answer = bool(query())
    return answer, f"MPIX_Query_cuda_support() returned {int(answer)}"


def parallel_hdf5() -> bool:
    """Whether h5py was built against a parallel (MPI) HDF5, so the ``mpio`` driver exists."""
    import h5py

    return bool(h5py.get_config().mpi)


def launcher_size() -> int | None:
    """World size the launcher announced in the environment, if it did (to catch singletons)."""
    for name in LAUNCHER_SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None
