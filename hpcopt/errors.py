"""The one error type of the library (input it cannot use, for the caller to fix), and how a
failure on one rank ends the whole job."""

from __future__ import annotations

import difflib
import os
import sys
import time
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """"; did you mean X?" for the one of ``choices`` closest to a mistyped ``word`` (difflib's
    ratio, at least 0.6), or "" when none is close: argparse before Python 3.12 suggests none."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]}?" if close else ""


#: Exit codes of ``--on-rank-loss continue`` (docs/failures.md, "Exit codes"): the job finished
#: on the survivors of a lost rank, or a rank was lost and the survivors could not go on.
EXIT_CONTINUED = 5
EXIT_NOT_CONTINUED = 6


class HpcoptError(Exception):
    """Bad configuration, a bad or damaged input file, or an impossible request.

    Library code raises it like any exception (catch it in Python); the command line prints it
    as one line and exits with ``exit_code`` (2; 3 for a diverged run), without a traceback.
    ``everywhere`` is True once every rank is known to raise it (``hpcopt.comm.agreed``): then
    each rank exits by itself and only rank 0 prints. Otherwise the failing rank prints the
    message with its rank and aborts the job, so the other ranks cannot hang.
    """

    exit_code = 2
    #: Whether this rank prints an error raised everywhere: None for rank 0 (a rank lost under
    #: ``--on-rank-loss continue`` may be rank 0: then the lowest survivor prints).
    reports: bool | None = None

    def __init__(self, message: str, everywhere: bool = False) -> None:
        super().__init__(message)
        self.everywhere = everywhere


def abort_job(text: str, code: int) -> None:
    """Write ``text`` to stderr and end the whole MPI job with exit status ``code`` (from any
    thread; MPI_Abort where MPI runs on several ranks, else this process alone)."""
    sys.stderr.write(text)
    sys.stderr.flush()
    time.sleep(0.2)  # let the launcher forward the message before MPI_Abort tears the job down
    mpi = sys.modules.get("mpi4py.MPI")  # MPI is never started here, only used if it runs
    try:
        several = mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() \
            and mpi.COMM_WORLD.Get_size() > 1
    except AttributeError:  # mpi4py.MPI is being imported right now: MPI is not running yet
        several = False
    if mpi is not None and several:
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)
