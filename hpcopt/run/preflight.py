"""Checks before the first step, so that a run cannot fail after hours on something knowable now.

Already refused while the run is built (``build_run``, agreed by every rank): a missing or
unreadable data set, a batch larger than a shard, more ranks than samples, ``local_steps``
with another length than the number of ranks, a corpus too small for the ranks' streams. Here:

- once the run is built, every rank must run the same number of clock ticks (``agree_ticks``,
  one allgather of two integers): a rank that computed another length, e.g. from another copy
  of the data set, would otherwise wait for ever in the last collectives of the others;
- once the run directory exists, rank 0 (the only writer) must be able to create and delete a
  file in the checkpoint directory, and the file system must have room for one more
  checkpoint (``estimate``).

Every problem is one HpcoptError line, exit code 2 on every rank.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HpcoptError
from ..io import data_parallel_checkpoint as ckpt_io

#: Bytes of a checkpoint beyond its vectors: attributes, config, tables, HDF5 metadata.
CHECKPOINT_OVERHEAD = 1 << 20


def agree_ticks(ticks: int, local_steps: int, comm: Any) -> None:
    """HpcoptError on every rank unless every rank runs ``ticks`` clock ticks (collective)."""
    everyone = comm.allgather(np.array([ticks, local_steps], dtype=np.int64), "preflight")
    if len({t for t, _ in everyone}) > 1:
        shown = ", ".join(f"rank {r}: {t} ticks ({s} steps)" for r, (t, s) in enumerate(everyone))
        raise HpcoptError(f"the ranks disagree on the length of the run ({shown}); "
                          "is the data set the same on every node?", everywhere=True)


def estimate(parts: Any, size: int) -> int:
    """Upper bound of one checkpoint's size in bytes for ``parts`` on ``size`` ranks: the
    averaged model twice (flat and per layer), the algorithm's shared vectors (an outer
    optimizer's), and per rank its model (mid-round), the inner optimizer's state (momentum,
    AdamW's moments), batch-norm statistics and LSTM state."""
    itemsize = np.dtype(parts.config.run.dtype).itemsize
    workload = parts.workload
    d = workload.layout.size
    per_rank_vectors, shared_vectors = parts.algorithm.state_vectors()
    per_rank = d * (1 + per_rank_vectors)
    if workload.buffers is not None:
        per_rank += int(workload.buffers.size)
    if workload.carried is not None:
        per_rank += int(workload.carried[0]().size)
    return itemsize * ((2 + shared_vectors) * d + size * per_rank) + CHECKPOINT_OVERHEAD


def check_output(out: Path | None, checkpoint_bytes: int, comm: Any) -> None:
    """Rank 0: the checkpoint directory is writable and has room for one checkpoint of about
    ``checkpoint_bytes``."""
    if out is None or comm.rank != 0:
        return
    directory = out / ckpt_io.SUBDIR
    probe = directory / f".preflight-{secrets.token_hex(8)}"
    try:  # a new file (O_EXCL) of a random name: never a FIFO or a link planted at a known one
        with open(probe, "xb") as handle:
            handle.write(b"hpcopt preflight\n")
        probe.unlink()
    except OSError as exc:
        raise HpcoptError(f"the checkpoint directory {directory} is not writable: "
                          f"{exc.strerror or exc}") from None
    need = checkpoint_bytes
    free = shutil.disk_usage(directory).free
    if free < need:
        raise HpcoptError(f"not enough free space for a checkpoint in {directory}: "
                          f"{free / 1e6:,.1f} MB free, a checkpoint needs about {need / 1e6:,.1f} MB")
