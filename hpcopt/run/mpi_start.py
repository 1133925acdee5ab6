"""MPI's start under ``mpirun --with-ft ulfm``: a rank lost while MPI starts ends the others.

Open MPI's ``MPI_Init`` waits for every rank of the job (a PMIx fence). Launched with fault
tolerance on, ``mpirun`` does not end the job when a rank dies, and no MPI call can report the
loss yet: a rank killed before or while MPI starts (``kill -9`` in a job's first second, an
``os._exit`` at import) left the others waiting in ``MPI_Init`` for ever. Under fault tolerance
(``OMPI_MCA_mpi_ft_enable``, what ``--with-ft ulfm`` sets) with ``--stall-timeout S`` on the
command line, ``start`` starts MPI under a timer: when it has not started after
``max(S, MIN_SECONDS)`` seconds (ranks start Python at different times), the rank says so in
one line and exits 6 (docs/failures.md). It calls ``MPI_Init_thread`` (MPI_THREAD_MULTIPLE,
as mpi4py asks) through ``ctypes``, which lets the timer's thread run meanwhile (mpi4py's
import holds the interpreter's lock in it); mpi4py then finds MPI started, and finalizes it at
exit as it would have. No other rank can be asked which ranks still run: a rank prints its line
unless a rank of the same job with a lower number runs (not stopped) on its node (the one that
prints stays ``LINGER_SECONDS``), so the job prints one line a node. This module imports
nothing of MPI before the timer runs.

``--comm-progress mpich-thread`` on the command line turns MPICH's progress thread on here, by
``MPIR_CVAR_ASYNC_PROGRESS=1`` in the environment before MPI starts (MPICH reads it only then;
``hpcopt.comm.progress``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

#: The least seconds MPI's start is given before a lost rank is assumed.
MIN_SECONDS = 10.0
#: Seconds the rank that prints stays, so that the ranks above it find it running.
LINGER_SECONDS = 2.0
#: The exit code of a job whose lost rank its survivors cannot go on from (hpcopt.errors).
EXIT_NOT_CONTINUED = 6
_FT_VARIABLE = "OMPI_MCA_mpi_ft_enable"  # hpcopt.comm.ulfm.FT_VARIABLE, which imports MPI
_RANK, _JOB = "OMPI_COMM_WORLD_RANK", "PMIX_NAMESPACE"
_THREAD_MULTIPLE = 3  # Open MPI's MPI_THREAD_MULTIPLE
_MPICH_ASYNC = "MPIR_CVAR_ASYNC_PROGRESS"  # hpcopt.comm.progress.MPICH_ASYNC, which imports MPI


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` (``--name``) first given in ``argv`` (``--name V`` or ``--name=V``)."""
    for i, word in enumerate(argv):
        value = word.partition("=")[2] if word.startswith(f"{flag}=") else \
            argv[i + 1] if word == flag and i + 1 < len(argv) else None
        if value is not None:
            return value
    return None


def stall_timeout(argv: Sequence[str]) -> float:
    """The ``--stall-timeout`` given in ``argv`` (0 for none or one that is no number)."""
    value = flag_value(argv, "--stall-timeout")
    try:
        return max(float(value), 0.0) if value is not None else 0.0
    except ValueError:
        return 0.0


def start(argv: Sequence[str]) -> None:
    """Start MPI, under the timer where fault tolerance is on and ``argv`` sets a stall timeout;
    with MPICH's progress thread where ``argv`` asks for it (``--comm-progress mpich-thread``)."""
    if flag_value(argv, "--comm-progress") == "mpich-thread":
        os.environ[_MPICH_ASYNC] = "1"
    seconds = stall_timeout(argv)
    if os.environ.get(_FT_VARIABLE, "").lower() not in ("1", "true", "yes", "on") or not seconds:
        return
    limit = max(seconds, MIN_SECONDS)
    timer = threading.Timer(limit, _lost, args=(limit,))
    timer.daemon = True
    timer.start()
    spec = importlib.util.find_spec("mpi4py.MPI")  # its library, loaded, resolves libmpi's names
    if spec is not None and spec.origin:
        provided = ctypes.c_int()
        ctypes.CDLL(spec.origin).MPI_Init_thread(None, None, _THREAD_MULTIPLE, ctypes.byref(provided))
    import mpi4py

    mpi4py.rc.finalize = True  # as when mpi4py starts MPI itself
    import mpi4py.MPI  # noqa: F401 - MPI started above (or here, where ctypes found no library)
    timer.cancel()


def _lost(seconds: float) -> None:
    """MPI has not started within ``seconds``: one line (``_reports``), exit 6 at once."""
    if _reports():
        sys.stderr.write(f"hpcopt: error: MPI has not started within {seconds:g} s (--stall-timeout, at "
                         f"least {MIN_SECONDS:g} s): a rank was lost as the job started, so the "
                         "survivors cannot go on and the job ends; run it again\n")
        sys.stderr.flush()
        time.sleep(LINGER_SECONDS)  # the ranks above find this one running: they print nothing
    else:  # after the one that prints: mpirun may drop its line once a rank has exited non-zero
        time.sleep(2 * LINGER_SECONDS)
    os._exit(EXIT_NOT_CONTINUED)


def _reports() -> bool:
    """Whether no rank of this job with a lower number runs on this node (Linux ``/proc``; True
    where that cannot be read)."""
    mine, job = os.environ.get(_RANK, ""), os.environ.get(_JOB, "")
    if not mine.isdigit() or not job:
        return True
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == str(os.getpid()):
            continue
        try:
            environ = dict(item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0")
                           if b"=" in item)
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, ValueError):
            continue
        rank = environ.get(_RANK.encode(), b"")
        if (environ.get(_JOB.encode()) == job.encode() and rank.isdigit() and int(rank) < int(mine)
                and state not in ("T", "t", "Z", "X")):
            return False
    return True
