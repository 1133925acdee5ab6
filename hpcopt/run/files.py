"""A run's files: the run directory and id, the trace file, the header's last lines."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..comm import Comm
from ..config import Config, to_toml
from ..errors import HpcoptError
from ..io import checkpoint as ckpt_io
from ..io import trace as trace_io
from ..io import versions


def run_directory(config: Config, ckpt: ckpt_io.Checkpoint | None,
                   comm: Comm) -> tuple[Path | None, str]:
    """(run directory, run id): for a resumed run from the config or the checkpoint; for a new
    one rank 0 fills in ``{time}`` (never an existing directory), draws an id, and broadcasts
    both (label "setup"). (None, "") when no files are written."""
    if ckpt is not None:
        out = Path(config.run.out) if config.run.out else ckpt_io.run_directory(ckpt.path, ckpt.config)
        return out, ckpt.run_id
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


def unused_path(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ...: the first that does not exist."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def open_trace(config: Config, out: Path | None, run_id: str, comm: Comm, parameters: int,
               resume_at: tuple[int, int] | None, extra_columns: Sequence[str] = (),
               network: dict[str, Any] | None = None) -> trace_io.TraceWriter | None:
    """Rank 0 makes the run directory and, when tracing, opens the trace with ``extra_columns``
    (and modelled communication columns when ``network`` describes a profile); HpcoptError if a
    new run would overwrite another run's files. None on the other ranks."""
    if comm.rank != 0 or out is None:
        return None
    try:
        (out / ckpt_io.SUBDIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HpcoptError(f"cannot create the run directory {out}: {exc.strerror}") from None
    path = out / trace_io.FILE_NAME
    if resume_at is None and (path.exists() or ckpt_io.has_checkpoints(out)):
        raise HpcoptError(f"{out} already holds a run: resume it (python -m hpcopt resume {out}) "
                          "or choose another --out")
    if not config.run.trace:
        return None
    attrs = {**versions(), "run_id": run_id, "world_size": comm.size, **(network or {}),
             "algorithm": config.algorithm.algorithm, "config": to_toml(config),
             "parameters": parameters,
             "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return trace_io.TraceWriter(path, attrs, resume_at, extra_columns=extra_columns,
                                modelled=bool(network))


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

