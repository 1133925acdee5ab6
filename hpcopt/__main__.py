"""``python -m hpcopt``: run the CLI so that one failing rank ends the whole job.

A HpcoptError prints one line (``hpcopt: error: ...``) and exits with status 2; when it was raised
on every rank, every rank exits 2 by itself. Any other exception prints its traceback once, with
each line prefixed by the rank, and calls MPI_Abort so the ranks waiting in a collective do not
hang (the behaviour of ``python -m mpi4py``).
"""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
