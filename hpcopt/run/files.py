"""A run's trace file, opened by rank 0 in its run directory (``hpcopt.run.directory``), and the
header's last lines."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..comm import Comm
from ..comm.core import progress_mode
from ..config import Config, to_toml
from ..io import trace as trace_io
from . import vetting
from .checkpointing import written_by


def open_trace(config: Config, out: Path | None, run_id: str, comm: Comm, parameters: int,
               resume_at: tuple[int, int] | None, extra_columns: Sequence[str] = (),
               attrs: dict[str, Any] | None = None) -> trace_io.TraceWriter | None:
    """Rank 0, in the run directory ``claim`` made: when tracing, the trace, opened with
    ``extra_columns`` and the session's root ``attrs`` (and modelled communication columns when
    they name a cost-model profile, ``network``), its attributes naming MPI's progress mode
    (``comm_progress``); a resumed run's trace (``resume_at``) is read whole in a child first
    (``hpcopt.run.vetting``: a run killed while writing it can leave one HDF5 cannot read safely).
    None on the other ranks."""
    if comm.rank != 0 or out is None or not config.run.trace:
        return None
    path = out / trace_io.FILE_NAME
    attrs = {**written_by(), "run_id": run_id, "world_size": comm.size, "comm_progress": progress_mode(comm),
             **(attrs or {}),
             "algorithm": config.algorithm.algorithm, "config": to_toml(config),
             "parameters": parameters,
             "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if resume_at is not None and path.exists():
        vetting.vet_traces([path])
    return trace_io.TraceWriter(path, attrs, resume_at, extra_columns=extra_columns,
                                modelled="network" in (attrs or {}))


def header_end(out: Path | None, resumed_at: str, comm: Comm) -> str:
    """The last lines of a run's header, the same for every workload: the run directory, where a
    resumed run continues (``resumed_at``, e.g. "RUN/checkpoints/step-000000008.h5 at step
    8"; "" when new), and on the GPU the device and how MPI reaches it."""
    lines = [f"run directory {out or 'none'}"]
    if resumed_at:
        lines.append(f"resuming from {resumed_at}")
    if comm.backend.is_gpu and comm.transport is not None:
        lines.append(f"rank 0 on GPU {comm.backend.device}; MPI: {comm.transport.choice.describe()}")
    return "\n".join(lines)

