"""What the MPI and HDF5 libraries in this environment can do."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Mapping

#: Prefixes of the variables by which a launcher (MPICH's Hydra, Open MPI's PRRTE, PMIx, Slurm's
#: PMI) tells a process that it is one rank of a job. A child process started without them
#: initializes MPI as a singleton instead of joining (and confusing) the parent's job.
LAUNCHER_VARIABLE_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "OMPI_COMM_WORLD_", "OMPI_UNIVERSE_",
                              "OMPI_WORLD_", "OMPI_FILE_LOCATION", "OMPI_COMMAND", "OMPI_ARGV",
                              "OMPI_NUM_APP_CTX", "OMPI_TOOL_NAME", "OMPI_MCA_num_procs",
                              "OMPI_MCA_initial_wdir", "PRTE_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")

#: The user's own settings among those prefixes (Open MPI's ``PRTE_MCA_*`` and ``PMIX_MCA_*``
#: parameters: mapping policy, signal forwarding): a child keeps them.
USER_SETTING_PREFIXES = ("PRTE_MCA_", "PMIX_MCA_")


def mpi_library() -> str:
    """The first line of ``MPI.Get_library_version()``, printable: Open MPI's string ends in a NUL
    byte (and h5py refuses NULs in string attributes), so every control character is dropped,
    and runs of spaces are one (MPICH pads its: "MPICH Version:      5.0.2")."""
    from mpi4py import MPI

    text = MPI.Get_library_version().replace("\0", "").strip()
    first = text.splitlines()[0] if text else "unknown MPI library"
    return " ".join("".join(ch for ch in first if ch.isprintable()).split())


def library_versions() -> dict[str, str]:
    """mpi4py's version and the MPI library's (``mpi_library``), as a run's files store them."""
    import mpi4py

    return {"mpi4py_version": mpi4py.__version__, "mpi_library": mpi_library()}


def open_mpi() -> bool:
    """Whether the MPI library mpi4py loaded is Open MPI (whose ``mpirun`` kills the ranks it
    forwards SIGTERM or SIGINT to: docs/failures.md, "Launchers")."""
    return mpi_library().startswith("Open MPI")


def launcher_stop_signal(signum: int) -> int:
    """The signal to send this MPI's launcher (``mpiexec``) so that its ranks stop as ``signum``
    (SIGTERM, SIGINT) asks: ``signum`` itself, but SIGUSR1 (a SIGTERM to hpcopt) for Open MPI's
    ``mpirun``, which kills the ranks half a second after it forwards SIGTERM or SIGINT
    (docs/failures.md, "Launchers")."""
    return signal.SIGUSR1 if open_mpi() else signum


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
    child process that must run MPI on its own. MPI settings (``OMPI_MCA_*``, ``PRTE_MCA_*``,
    ``PMIX_MCA_*``, ``MPIR_CVAR_*``, ``UCX_*``) are kept: they decide whether the library handles
    device memory, and how a child's own ``mpiexec`` maps and signals its ranks."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items()
            if name.startswith(USER_SETTING_PREFIXES) or not name.startswith(LAUNCHER_VARIABLE_PREFIXES)}


def parallel_hdf5() -> bool:
    """Whether h5py was built against a parallel (MPI) HDF5, so the ``mpio`` driver exists."""
    import h5py

    return bool(h5py.get_config().mpi)

