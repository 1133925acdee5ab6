"""Learning-rate schedules: lr_t as a function of the (0-based) local step t."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import HpcoptError

SCHEDULES = ("constant", "step", "sqrt_nt")


@dataclass(frozen=True)
class Schedule:
    """``constant``: lr_t = lr.
    ``step``: lr_t = lr * decay^(number of milestones <= t).
    ``sqrt_nt``: lr_t = lr * sqrt(N / T), PR-SGD's step size sqrt(N)/(L sqrt(T)) with lr = 1/L
    (Yu, Yang, Zhu, AAAI 2019, Theorem 1).
    """

    kind: str = "constant"
    lr: float = 0.05
    decay: float = 0.1
    milestones: tuple[int, ...] = ()
    workers: int = 1
    total_steps: int = 1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise HpcoptError(f"unknown schedule {self.kind!r} (choose from {', '.join(SCHEDULES)})")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise HpcoptError(f"lr must be a positive number, got {self.lr}")
        if not 0 < self.decay <= 1:
            raise HpcoptError(f"decay must be in (0, 1], got {self.decay}")
        if any(m < 1 for m in self.milestones) or list(self.milestones) != sorted(self.milestones):
            raise HpcoptError(f"milestones must be increasing positive steps, got {self.milestones}")
        if self.workers < 1 or self.total_steps < 1:
            raise HpcoptError("a schedule needs at least one worker and one step")

    def __call__(self, t: int) -> float:
        if self.kind == "constant":
            return self.lr
        if self.kind == "step":
            return self.lr * self.decay ** sum(1 for m in self.milestones if m <= t)
        return self.lr * math.sqrt(self.workers / self.total_steps)
