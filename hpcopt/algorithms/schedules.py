"""Learning-rate schedules: lr_t as a function of the (0-based) local step t."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import HpcoptError

SCHEDULES = ("constant", "step", "sqrt_nt", "cosine")
#: The schedules whose lr_t depends on the run length T (a resumed run may not change it).
BY_RUN_LENGTH = ("sqrt_nt", "cosine")


@dataclass(frozen=True)
class Schedule:
    """``constant``: lr_t = lr.
    ``step``: lr_t = lr * decay^(number of milestones <= t).
    ``sqrt_nt``: lr_t = lr * sqrt(N / T), PR-SGD's step size sqrt(N)/(L sqrt(T)) with lr = 1/L
    (Yu, Yang, Zhu, AAAI 2019, Theorem 1).
    ``cosine``: lr_t = lr (1 + cos(pi min(1, (t - W) / (T - W)))) / 2 for t >= W: from lr at
    the end of the warmup to 0 at step T (Loshchilov, Hutter, "SGDR", ICLR 2017, one cycle;
    DiLoCo's inner schedule, Douillard et al., arXiv 2311.08105, 2023).

    With ``warmup`` W > 0 (any kind) the first W steps ramp up linearly, lr_t = base_t (t + 1) / W
    for t < W (base_t: the kind's value, lr for cosine), so step W - 1 takes the full step
    (Goyal et al., "Accurate, Large Minibatch SGD", arXiv 1706.02677, 2017). W = 0 changes
    nothing.
    """

    kind: str = "constant"
    lr: float = 0.05
    decay: float = 0.1
    milestones: tuple[int, ...] = ()
    workers: int = 1
    total_steps: int = 1
    warmup: int = 0

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
        if self.warmup < 0:
            raise HpcoptError(f"warmup must be >= 0 steps, got {self.warmup}")

    def __call__(self, t: int) -> float:
        if t < self.warmup:
            return self.base(t) * (t + 1) / self.warmup
        return self.base(t)

    def base(self, t: int) -> float:
        """lr_t of the kind alone (without the warmup)."""
        if self.kind == "constant":
            return self.lr
        if self.kind == "step":
            return self.lr * self.decay ** sum(1 for m in self.milestones if m <= t)
        if self.kind == "cosine":
            if t < self.warmup:
                return self.lr
            progress = min(1.0, (t - self.warmup) / max(1, self.total_steps - self.warmup))
            return self.lr * (1 + math.cos(math.pi * progress)) / 2
        return self.lr * math.sqrt(self.workers / self.total_steps)


def describe(kind: str, warmup: int) -> str:
    """A schedule beyond a constant lr, for a run's header ("" for constant without warmup)."""
    parts = ("" if kind == "constant" else f"schedule {kind}", f"warmup {warmup}" if warmup else "")
    return ", ".join(part for part in parts if part)
