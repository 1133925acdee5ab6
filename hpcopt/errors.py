"""The one error type of the library: input it cannot use, for the caller to fix."""

from __future__ import annotations


class HpcoptError(Exception):
    """Bad configuration, a bad or damaged input file, or an impossible request.

    Library code raises it like any exception (catch it in Python); the command line prints it
    as one line and exits with ``exit_code`` (2; 3 for a diverged run), without a traceback.
    ``everywhere`` is True once every rank is known to raise it (``hpcopt.comm.agreed``): then
    each rank exits by itself and only rank 0 prints. Otherwise the failing rank prints the
    message with its rank and aborts the job, so the other ranks cannot hang.
    """

    exit_code = 2

    def __init__(self, message: str, everywhere: bool = False) -> None:
        super().__init__(message)
        self.everywhere = everywhere
