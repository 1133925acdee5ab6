"""Which launcher started this process, how many processes it started, and whether they joined
one MPI world.

A launcher says so in the environment it gives each process:

- Slurm's ``srun`` (a job step): ``SLURM_STEP_NUM_TASKS`` processes, MPI plugin
  ``SLURM_MPI_TYPE`` (absent with ``--mpi=none``, the default on Debian's and many sites'
  Slurm, under which an MPI library finds no process manager and starts a world of 1);
- MPICH's Hydra ``mpiexec``: ``PMI_SIZE`` processes (and ``MPI_LOCALNRANKS``), also when its
  proxies run as a Slurm step inside an allocation;
- Open MPI's ``mpirun`` (PRRTE): ``OMPI_COMM_WORLD_SIZE`` processes (and ``PRTE_LAUNCHED``).

``SLURM_NTASKS`` is the allocation's, not the step's: a batch script's own ``python`` or an
``srun -n 1`` inside a 4-task job is a world of 1 by right. A world of 1 where the launcher
started several processes means each trains alone: :func:`singleton_problem` names the cause
and the fix, which ``hpcopt train`` and ``resume`` refuse to start without (every process,
before any file is written) and ``hpcopt info`` reports.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

SRUN, HYDRA, PRRTE = "srun", "mpiexec", "mpirun"
#: srun's MPI plugin each MPI library's wheel needs (Slurm's ``--mpi``, ``SLURM_MPI_TYPE``).
SRUN_MPI_TYPES = {"MPICH": "pmi2", "Open MPI": "pmix"}


@dataclass(frozen=True)
class Launch:
    """How this process was started: ``launcher`` ("srun", "mpiexec" for MPICH's Hydra,
    "mpirun" for Open MPI's PRRTE, "" for none known), the processes it started (None: not
    said) and, under srun, its MPI plugin ("" for none)."""

    launcher: str
    processes: int | None
    mpi_type: str = ""


def _count(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "")
    return int(value) if value.isdigit() else None


def detect(environ: Mapping[str, str] | None = None) -> Launch:
    """The launch that ``environ`` (default: this process's) describes."""
    env = os.environ if environ is None else environ
    if "MPI_LOCALNRANKS" in env or "PMI_HOSTNAME" in env:  # Hydra's own, even over a Slurm step
        return Launch(HYDRA, _count(env, "PMI_SIZE"))
    if "PRTE_LAUNCHED" in env or "OMPI_COMMAND" in env:
        return Launch(PRRTE, _count(env, "OMPI_COMM_WORLD_SIZE"))
    if "SLURM_STEP_ID" in env:
        return Launch(SRUN, _count(env, "SLURM_STEP_NUM_TASKS"), env.get("SLURM_MPI_TYPE", ""))
    for name, launcher in (("PMI_SIZE", HYDRA), ("OMPI_COMM_WORLD_SIZE", PRRTE)):
        if name in env:
            return Launch(launcher, _count(env, name))
    return Launch("", None)


def _library_family(library: str) -> str:
    return "Open MPI" if library.startswith("Open MPI") else "MPICH" if "MPICH" in library else ""


def singleton_problem(world_size: int, library: str, launch: Launch | None = None) -> str:
    """Why the processes do not share one MPI world ("" when they do, or when it cannot be
    told): the launcher started several processes but this one is a world of ``world_size`` 1.
    ``library`` is the MPI library's name (``hpcopt.comm.mpi_support.mpi_library``)."""
    launch = detect() if launch is None else launch
    if world_size != 1 or launch.processes is None or launch.processes <= 1:
        return ""
    started = f"{launch.launcher} started {launch.processes} processes but each is an MPI world of 1"
    if launch.launcher == SRUN:
        needed = SRUN_MPI_TYPES.get(_library_family(library))
        plugin = f"srun's MPI plugin is {launch.mpi_type!r}" if launch.mpi_type else \
            "srun ran with no MPI plugin (--mpi=none, this site's MpiDefault)"
        fix = (f"launch with srun --mpi={needed} (or export SLURM_MPI_TYPE={needed} in the site file)"
               if needed else "launch with the srun --mpi plugin your MPI library supports "
               "(srun --mpi=list)")
        return f"{started}: {plugin}, which {library} does not join; {fix}"
    return (f"{started}: {launch.launcher} and mpi4py come from different MPI libraries "
            f"(mpi4py uses {library}); use the mpiexec of the MPI mpi4py was built with")


def relaunch_command(size: int, launch: Launch | None = None) -> str:
    """How to start ``size`` ranks again the way this job was started: ``srun --mpi=pmi2 -n 2``
    under srun, ``mpirun -n 2`` under Open MPI, else ``mpiexec -n 2``."""
    launch = detect() if launch is None else launch
    if launch.launcher == SRUN:
        return " ".join(["srun", *([f"--mpi={launch.mpi_type}"] if launch.mpi_type else []), f"-n {size}"])
    return f"{launch.launcher or HYDRA} -n {size}"
