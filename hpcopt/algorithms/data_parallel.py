"""What the data-parallel algorithms share: their state, the step-size options, the checks of
momentum and batch-norm policy, and the end of a run.

A data-parallel rank holds its own model x_i in one flat buffer; ranks agree at averaging
rounds. The state's fields declare what a checkpoint holds (``hpcopt.algorithms.state``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import HpcoptError
from .base import DATA_PARALLEL, check_momentum, context, option, positive_finite
from .buffers import BUFFER_POLICIES, check_buffer_policy, sync_buffers
from .momentum import MOMENTUM_POLICIES, check_momentum_policy
from .schedules import SCHEDULES, Schedule
from .state import counter, model, scratch, vector

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any


@dataclass
class DataParallelState:
    """What every data-parallel rank carries between steps (the checkpoint saves the declared
    fields: x per rank only mid-round, the averaged model otherwise)."""

    x: Array = model()
    grad: Array = scratch()
    momentum: Array | None = vector()  # None without momentum
    step: int = counter()            # local steps taken on this rank
    rounds: int = counter()          # averaging rounds completed
    steps_in_round: int = counter()  # local steps since the last averaging
    buffers: Array | None = vector()  # batch-norm running statistics (None: the model has none)


def interval_option() -> Any:
    """I, of the algorithms that average every I local steps (one option, one help text)."""
    return option(8, "I: local steps between averaging rounds (1 = parallel mini-batch SGD)")


def momentum_policy_option() -> Any:
    return option("keep", f"momentum buffers at a round: {' | '.join(MOMENTUM_POLICIES)}")


def check_rounds(interval: int, momentum_policy: str) -> None:
    """The checks of ``interval_option`` and ``momentum_policy_option``."""
    if interval < 1:
        raise HpcoptError(f"interval I must be >= 1, got {interval}")
    check_momentum_policy(momentum_policy)


@dataclass(frozen=True, kw_only=True)
class ScheduledSGD:
    """Options every data-parallel algorithm has: the step size lr_t and its schedule, momentum
    and the batch-norm buffer policy; context: the world size and run length (sqrt_nt)."""

    workload: ClassVar[str] = DATA_PARALLEL
    clips: ClassVar[bool] = False
    implied: ClassVar[dict[str, Any]] = {}

    lr: float = option(0.1, "learning rate eta")
    schedule: str = option("constant",
                           "learning-rate schedule: constant | step (decay at milestones) | sqrt_nt")
    decay: float = option(0.1, "step schedule: factor applied at each milestone")
    milestones: tuple[int, ...] = option((), "step schedule: increasing steps at which lr is "
                                             "multiplied by decay")
    momentum: float = option(0.0, "heavy-ball momentum mu; 0 = plain SGD")
    nesterov: bool = option(False, "Nesterov momentum instead of heavy ball")
    buffer_policy: str = option("average", f"batch-norm statistics at a round: "
                                           f"{', '.join(BUFFER_POLICIES)}")
    workers: int = context(1)
    total_steps: int = context(1)

    def __post_init__(self) -> None:
        positive_finite("lr", self.lr)
        if self.schedule not in SCHEDULES:
            raise HpcoptError(f"unknown schedule {self.schedule!r} (choose from {', '.join(SCHEDULES)})")
        check_momentum(self.momentum, self.nesterov)
        check_buffer_policy(self.buffer_policy)
        self.lr_schedule  # noqa: B018 - the schedule's own checks (decay, milestones)

    @cached_property
    def lr_schedule(self) -> Schedule:
        return Schedule(self.schedule, self.lr, self.decay, self.milestones, self.workers,
                        self.total_steps)

    def lr_at(self, t: int) -> float:
        """lr_t at the (0-based) local step t."""
        return self.lr_schedule(t)

    def new_state(self, x0: Array, comm: Comm, buffers: Array | None, state_type: type) -> Any:
        """``state_type`` from x0, broadcast from rank 0 so every rank starts from the same model;
        ``buffers`` (the model's bound batch-norm statistics) is kept as ``state.buffers``."""
        comm.bcast_(x0, root=0, label="init")
        xp = comm.backend.xp
        momentum = xp.zeros_like(x0) if self.momentum > 0 else None
        return state_type(x=x0, grad=xp.zeros_like(x0), momentum=momentum, buffers=buffers)

    def steps_for(self, total_steps: int, rank: int, size: int) -> int:
        """Every rank runs all T steps."""
        return total_steps

    def clock(self, state: DataParallelState) -> int | None:
        """The step: all ranks step together, so any step is a safe point for a collective."""
        return state.step

    def clock_ticks(self, total_steps: int) -> int:
        return total_steps

    def synchronized(self, state: DataParallelState) -> bool:
        """Whether every rank holds the same x (at a round boundary)."""
        return state.steps_in_round == 0

    def finish(self, state: DataParallelState, comm: Comm, label: str) -> None:
        """End a run mid-round: x and the batch-norm statistics averaged as at a round (no
        momentum policy, no round counted)."""
        comm.average_(state.x, label=label)
        if state.buffers is not None:
            sync_buffers(state.buffers, self.buffer_policy, comm, label=label)
        state.steps_in_round = 0

    def describe(self) -> str:
        """The settings that matter, for the run's header."""
        return f"lr {self.lr:g}"
