"""When PR-SGD's rounds synchronise: a piece (``Timing``) called after every local step.

    every I_i   after rank i's I_i-th local step of a round: the round (``Rounds.average``:
                the mean, the policies, the outer step); after the other steps a group
                round when one is due (two-level, ``hpcopt.algorithms.groups``)
    fragments   fragment p in turn, every I steps at offset p I / P, with group rounds
                between (Streaming DiLoCo: ``hpcopt.algorithms.streaming.FragmentSchedule``)

Each declares the state it keeps (the fragments' in flight), as the other pieces do, and
calls back into the algorithm's round through ``RoundCalls``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .state import Declared

if TYPE_CHECKING:
    from ..comm import Comm


class RoundCalls(Protocol):
    """What a timing calls in the algorithm (``RestartedSGD`` implements it): the parts of a
    round, for the timing to put in order."""

    def average(self, state: Any, comm: Comm) -> None:
        """The whole round: the mean, the buffer and momentum policies, the outer step."""
        ...

    def group_round(self, x: Any, steps_in_round: int, comm: Comm) -> None:
        """x <- its group's mean when a group round is due (``hpcopt.algorithms.groups``)."""
        ...

    def end_round(self, state: Any, comm: Comm) -> None:
        """The end of a round whose fragments took their turns: buffers, the round counted."""
        ...

    def outer_step(self, state: Any, eta: float, mean: Any | None = None, part: slice = ...) -> None:
        """The outer optimizer's step from a round's mean, on ``part`` of the model."""
        ...

    def lr_at(self, t: int) -> float:
        """lr_t at the (0-based) local step t (a fragment's outer step: the eta of its round)."""
        ...


class Timing(Protocol):
    """When a round's model synchronises; ``rounds`` is the algorithm (``RoundCalls``)."""

    declared: ClassVar[tuple[Declared, ...]]

    def new_state(self, x: Any) -> dict[str, Any]:
        """Each of ``declared`` at the start."""
        ...

    def after_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """What follows local step ``state.step`` (``state.steps_in_round`` of its round)."""
        ...

    def synchronized(self, state: Any) -> bool:
        """Whether every rank holds the same x."""
        ...

    def in_flight(self, step: int) -> list[tuple[int, int]]:
        """(fragment, step it was sent) of the reductions still in flight after ``step``."""
        ...

    def drain(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """Complete what is still in flight (the end of a run)."""
        ...

    def trace_columns(self) -> tuple[str, ...]: ...

    def trace_row(self, state: Any) -> dict[str, Any]: ...


@dataclass(frozen=True)
class EveryInterval:
    """The whole model every I_i local steps: ``local_steps`` (I_i per rank), else ``interval``."""

    interval: int
    local_steps: tuple[int, ...] = ()
    declared: ClassVar[tuple[Declared, ...]] = ()

    def interval_of(self, rank: int) -> int:
        """I_i: the local steps rank ``rank`` runs per round."""
        return self.local_steps[rank] if self.local_steps else self.interval

    def new_state(self, x: Any) -> dict[str, Any]:
        return {}

    def after_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        if state.steps_in_round == self.interval_of(comm.rank):
            rounds.average(state, comm)
        else:
            rounds.group_round(state.x, state.steps_in_round, comm)

    def synchronized(self, state: Any) -> bool:
        """At a round's end."""
        return state.steps_in_round == 0

    def in_flight(self, step: int) -> list[tuple[int, int]]:
        """Nothing is in flight: every round is blocking."""
        return []

    def drain(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """Nothing is in flight."""

    def trace_columns(self) -> tuple[str, ...]:
        return ()

    def trace_row(self, state: Any) -> dict[str, Any]:
        return {}
