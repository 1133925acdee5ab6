"""Errors that are the user's to fix: printed as one line, exit code 2, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad configuration, bad input file or an impossible request.

    ``everywhere`` is True once every rank is known to raise it (see ``hpcopt.comm.agreed``):
    then each rank exits 2 by itself and only rank 0 prints. Otherwise the failing rank prints
    the message with its rank and aborts the job, so the other ranks cannot hang.
    """

    exit_code = 2

    def __init__(self, message: str, everywhere: bool = False) -> None:
        super().__init__(message)
        self.everywhere = everywhere
