"""Surviving a lost rank with Open MPI's ULFM (User Level Failure Mitigation, MPI 4's FT proposal).

Under ``mpirun --with-ft ulfm`` a collective in which a rank has died (a signal, ``kill -9``,
its node lost; not a rank that exits with a non-zero status, nor one that calls MPI_Abort,
which ends the job) returns ``MPI_ERR_PROC_FAILED`` on some survivors and, once one of them
revokes the communicator, ``MPI_ERR_REVOKED`` on the others (mpi4py raises them as
``MPI.Exception``; it sets ``MPI_ERRORS_RETURN`` on every communicator). The survivors then
revoke it (so that none waits in a call the others left), shrink it to a communicator of
themselves (``MPIX_Comm_shrink``), whose group tells who failed. Some
survivors may have completed the collective that others saw fail, so what each completed is
agreed on the new communicator (``agree_min``). MPICH's wheel has no working ULFM: there
``unavailable`` says why, and a lost rank ends the job as before.

Collectives on the path of a run that survives a loss take fixed-size buffers, never pickles
(``hpcopt.comm.core.gather_texts``): a collective broken by a lost rank then raises its MPI
error, which is recognised, instead of a bad pickle's, which is not. Where the survivors cannot
go on (``RankLossEnd``: set-up, the exit path, rank 0 lost) they revoke the job's communicator
(``watch``), so that none waits for ever, shrink it to learn who was lost, and the lowest
survivor prints one line; each exits 6 without MPI_Finalize, which would wait for the lost rank.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .mpi_support import mpi_library, open_mpi

#: What Open MPI's ``mpirun --with-ft ulfm`` sets in every rank's environment.
FT_VARIABLE = "OMPI_MCA_mpi_ft_enable"
#: The error classes by which a call reports a lost rank: failed, failed with a receive from
#: any source pending, or revoked by a survivor that saw the failure first; and a wait on several
#: requests, whose statuses hold those (``shrink`` then finds whether a rank was lost).
LOSS_CLASSES = tuple(getattr(MPI, name) for name in
                     ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED", "ERR_IN_STATUS")
                     if hasattr(MPI, name))


def unavailable() -> str:
    """Why this job cannot survive a lost rank ("" when it can): Open MPI with its ULFM
    functions in mpi4py, and fault tolerance switched on at launch (``mpirun --with-ft ulfm``,
    which sets ``OMPI_MCA_mpi_ft_enable``)."""
    if not open_mpi():
        return f"this MPI is {mpi_library()}, and only Open MPI's ULFM lets the survivors go on"
    if not all(hasattr(MPI.Comm, name) for name in ("Revoke", "Shrink")):
        return "this mpi4py has no Comm.Revoke and Comm.Shrink (mpi4py >= 4.0 has them)"
    if os.environ.get(FT_VARIABLE, "").lower() not in ("1", "true", "yes", "on"):
        return "fault tolerance is off: launch with mpirun --with-ft ulfm"
    return ""


def is_rank_loss(exc: BaseException) -> bool:
    """Whether ``exc`` is an MPI call's report of a lost rank (``LOSS_CLASSES``)."""
    return isinstance(exc, MPI.Exception) and exc.Get_error_class() in LOSS_CLASSES


@dataclass(frozen=True)
class Shrunk:
    """The survivors' communicator, the world ranks lost, and the seconds the shrink took."""

    mpi: MPI.Comm
    lost: tuple[int, ...]  # ranks of MPI.COMM_WORLD
    seconds: float


def shrink(comm: MPI.Comm) -> Shrunk:
    """Collective on the survivors of ``comm``: revoke it, shrink it to them (their order kept)
    and name the failed ranks (as ranks of COMM_WORLD)."""
    start = time.perf_counter()
    comm.Revoke()
    survivors = comm.Shrink()
    before, after, world = comm.Get_group(), survivors.Get_group(), MPI.COMM_WORLD.Get_group()
    failed = MPI.Group.Difference(before, after)  # the same on every survivor, unlike Get_failed
    try:
        lost = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), world)
    finally:
        for group in (before, after, world, failed):
            group.Free()
    survivors.Set_errhandler(MPI.ERRORS_RETURN)
    return Shrunk(survivors, tuple(sorted(int(r) for r in lost)), time.perf_counter() - start)


def agree_min(comm: MPI.Comm, value: int) -> int:
    """The smallest ``value`` over the ranks of ``comm`` (the survivors' communicator)."""
    smallest = np.array([value], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, smallest, op=MPI.MIN)
    return int(smallest[0])


#: The communicator of the job's run (``watch``), revoked when a loss ends the job, and where
#: the run is (``moment``), for the line.
_watched: dict[str, MPI.Comm | str] = {}


def watch(comm: MPI.Comm | None) -> None:
    """Make ``comm`` the communicator a loss that cannot be survived revokes (``ended``); None:
    none (``--on-rank-loss abort``: a loss ends the job by MPI_Abort)."""
    _watched.clear()
    if comm is not None:
        _watched.update(comm=comm, moment="during set-up")


def moment(where: str) -> None:
    """Where the run is now ("during set-up", "after the last step"), for ``ended``'s line."""
    if _watched:
        _watched["moment"] = where


def watched() -> MPI.Comm | None:
    """The communicator ``watch`` named, or None."""
    comm = _watched.get("comm")
    return comm if isinstance(comm, MPI.Comm) else None


@dataclass(frozen=True)
class RankLossEnd:
    """How the survivors of a loss they cannot go on from end: ``line`` for the lowest survivor
    to print (``reports``), every survivor the same exit code."""

    line: str
    reports: bool


def ended(exc: BaseException) -> RankLossEnd:
    """Collective on the survivors of the watched communicator (``watch``), where ``exc`` is a
    lost rank's report outside the loop that survives it (``moment``): revoke and shrink it, and
    say who was lost in one line, for the lowest survivor."""
    comm = watched()
    assert comm is not None, "watch() names the communicator first"
    shrunk = shrink(comm)
    try:
        lost = ", ".join(map(str, shrunk.lost)) or "a rank"
        return RankLossEnd(f"rank {lost} lost {_watched['moment']} ({error_name(exc)}): the survivors "
                           "cannot go on "
                           "and the job ends; run it again (or resume its last checkpoint)",
                           shrunk.mpi.Get_rank() == 0)
    finally:
        shrunk.mpi.Free()


def error_name(exc: BaseException) -> str:
    """The MPI error class of a lost rank's report, by name."""
    if isinstance(exc, MPI.Exception):
        return next((name for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED",
                                       "ERR_IN_STATUS")
                     if getattr(MPI, name, None) == exc.Get_error_class()), "an MPI error")
    return type(exc).__name__
