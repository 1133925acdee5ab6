"""``python -m hpcopt``: run the CLI so that one failing rank ends the whole job.

A HpcoptError prints one line (``hpcopt: error: ...``) and exits with status 2; when it was raised
on every rank, every rank exits 2 by itself. Any other exception prints its traceback once, with
each line prefixed by the rank, and calls MPI_Abort so the ranks waiting in a collective do not
hang (the behaviour of ``python -m mpi4py``). SIGTERM and SIGINT are handled from the start,
before the rest of hpcopt is imported (``hpcopt.run.signals``).
"""

from __future__ import annotations

import sys

from .run.signals import JobSignals

if __name__ == "__main__":
    with JobSignals():
        from .cli import main

        sys.exit(main())
