"""A run directory, in one place: named, found, pruned and claimed.

- Named: a new run's (``--out``, with ``{time}`` filled in and never an existing directory) and
  its run id, drawn by rank 0 and broadcast; a resumed run's: ``--out``, else the directory its
  checkpoint lies in (``home_of``), never the ``out`` the checkpoint's config names
  (``run_directory``).
- Found: its complete checkpoints (``checkpoints/step-<tick>.h5``: ``checkpoint_path``,
  ``checkpoints``), the run each file belongs to (``hpcopt.io.data_parallel_checkpoint.run_id_of``).
- Pruned: all but the newest checkpoints of its own run, and the leftovers of interrupted writes
  (``prune``).
- Claimed for one job and one run (``claim``): made, locked (``hpcopt.run.lock``) and checked to
  hold no other run; a resume first checks that no other job holds it (``vet_resumed``).
"""

from __future__ import annotations

import datetime
import uuid
from pathlib import Path

import numpy as np

from ..comm import Comm, agreed
from ..config import Config
from ..errors import HpcoptError
from ..io import data_parallel_checkpoint as ckpt_io
from ..io import trace as trace_io
from ..io.safe_files import check_regular
from . import vetting
from .lock import RunLock, check_free


def run_directory(config: Config, ckpt: ckpt_io.Checkpoint | None,
                  comm: Comm) -> tuple[Path | None, str]:
    """(run directory, run id). A resumed run continues in ``config.run.out`` (``--out``) or
    else in the folder that holds the checkpoint's ``checkpoints/``, never in the ``out`` its
    stored config names: a checkpoint elsewhere needs ``--out`` (HpcoptError on every rank).
    For a new run rank 0 fills in ``{time}`` (never an existing directory), draws an id, and
    broadcasts both (label "setup"). (None, "") when no files are written."""
    if ckpt is not None:
        resumed = ckpt
        return agreed(lambda: _resumed_directory(config, resumed), comm), ckpt.run_id
    if not config.run.out:
        return None, ""
    text = ""
    if comm.rank == 0:
        out = Path(config.run.out)
        if "{time}" in config.run.out:
            stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
            out = unused_path(Path(config.run.out.replace("{time}", stamp)))
        text = f"{uuid.uuid4().hex} {out}"
    buffer = np.zeros(4096, dtype=np.uint8)
    encoded = text.encode("utf-8")[:buffer.size]
    buffer[:len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
    comm.bcast_(buffer, root=0, label="setup")
    run_id, out_text = bytes(buffer).rstrip(b"\0").decode("utf-8").split(" ", 1)
    return Path(out_text), run_id


def _resumed_directory(config: Config, ckpt: ckpt_io.Checkpoint) -> Path:
    """``--out``, else the checkpoint's own run directory; HpcoptError for a loose checkpoint."""
    if config.run.out:
        return Path(config.run.out)
    home = home_of(ckpt.path)
    if home is None:
        raise HpcoptError(f"{ckpt.path} is not in a run directory's {ckpt_io.SUBDIR}/ folder: give "
                          "the run directory to continue in (--out DIR)")
    return home


def vet_resumed(resume: str | Path, out: str) -> None:
    """Rank 0, before any rank of a resumed run opens its checkpoint ``resume``: HpcoptError
    naming the holder when another job holds the directory the run is to write (``out``, else
    the checkpoint's own), as it may be pruning that very checkpoint (``claim`` takes the lock
    later); then a child process reads the file whole (``hpcopt.run.vetting``)."""
    directory = Path(out) if out else home_of(ckpt_io.find_checkpoint(resume))
    if directory is not None:
        check_free(directory)
    vetting.vet_checkpoint(resume)


def claim(out: Path | None, run_id: str, resumed: bool, verbose: bool) -> RunLock | None:
    """Rank 0: make the run directory and lock it for this job (``hpcopt.run.lock``), then check
    that it holds no other run. A resumed run's directory may hold only its own run's trace and
    checkpoints; a new run's none, or only the trace of a run that ended before its first
    checkpoint, which is kept aside under another name (with a line saying so when
    ``verbose``). HpcoptError otherwise, the lock released. None when there is no directory."""
    if out is None:
        return None
    try:
        (out / ckpt_io.SUBDIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HpcoptError(f"cannot create the run directory {out}: {exc.strerror}") from None
    lock = RunLock.acquire(out, run_id)
    try:
        if resumed:
            _check_one_run(out, run_id)
        else:
            _check_unused(out, verbose)
    except BaseException:
        lock.release()
        raise
    return lock


def _check_one_run(out: Path, run_id: str) -> None:
    """HpcoptError if the trace or a checkpoint in ``out`` is of another run than ``run_id``, or
    the trace is no regular file."""
    trace = out / trace_io.FILE_NAME
    if trace.exists():
        check_regular(trace, trace_io.FILE_KIND)
    for path in ([trace] if trace.exists() else []) + checkpoints(out):
        found = ckpt_io.run_id_of(path)
        if found is not None and found != run_id:
            raise HpcoptError(f"{out} holds another run: {path} is of run {found!r}, the checkpoint "
                              f"of run {run_id!r}; a run directory holds one run: choose another --out")


def _check_unused(out: Path, verbose: bool) -> None:
    """HpcoptError if ``out`` holds a run that can be resumed; the trace of one that cannot (it
    ended before its first checkpoint) is renamed out of this run's way."""
    if has_checkpoints(out):
        raise HpcoptError(f"{out} already holds a run: resume it (python -m hpcopt resume {out}; from "
                          f"Python, with your own workload: hpcopt.train(config, workload=..., "
                          f"resume={str(out)!r})) or choose another run directory (--out, "
                          "config.run.out)")
    trace = out / trace_io.FILE_NAME
    if not trace.exists():
        return
    check_regular(trace, trace_io.FILE_KIND)  # a FIFO is refused, never opened nor moved aside
    found = ckpt_io.run_id_of(trace)
    kept = unused_path(out / f"trace-{found if found and found.isalnum() else 'unknown'}.h5")
    try:
        trace.rename(kept)
    except OSError as exc:
        raise HpcoptError(f"{out} holds the trace of a run that ended before its first checkpoint, "
                          f"and it cannot be moved aside: {exc.strerror}") from None
    if verbose:
        print(f"hpcopt: {out} held a run that ended before its first checkpoint: its trace is now "
              f"{kept.name}, and this run starts there", flush=True)


def unused_path(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ...: the first that does not exist."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def checkpoint_path(out: Path, tick: int) -> Path:
    """Where run directory ``out`` holds its checkpoint of clock tick ``tick``."""
    return out / ckpt_io.SUBDIR / f"step-{tick:09d}.h5"


def home_of(path: Path) -> Path | None:
    """The run directory of the checkpoint ``path``: the folder above the ``checkpoints/`` it lies in (so
    a moved run directory still works); None for a checkpoint outside one. Never the ``out``
    its config names: a file does not choose where a run writes. Written as ``path`` is (a
    relative path stays relative) unless links make the folder another one."""
    given, resolved = Path(path), Path(path).resolve()
    if resolved.parent.name != ckpt_io.SUBDIR:
        return None
    home = resolved.parent.parent
    as_given = given.parent.name == ckpt_io.SUBDIR and given.parent.parent.resolve() == home
    return given.parent.parent if as_given else home


def has_checkpoints(out: Path) -> bool:
    return bool(ckpt_io.complete(out / ckpt_io.SUBDIR))


def checkpoints(out: Path) -> list[Path]:
    """The complete checkpoints of run directory ``out``, oldest first."""
    return [path for _, path in ckpt_io.complete(out / ckpt_io.SUBDIR)]


def checkpoints_after(out: Path, tick: int) -> list[Path]:
    """The complete checkpoints of run directory ``out`` past clock tick ``tick``, oldest first."""
    return [path for at, path in ckpt_io.complete(out / ckpt_io.SUBDIR) if at > tick]


def prune(directory: Path, keep: int, run_id: str) -> None:
    """Delete all but the newest ``keep`` checkpoints of run ``run_id``, and leftovers of
    interrupted writes. A file of another run, or one whose run cannot be read, is never
    deleted (nor counted)."""
    ours = [path for _, path in ckpt_io.complete(directory) if ckpt_io.run_id_of(path) == run_id]
    for path in ours[:-keep]:
        path.unlink(missing_ok=True)
    for path in directory.glob(f"*{ckpt_io.TMP_SUFFIX}"):
        path.unlink(missing_ok=True)
