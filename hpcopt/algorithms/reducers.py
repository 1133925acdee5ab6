"""Reducers: how a round takes the ranks' mean, each with the state it keeps.

A round's "how" apart from its "when" (the schedule: every I steps, fragments in turn) and its
"what next" (the outer optimizer), as torch's model averagers keep the period apart from the
averaging. ``mean_(x, state, part, comm, label)`` sets ``x`` (``part`` of the model, or the
whole of it) to the ranks' mean, on every rank:

    plain   x <- (1/N) sum_j x_j: one allreduce (``Comm.average_``: the shared-memory window
            within a node under ``--averaging shm``), no state
    wire    the mean through a compressed wire with error feedback (``hpcopt.comm.wire``: of the
            pseudo-gradients anchor - x_j, or without an anchor of the models x_j; on several
            nodes hierarchically, ``hpcopt.comm.wire_nodes``); its state: e_i, ``wire_error``
            (per rank; reset on another number of ranks)

Either over a subset of the ranks, round r's participants (``participation`` < 1, CELGC's partial
participation: ``hpcopt.algorithms.participation.Participating``): the others send zeros in the
plain allreduce, nothing through a wire, and keep their error feedback.

A plain reducer's fragments are reduced in flight (``Iallreduce``, overlapped with the inner
steps that follow); a wire's are blocking (``in_flight`` False).

``--wire NAME`` names the round's reducer in the registry ``hpcopt.algorithms.kinds.reducers``: the wires
(``hpcopt.comm.codec.WIRES``) built in, entry points of the group ``hpcopt.reducers``, or
``reducers.register(name, piece)``; no wire (``''``) is the plain mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..backend import array_module
from ..comm.wire import wire_average_
from .pieces import Piece
from .state import RESET, VECTOR, Declared

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any
WHOLE = slice(None)  # the whole model, as a part of it


class Reducer(Protocol):
    """How a round takes the ranks' mean (module docstring)."""

    @property
    def declared(self) -> tuple[Declared, ...]:
        """The state fields it keeps (``hpcopt.algorithms.state.declaring``)."""
        ...

    @property
    def in_flight(self) -> bool:
        """Whether a fragment's reduction may stay in flight (a non-blocking allreduce)."""
        ...

    def new_state(self, x: Array) -> dict[str, Array]: ...

    def mean_(self, x: Array, state: Any, part: slice, comm: Comm, label: str) -> None: ...


@dataclass(frozen=True)
class PlainMean:
    """x <- the ranks' mean by one allreduce; no state."""

    declared: ClassVar[tuple[Declared, ...]] = ()
    in_flight: ClassVar[bool] = True

    def new_state(self, x: Array) -> dict[str, Array]:
        return {}

    def mean_(self, x: Array, state: Any, part: slice, comm: Comm, label: str) -> None:
        comm.average_(x, label=label)


@dataclass(frozen=True)
class WireMean:
    """x <- the ranks' mean through ``wire`` with error feedback (module docstring)."""

    wire: str
    node_round: str = "leader"  # on several nodes (hpcopt.comm.wire_nodes.NODE_ROUNDS)
    declared: ClassVar[tuple[Declared, ...]] = (("wire_error", VECTOR, RESET),)
    in_flight: ClassVar[bool] = False

    def new_state(self, x: Array) -> dict[str, Array]:
        """e_i = 0."""
        return {"wire_error": array_module(x).zeros_like(x)}

    def mean_(self, x: Array, state: Any, part: slice, comm: Comm, label: str) -> None:
        """``x`` holds this rank's model (of ``part``); the anchor and e_i are the state's."""
        anchor = None if state.anchor is None else state.anchor[part]
        wire_average_(x, anchor, state.wire_error[part], self.wire, comm, label, self.node_round)


PLAIN = PlainMean()



def wire_piece(name: str) -> Piece[Reducer]:
    """The registered reducer of the wire ``name`` (``hpcopt.algorithms.kinds.reducers``)."""
    return Piece(lambda options: WireMean(name))
