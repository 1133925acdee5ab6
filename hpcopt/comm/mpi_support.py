"""What the MPI and HDF5 libraries in this environment can do."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS")

#: Prefixes of the variables by which a launcher (MPICH's Hydra, Open MPI's PRRTE, PMIx, Slurm's
#: PMI) tells a process that it is one rank of a job. A child process started without them
#: initializes MPI as a singleton instead of joining (and confusing) the parent's job.
LAUNCHER_VARIABLE_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "OMPI_COMM_WORLD_", "OMPI_UNIVERSE_",
                              "OMPI_FILE_LOCATION", "PRTE_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")


def cuda_aware_mpi() -> tuple[bool | None, str]:
    """(answer, why): ``MPIX_Query_cuda_support`` looked up in the MPI library mpi4py loaded.

    None means the library has no such query (MPICH and Open MPI have it; others may not).
    The user's override and the decision what to do with device buffers are in
    ``hpcopt.comm.staging``.
    """
    from mpi4py import MPI

    try:
        query = ctypes.CDLL(MPI.__file__).MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None, "the MPI library has no MPIX_Query_cuda_support"
    query.restype = ctypes.c_int
    answer = bool(query())
    return answer, f"MPIX_Query_cuda_support() returned {int(answer)}"


def singleton_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) without the launcher's per-job variables, for a
    child process that must run MPI on its own. MPI settings (``OMPI_MCA_*``, ``MPIR_CVAR_*``,
    ``UCX_*``) are kept, since they decide whether the library handles device memory."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items()
            if not name.startswith(LAUNCHER_VARIABLE_PREFIXES)}


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
