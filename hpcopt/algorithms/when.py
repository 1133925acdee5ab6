"""When PR-SGD's rounds synchronise: a piece (``Timing``) called before and after every local
step.

    every I_i   after rank i's I_i-th local step of a round: the round (``Rounds.average``:
                the mean, the policies, the outer step); after the other steps a group
                round when one is due (two-level, ``hpcopt.algorithms.groups``)
    at start    CELGC's phase: before rank i's step t when t % I_i == 0, t = 0 included (the
                authors' code); a group round before a step t % I1 == 0 that starts no round
    fragments   fragment p in turn, every I steps at offset p I / P, with group rounds
                between (Streaming DiLoCo: ``hpcopt.algorithms.streaming.FragmentSchedule``)

Each declares the state it keeps (the fragments' in flight), as the other pieces do, and
calls back into the algorithm's round through ``RoundCalls``.

The two phases of a whole-model round take the same rounds at the same points: the round before
step t = k I is the round after step k I - 1, shifted by one. They differ at the boundaries only:
at the start the first round averages the common x_0 (counted as a round; the outer optimizer's
anchor becomes that mean, no outer step), and a run whose last step ends a round (I divides T)
leaves that round to the training loop's final average over every rank (``pending``), followed
by its outer step, without the momentum policies. The outer step of the round before step t
uses eta at the previous round's last nominal step, (r - 1) I - 1 for its round r (counted from
the first, at t = 0): lr_{t-1} when every rank runs I steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .state import SCRATCH, Declared

if TYPE_CHECKING:
    from ..comm import Comm


class RoundCalls(Protocol):
    """What a timing calls in the algorithm (``RestartedSGD`` implements it): the parts of a
    round, for the timing to put in order."""

    def average(self, state: Any, comm: Comm, last_step: int | None = None) -> None:
        """The whole round: the mean, the buffer and momentum policies, the outer step (eta at
        ``last_step``, by default the round's own last step; -1: none, the mean becomes the
        anchor)."""
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

    def before_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """What precedes local step ``state.step`` (CELGC's round at a step's start)."""
        ...

    def after_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """What follows local step ``state.step`` (``state.steps_in_round`` of its round)."""
        ...

    def pending(self, state: Any, comm: Comm) -> bool:
        """Whether a complete round is still to be taken at the end of a run (by the final
        average and its outer step)."""
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

    def before_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """Nothing: the round follows the step."""

    def after_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        if state.steps_in_round == self.interval_of(comm.rank):
            rounds.average(state, comm)
        else:
            rounds.group_round(state.x, state.steps_in_round, comm)

    def pending(self, state: Any, comm: Comm) -> bool:
        """None: a round is taken right after its last step."""
        return False

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


@dataclass(frozen=True)
class AtRoundStart(EveryInterval):
    """CELGC's phase (module docstring): the whole model before rank i's step t when t % I_i
    == 0, t = 0 included. Its state: this rank's I_i (``round_steps``, set at the start, never
    saved), which tells a rank's round boundaries (``Rounds.clock``) from the state alone."""

    declared: ClassVar[tuple[Declared, ...]] = (("round_steps", SCRATCH, None),)

    def before_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        if state.step % self.interval_of(comm.rank) == 0:
            rounds.average(state, comm, last_step=state.rounds * self.interval - 1)
        else:
            rounds.group_round(state.x, state.steps_in_round, comm)

    def after_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """Nothing: the round precedes the next step."""

    def pending(self, state: Any, comm: Comm) -> bool:
        """After a complete round's last step (I_i steps since the last round)."""
        return bool(state.steps_in_round == self.interval_of(comm.rank))
