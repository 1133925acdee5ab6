"""``python -m hpcopt``: run the CLI so that one failing rank ends the whole job.

A HpcoptError prints one line (``hpcopt: error: ...``) and exits with status 2; when it was raised
on every rank, every rank exits 2 by itself. Any other exception prints its traceback once, with
each line prefixed by the rank, and calls MPI_Abort so the ranks waiting in a collective do not
hang (the behaviour of ``python -m mpi4py``). SIGTERM and SIGINT are handled from hpcopt's first
line on: until ``hpcopt.run.signals`` is imported a handler only notes them (no default action:
no death by SIGTERM, no KeyboardInterrupt), and its handlers then act on the ones noted; once
the exit code is known, both are ignored.
"""

from __future__ import annotations

import signal

#: The signals that came before hpcopt.run.signals took over.
EARLY: list[int] = []
if __name__ == "__main__":
    for _signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):  # run.signals.SIGNALS, not yet imported
        signal.signal(_signum, lambda signum, _: EARLY.append(signum))

import sys  # noqa: E402

from .run.signals import SIGNALS, JobSignals  # noqa: E402

if __name__ == "__main__":
    with JobSignals(early=EARLY):
        from .run.mpi_start import start

        start(sys.argv[1:])  # MPI_Init: a rank lost in it ends the others (--with-ft ulfm)
        from .cli import main

        code = main()
    # The exit code is settled. Python's shutdown gives the signals their default action back
    # before MPI_Finalize: a second Ctrl-C there would end the rank by SIGINT instead (exit 255
    # from mpiexec, -2 alone).
    for _signum in SIGNALS:
        signal.signal(_signum, signal.SIG_IGN)
    sys.exit(code)
