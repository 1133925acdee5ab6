"""Debug fault injection for the fault-injection tests: ``--debug-fail-at RANK:STEP[:KIND]``.

A debug option, not a training feature: it makes one rank fail in a chosen way at a chosen
point, so that tests (``tests/faults/``) can prove that every failure ends the job quickly and
never costs the last good checkpoint. STEP counts a rank's local steps from 1 (``KIND`` fires
in the rank's STEP-th step, before its gradient); for ``checkpoint`` it is the clock tick of the
checkpoint being written. Kinds:

- ``raise``: a RuntimeError (the crash path: traceback prefixed with the rank, MPI_Abort);
- ``kill``: the rank sends itself SIGKILL (as ``kill -9`` from outside would; with
  ``--on-rank-loss continue`` the survivors' rebuilt run has no fault plan: it fires once);
- ``sigterm``, ``sigint``: the rank sends itself SIGTERM or SIGINT (as ``kill -TERM PID`` or
  ``kill -INT PID`` would; ``hpcopt.run.signals``) and goes on;
- ``hang``: the rank sleeps for ever (what the stall watchdog is for);
- ``nan``: the gradient of that step gets a NaN (divergence: ``--on-nonfinite``);
- ``checkpoint``: rank 0 sends itself SIGKILL in the middle of writing that tick's checkpoint,
  after its temporary file is complete and before the rename that publishes it;
  ``checkpoint-sigterm``, ``checkpoint-sigint``: SIGTERM or SIGINT there, and it goes on.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import HpcoptError

#: The signal each kind that sends one sends, in a step or in a checkpoint's write.
STEP_SIGNALS = {"kill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}
CHECKPOINT_SIGNALS = {"checkpoint": signal.SIGKILL, "checkpoint-sigterm": signal.SIGTERM,
                      "checkpoint-sigint": signal.SIGINT}
KINDS = ("raise", "hang", "nan", *STEP_SIGNALS, *CHECKPOINT_SIGNALS)


@dataclass(frozen=True)
class FaultPlan:
    """Fail rank ``rank`` at its step (or checkpoint tick) ``step`` in the way ``kind`` names."""

    rank: int
    step: int
    kind: str = "raise"

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """``RANK:STEP[:KIND]``; HpcoptError for anything else."""
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            rank, step = int(parts[0]), int(parts[1])
        except ValueError:
            raise HpcoptError(f"--debug-fail-at takes RANK:STEP[:KIND], got {text!r}") from None
        kind = parts[2] if len(parts) == 3 else "raise"
        if kind not in KINDS:
            raise HpcoptError(f"--debug-fail-at: unknown kind {kind!r} (choose from {', '.join(KINDS)})")
        if rank < 0 or step < 1:
            raise HpcoptError(f"--debug-fail-at needs RANK >= 0 and STEP >= 1, got {text!r}")
        if kind in CHECKPOINT_SIGNALS and rank != 0:
            raise HpcoptError(f"--debug-fail-at R:K:{kind}: only rank 0 writes checkpoints (R = 0)")
        return cls(rank, step, kind)

    def before_gradient(self, rank: int, step: int, grad: Any) -> bool:
        """Called before the gradient of ``rank``'s ``step``-th step (1-based): fire ``raise``,
        a signal or ``hang``; True when the gradient must be poisoned (``nan``)."""
        if rank != self.rank or step != self.step or self.kind in CHECKPOINT_SIGNALS:
            return False
        _announce(self.kind, rank, f"step {step}")
        if self.kind == "raise":
            raise RuntimeError(f"--debug-fail-at: injected failure on rank {rank} at step {step}")
        if self.kind in STEP_SIGNALS:
            os.kill(os.getpid(), STEP_SIGNALS[self.kind])
        if self.kind == "hang":
            while True:
                time.sleep(60)
        return self.kind == "nan"

    def commit_hook(self, rank: int, tick: int) -> Callable[[], None] | None:
        """What a checkpoint writer on ``rank`` runs before publishing ``tick``'s file (None:
        nothing: this plan is not a checkpoint fault)."""
        if self.kind not in CHECKPOINT_SIGNALS:
            return None
        return lambda: self.before_commit(rank, tick)

    def before_commit(self, rank: int, tick: int) -> None:
        """Called by the checkpoint writer before the rename that publishes the file of ``tick``."""
        if self.kind in CHECKPOINT_SIGNALS and rank == self.rank and tick == self.step:
            _announce(self.kind, rank, f"the checkpoint of tick {tick}")
            os.kill(os.getpid(), CHECKPOINT_SIGNALS[self.kind])


def _announce(kind: str, rank: int, where: str) -> None:
    """One line on stderr as the fault fires (tests time the job's end from it)."""
    sys.stderr.write(f"hpcopt: debug: injecting {kind} on rank {rank} at {where}\n")
    sys.stderr.flush()
