"""What a run lost to its lost ranks, for ``hpcopt collect``: losses, steps lost, recovery seconds.

Two ways a run goes on after losing a rank, and where each leaves its account:

- abort and resume (any MPI; today's default): the job ends, a requeue resumes the newest
  checkpoint. A scheduled fault (``--fault``, hpcopt.run.fault_schedule) leaves ``OUT/fault.json``:
  the steps lost are those the resumed job did again (from its checkpoint up to the kill), the
  seconds those from the kill to the resumed job's first step (launch, set-up and the checkpoint's
  read included: what a requeue costs beyond the scheduler's wait);
- continue without the rank (``--on-rank-loss continue``, Open MPI's ULFM): the trace holds the
  group ``/rank_losses``, 1-D datasets ``step``, ``rank``, ``round_step`` (int64) and
  ``recover_seconds`` (float64), one entry per loss (docs/formats.md). Seconds: the sum of
  ``recover_seconds``. Steps lost: the sum of ``step - round_step`` (``round_step``: the step of
  the round the survivors went on from).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HpcoptError

GROUP = "rank_losses"
#: The datasets of ``/rank_losses`` and their kinds (NumPy's: integer, float).
DATASETS = {"step": "i", "rank": "i", "recover_seconds": "f", "round_step": "i"}
COLUMNS = ("rank_losses", "steps_lost", "recovery_seconds")


@dataclass(frozen=True)
class Recovery:
    """A run's losses of ranks and what they cost (None: not known); ``survived``: the ranks the
    survivors went on without (continue-runs; empty for abort and resume)."""

    losses: int
    steps_lost: int | None
    seconds: float | None
    survived: tuple[int, ...] = ()

    def columns(self) -> dict[str, int | float | None]:
        return dict(zip(COLUMNS, (self.losses, self.steps_lost, self.seconds)))

    def survivors_note(self, started: int | None) -> str:
        """How the survivors went on, for a note ("" unless they did): "at 3 of 4 ranks after
        losing rank 2", the counts given the ranks the job ``started`` with (None: not known)."""
        if not self.survived:
            return ""
        ranks = "rank" + ("s " if len(self.survived) > 1 else " ") + ", ".join(map(str, self.survived))
        if started is None:
            return f"after losing {ranks}"
        return f"at {started - len(self.survived)} of {started} ranks after losing {ranks}"


def rank_losses(trace: Path) -> Recovery | None:
    """``/rank_losses`` of the trace file ``trace`` (read by a child first, as every trace is);
    None when it has none; HpcoptError (one line) for a group that is not the layout above."""
    from ..io import READ_ERRORS
    from ..io.structure import open_for_reading
    from ..io.trace import DECLARED_BOUND, FILE_KIND

    with open_for_reading(trace, FILE_KIND, *DECLARED_BOUND) as f:
        if GROUP not in f:
            return None
        try:
            group = f[GROUP]
            if not hasattr(group, "keys"):
                raise HpcoptError(f"{trace}: /{GROUP} must be a group of 1-D datasets")
            values = {name: _column(group, name, kind, trace) for name, kind in DATASETS.items()}
        except READ_ERRORS as exc:
            raise HpcoptError(f"{trace}: /{GROUP} cannot be read ({type(exc).__name__}: {exc})") from None
    if len({v.size for v in values.values()}) > 1:
        raise HpcoptError(f"{trace}: the datasets of /{GROUP} differ in length")
    seconds = values["recover_seconds"]
    if not np.isfinite(seconds).all() or (seconds < 0).any():
        raise HpcoptError(f"{trace}: /{GROUP}/recover_seconds holds negative or non-finite seconds")
    lost = int(np.maximum(values["step"] - values["round_step"], 0).sum())
    return Recovery(int(seconds.size), lost, float(seconds.sum()), tuple(values["rank"].tolist()))


def _column(group: Any, name: str, kind: str, trace: Path) -> np.ndarray:
    dataset = group.get(name)
    if dataset is None or not hasattr(dataset, "dtype") or dataset.ndim != 1 or dataset.dtype.kind not in (
            "iu" if kind == "i" else "f"):
        raise HpcoptError(f"{trace}: /{GROUP}/{name} must be a 1-D "
                          f"{'integer' if kind == 'i' else 'float'} dataset")
    return np.asarray(dataset[()], dtype=np.int64 if kind == "i" else np.float64)


def scheduled_fault(run: Path) -> Recovery | None:
    """The fault record of run directory ``run`` (``--fault``); None when no fault has fired."""
    from ..run.fault_schedule import read_record

    record = read_record(run)
    if record is None:
        return None
    return Recovery(1, record.steps_redone(), record.recovery_seconds())


def recovery(run: Path, trace: Path | None) -> Recovery | None:
    """A run's losses: its trace's ``/rank_losses`` (continue-runs), else its fault record."""
    return (rank_losses(trace) if trace is not None else None) or scheduled_fault(run)
