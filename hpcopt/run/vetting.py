"""Untrusted checkpoints and traces read whole in a child process before this process reads them.

Damaged HDF5 metadata can crash the HDF5 C library itself (a variable-length string attribute
whose heap address was overwritten did, once in 3,600 random byte edits): no Python handler
runs, and an MPI job loses a rank with a signal instead of getting an error. So the caller of a
reader vets the file first: ``vet_checkpoint`` runs ``python -m hpcopt.io.vet FILE`` (the child:
it opens the file, checks its structure, content digest and format, reading every attribute and
dataset) and ``vet_traces`` runs ``python -m hpcopt.io.vet --traces FILE...`` (one child for all
of them, a trace's timeline included). A crash, a hang or a failed check in the child becomes
one error line; once the child has read the file cleanly, this process reads the same bytes. A
checkpoint is vetted once per process (keyed by its path, size and modification time). Callers:
a resumed run's rank 0, for its checkpoint and for the trace it appends to (a run killed while
writing its trace can leave one behind that HDF5 cannot read safely), ``hpcopt report`` and a
study's ``collect`` and ``export`` for the traces they read, a study's task for the checkpoint
whose world size it asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .. import child
from ..algorithms.registration import child_variables
from ..child import ChildResult, child_environment
from ..comm.mpi_support import singleton_environment
from ..errors import HpcoptError
from ..io import data_parallel_checkpoint as ckpt_io
from ..io.vet import READING

#: The child's module (``python -m``).
CHILD = "hpcopt.io.vet"
#: Seconds the child may take: a start-up allowance plus reading and hashing at 10 MB/s, a rate
#: any node keeps up even when heavily loaded. What it reads is bounded by the file's size
#: (``structure.check_structure`` refuses more declared data first), so a genuine file of any
#: size gets time in proportion to it and a crafted one cannot make the child work longer.
BASE_SECONDS, BYTES_PER_SECOND = 60.0, 10e6

_vetted: set[tuple[str, int, int]] = set()


def _run(args: list[str], size: int) -> ChildResult:
    """The child on ``args``, given time for ``size`` bytes; it reads the config a file stores,
    so the algorithms registered by call here are named to it."""
    return child.run_module(CHILD, args, BASE_SECONDS + size / BYTES_PER_SECOND,
                      child_environment(singleton_environment(), child_variables()))


def vet_checkpoint(path: str | Path) -> Path:
    """The checkpoint file ``path`` names (``find_checkpoint``), once a child process has read
    it whole and found its digest and format right; HpcoptError (one line naming the file)
    otherwise."""
    found = ckpt_io.find_checkpoint(path)
    try:
        stat = found.stat()
    except OSError:  # the child says what is wrong with it, in the readers' words
        key, size = None, 0
    else:
        key, size = (str(found.resolve()), stat.st_size, stat.st_mtime_ns), stat.st_size
    if key in _vetted:
        return found
    result = _run([str(found)], size)
    if result.ok:
        if key is not None:  # only a file that could be stat'ed is remembered as vetted
            _vetted.add(key)
        return found
    raise _refusal(result, found, "checkpoint")


def vet_traces(paths: Sequence[Path]) -> None:
    """HpcoptError (one line naming the file) unless a child process reads every trace cleanly."""
    if not paths:
        return
    result = _run(["--traces", *map(str, paths)], sum(p.stat().st_size for p in paths if p.is_file()))
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
