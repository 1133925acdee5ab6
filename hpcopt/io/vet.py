"""Read untrusted checkpoints and traces whole in a child process before this process does.

Damaged HDF5 metadata can crash the HDF5 C library itself (a variable-length string attribute
whose heap address was overwritten did, once in 3,600 random byte edits): no Python handler
runs, and an MPI job loses a rank with a signal instead of getting an error. So a resumed run's
rank 0 first runs ``python -m hpcopt.io.vet FILE``, which opens the file, checks what it holds
(``hpcopt.io.structure``: no links out of it, no more declared data than it holds), then its
content digest and format (reading every attribute and dataset, a trace's timeline too). A
crash, a hang or a failed check in the child becomes one error line; once the child has read
the file cleanly, the job reads the same bytes. A checkpoint is vetted once per process (keyed
by its path, size and modification time). ``hpcopt report`` does the same for the traces it
reads (``python -m hpcopt.io.vet --traces FILE...``, one child for all of them), and so does a
resumed run's rank 0 for the trace it appends to: a run killed while writing its trace can
leave one behind that HDF5 cannot read safely.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import HpcoptError

if TYPE_CHECKING:
    from ..child import ChildResult

#: Seconds the child may take: a start-up allowance plus reading and hashing at 10 MB/s, a rate
#: any node keeps up even when heavily loaded. What it reads is bounded by the file's size
#: (``structure.check_structure`` refuses more declared data first), so a genuine file of any
#: size gets time in proportion to it and a crafted one cannot make the child work longer.
BASE_SECONDS, BYTES_PER_SECOND = 60.0, 10e6

READING = "reading "  # the child's line before each trace

_vetted: set[tuple[str, int, int]] = set()


def vet_checkpoint(path: str | Path) -> Path:
    """The checkpoint file ``path`` names, once a child process has read it whole and found its
    digest and format right; HpcoptError (one line naming the file) otherwise."""
    from ..child import run_module
    from .data_parallel_checkpoint import find_checkpoint

    found = find_checkpoint(path)
    try:
        stat = found.stat()
    except OSError:  # the child says what is wrong with it, in the readers' words
        key, size = None, 0
    else:
        key, size = (str(found.resolve()), stat.st_size, stat.st_mtime_ns), stat.st_size
    if key in _vetted:
        return found
    result = run_module(__name__, [str(found)], BASE_SECONDS + size / BYTES_PER_SECOND)
    if result.ok:
        if key is not None:  # only a file that could be stat'ed is remembered as vetted
            _vetted.add(key)
        return found
    raise _refusal(result, found, "checkpoint")


def vet_traces(paths: Sequence[Path]) -> None:
    """HpcoptError (one line naming the file) unless a child process reads every trace cleanly."""
    from ..child import run_module

    if not paths:
        return
    size = sum(p.stat().st_size for p in paths if p.is_file())
    result = run_module(__name__, ["--traces", *map(str, paths)],
                        BASE_SECONDS + size / BYTES_PER_SECOND)
    if result.ok:
        return
    # the child names each trace before it reads it: the last one named is the culprit
    culprit = result.message.removeprefix(READING) if result.message.startswith(READING) else paths[0]
    raise _refusal(result, culprit, "trace")


#: Signals that stop a job (hpcopt.run.signals.SIGNALS, and a hang-up): a child ended by one
#: was stopped, not crashed.
STOP_SIGNAL_NAMES = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP")


def _refusal(result: ChildResult, path: str | Path, kind: str) -> HpcoptError:
    """The child's own error (exit 2, already naming the file), or what happened to it: a crash
    is damage; running out of time is not known to be (the node may be overloaded)."""
    if result.returncode == 2:
        return HpcoptError(result.message.removeprefix("hpcopt: error: "))
    if result.returncode is None:
        return HpcoptError(f"{path} could not be checked: the process that read it {result.message} "
                           "(is the node overloaded? a damaged file can also hang a reader)")
    if result.signal in STOP_SIGNAL_NAMES:  # stopped, not crashed: nothing is known of the file
        return HpcoptError(f"{path} could not be checked: the process that read it was stopped "
                           f"({result.signal})")
    happened = f"crashed reading it ({result.signal})" if result.signal else result.message
    return HpcoptError(f"{path} is a damaged {kind}: the process that checked it {happened}")


def check(path: Path) -> None:
    """The digest and format of a checkpoint of either kind (data-parallel or pipeline)."""
    from . import data_parallel_checkpoint as data_parallel_format
    from . import pipeline_checkpoint as pipeline_format
    from .data_parallel_checkpoint import opened
    from .digest import check_sealed

    with opened(path) as (path, f):
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
    import mpi4py

    mpi4py.rc.initialize = mpi4py.rc.finalize = False  # the readers import mpi4py; no MPI here
    sys.exit(main(sys.argv[1:]))
