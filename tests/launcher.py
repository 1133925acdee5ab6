"""What differs between the MPI launchers the suite runs under (MPICH's Hydra ``mpiexec`` and
Open MPI's ``mpirun``), in one place: docs/failures.md, "Launchers"."""

from __future__ import annotations

import re

import pytest

from hpcopt.comm.mpi_support import open_mpi

#: Where each launcher tells a process its rank (not PMIx's or Slurm's variables, which a test
#: run inside a batch job would also find on mpiexec itself).
RANK_VARIABLES = (b"PMI_RANK", b"OMPI_COMM_WORLD_RANK")
#: Open MPI's ``mpirun`` answers SIGTERM and SIGINT by killing every rank within 0.5 s, and
#: forwards SIGUSR1 (hpcopt's SIGTERM that launchers leave alone) as it is.
OPEN_MPI = open_mpi()
#: The mark of a test that sends SIGTERM or SIGINT to ``mpiexec`` and expects a checkpoint.
FORWARDS_TERM_AND_INT = pytest.mark.skipif(
    OPEN_MPI, reason="Open MPI's mpirun kills the ranks 0.5 s after it forwards SIGTERM or SIGINT "
    "(no checkpoint: docs/failures.md#launchers-mpich-and-open-mpi); SIGUSR1 is tested instead")

#: Open MPI's launcher adds its own banners (between two rules of dashes) and PMIx errors to a
#: job's stderr when a rank exits non-zero or aborts.
_RULE = re.compile(r"^-{20,}$")
_PMIX_ERROR = re.compile(r"^\[[^\]]*:\d+\] PMIX ERROR")




def rank_lines(stderr: str) -> list[str]:
    """The non-blank lines of a job's ``stderr`` that its ranks printed: without the launcher's
    banners and PMIx errors."""
    lines, in_banner = [], False
    for line in stderr.splitlines():
        if _RULE.match(line.strip()):
            in_banner = not in_banner
        elif line.strip() and not in_banner and not _PMIX_ERROR.match(line):
            lines.append(line)
    return lines
