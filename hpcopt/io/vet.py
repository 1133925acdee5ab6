"""The child process that reads an untrusted checkpoint or trace whole before a job does:
``python -m hpcopt.io.vet FILE`` (a checkpoint of either kind) or ``--traces FILE...``.

It opens each file, checks what it holds (``hpcopt.io.structure``: no links out of it, no more
declared data than it holds), then a checkpoint's content digest and format, or a trace's rows
and timeline (reading every attribute and dataset), and prints ``ok``; a failed check is one
``hpcopt: error:`` line and exit status 2. Damaged HDF5 metadata can crash the HDF5 C library
itself, so this runs in a process of its own: ``hpcopt.run.vetting`` starts it and turns a
crash or a hang into one error line. The readers never start it themselves: vetting is their
caller's first step.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import HpcoptError

READING = "reading "  # the child's line before each trace


def check(path: Path) -> None:
    """The digest and format of a checkpoint of either kind (data-parallel or pipeline)."""
    from . import data_parallel_checkpoint as data_parallel_format
    from . import pipeline_checkpoint as pipeline_format
    from .digest import check_sealed

    with data_parallel_format.opened(path) as (path, f):
        kinds = {pipeline_format.FORMAT: (pipeline_format, "pipeline checkpoint")}
        module, kind = kinds.get(f.attrs.get("format"), (data_parallel_format, "checkpoint"))
        check_sealed(f, path, module.FORMAT, module.READABLE, kind)


def main(argv: list[str]) -> int:
    """``FILE`` (a checkpoint) or ``--traces FILE...``; prints ``ok`` when all is well."""
    try:
        if argv[0] == "--traces":
            from .timeline import read_timeline
            from .trace import read_trace

            for path in argv[1:]:
                print(f"{READING}{path}", flush=True)
                read_trace(path)
                read_timeline(path)
        else:
            check(Path(argv[0]))
    except HpcoptError as exc:
        print(f"hpcopt: error: {exc}", file=sys.stderr)
        return 2
    print("ok")
    return 0


if __name__ == "__main__":
    # the readers' imports load mpi4py (hpcopt.config names hpcopt.comm's modes): no MPI here
    os.environ["MPI4PY_RC_INITIALIZE"] = os.environ["MPI4PY_RC_FINALIZE"] = "false"
    sys.exit(main(sys.argv[1:]))
