"""Divergence: NaN or Inf in the loss or the parameters stops the run, or drops the step.

``--on-nonfinite stop`` (the default) costs nothing per step. Two checks, both agreed by every
rank without any extra communication:

- each trace row's loss statistics are already reduced over all ranks (the window's
  Iallgather): a NaN or Inf loss on any rank makes the row's mean loss non-finite on every
  rank, so all ranks stop at the same row;
- before every checkpoint, the averaged model about to be written (the same on every rank)
  must be finite; with a parameter this also covers the momentum buffers (a non-finite buffer
  makes the parameters non-finite in the same step).

Either failing raises :class:`NonFiniteError` on every rank: the run ends with one line and
exit code 3, no checkpoint is written, and the newest one on disk, the last good one, is kept
(older ones are pruned only after a successful write); the line says what to try next, in
flags the command line accepts. Detection comes at the latest one trace row (``trace_every``
ticks) after the first bad step, and always before the next checkpoint. NumPy's overflow and
invalid-value warnings are off while the runner trains (hpcopt.run.runner): these checks
report NaN and Inf instead.

``--on-nonfinite skip``: every step, the rank that computed a minibatch loss and gradient checks
both (one dot product and two scalars to the host); a non-finite one is replaced by a zero
gradient for that step: the minibatch is dropped, counters advance (ranks stay in step), and
without momentum or weight decay the model is unchanged. The check happens before any
communication of the step, so no bad value reaches another rank; skipped steps are not counted
in the trace row's loss. A rank whose whole trace window was skipped leaves the row without a
loss, which stops the run as above: skipping never hides a run that has diverged for good.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import HpcoptError
from .faults import FaultPlan

Oracle = Callable[[Any, Any], Any]


class NonFiniteError(HpcoptError):
    """The loss or the parameters became NaN or Inf; raised on every rank at once (exit code 3)."""

    exit_code = 3

    def __init__(self, message: str) -> None:
        super().__init__(message, everywhere=True)


class StepGuard:
    """This rank's non-finite checks (``mode``: stop or skip, ``config.NONFINITE_MODES``) and its
    debug fault plan."""

    def __init__(self, mode: str = "stop", faults: FaultPlan | None = None, rank: int = 0) -> None:
        self.mode, self.faults, self.rank = mode, faults, rank
        self.skipped = 0        # steps this rank skipped
        self.window_skips = 0   # of them, since the last trace row (reset by the run)
        self._last_kept = True  # whether the newest step counts (False: skipped)

    def wrap(self, oracle: Oracle, steps_done: Callable[[], int]) -> Oracle:
        """``oracle`` with the fault plan applied and, in skip mode, the per-step check."""
        if self.faults is None and self.mode == "stop":
            return oracle
        faults, skip = self.faults, self.mode == "skip"

        def guarded(x: Any, grad: Any) -> Any:
            poison = faults is not None and faults.before_gradient(self.rank, steps_done() + 1, grad)
            loss = oracle(x, grad)
            if poison:
                grad.reshape(-1)[0] = math.nan
            if skip:
                self._last_kept = math.isfinite(float(loss)) and math.isfinite(float(grad @ grad))
                if not self._last_kept:
                    grad[...] = 0
                    self.skipped += 1
                    self.window_skips += 1
            return loss

        return guarded

    def kept(self) -> bool:
        """Whether the newest step's loss counts in the trace window (False: it was skipped)."""
        return self._last_kept

    def check_rows(self, rows: list, tick: int, last_checkpoint: str,
                   finish: Callable[[], list]) -> None:
        """Raise NonFiniteError (every rank alike) if a finished trace row has a non-finite
        loss; ``finish`` first completes the reductions still in flight (collective)."""
        bad = next((row for row in rows if not math.isfinite(row.stats.loss_mean)), None)
        if bad is None:
            return
        finish()
        what = ("a rank skipped every step of the window" if self.mode == "skip"
                else f"mean loss {bad.stats.loss_mean}")
        raise nonfinite_loss(f"step {bad.fields['step']} ({what}), seen at tick {tick}",
                             last_checkpoint, skip=self.mode != "skip")

    def check_model(self, model: Any, tick: int, last_checkpoint: str) -> None:
        """Raise NonFiniteError if the averaged ``model`` (the same on every rank) holds NaN or Inf."""
        if not bool(np.isfinite(model).all()):
            raise nonfinite_parameters(f"tick {tick}", last_checkpoint, skip=self.mode != "skip")

    def commit_hook(self, tick: int) -> Callable[[], None] | None:
        """The debug fault to run just before a checkpoint is published (None: none)."""
        return self.faults.commit_hook(self.rank, tick) if self.faults else None

    def report(self, comm: Any, show: bool) -> None:
        """Skip mode (collective): print how many steps all ranks skipped."""
        if self.mode != "skip":
            return
        total = int(comm.allreduce_scalar(float(self.skipped), label="summary"))
        if show:
            print(f"hpcopt: --on-nonfinite skip: {total} step(s) with a non-finite loss or "
                  "gradient were skipped (all ranks)", flush=True)


def nonfinite_loss(where: str, last_checkpoint: str, skip: bool = True) -> NonFiniteError:
    """The error for a trace row (at ``where``) whose loss is NaN or Inf."""
    return NonFiniteError(f"non-finite loss in the trace row at {where}; "
                          f"{_advice(last_checkpoint, skip)}")


def nonfinite_parameters(when: str, last_checkpoint: str, skip: bool = True) -> NonFiniteError:
    """The error for parameters found non-finite at ``when``, before a checkpoint."""
    return NonFiniteError(f"non-finite parameters at {when}, not checkpointed; "
                          f"{_advice(last_checkpoint, skip)}")


def _advice(last_checkpoint: str, skip: bool = True) -> str:
    """What is left and what to try that the command line accepts (``skip``: whether
    --on-nonfinite skip applies and is not in use already). A resumed run keeps its --lr, so a
    smaller one means a new run; --on-nonfinite may change on resume."""
    smaller_lr = "train again with a smaller --lr (a resumed run keeps its --lr)"
    if not last_checkpoint:
        return f"no checkpoint was written; {smaller_lr}" + (", or with --on-nonfinite skip" if skip else "")
    kept = f"the last good checkpoint is {last_checkpoint}"
    if skip:
        return f"{kept}; resume it with --on-nonfinite skip to drop the bad steps, or {smaller_lr}"
    return f"{kept}; {smaller_lr}"
