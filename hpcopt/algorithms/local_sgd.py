"""Parallel Restarted SGD (local SGD with periodic model averaging).

Yu, Yang, Zhu, "Parallel Restarted SGD with Faster Convergence and Less Communication", AAAI 2019.
Every rank i runs, from the common x_0 (broadcast from rank 0)::

    g_i = stochastic gradient at x_i                 (local minibatch)
    b_i <- mu b_i + g_i ;  d_i = g_i + mu b_i (Nesterov) | b_i (heavy ball) | g_i (mu = 0)
    x_i <- x_i - lr_t d_i                            (no communication)
    every I_i local steps: x_i <- (1/N) sum_j x_j    (one allreduce of d values, label "average")

I = 1 is parallel mini-batch SGD. With ``local_steps`` each rank i runs its own I_i steps per round
before the common averaging (the paper's heterogeneous-worker variant). Momentum buffers at a
round follow ``momentum_policy``: ``keep`` (local, as PyTorch and the authors' code),
``average`` (one more allreduce, label "momentum") or ``reset`` (zeroed). A model with batch norm
has a flat buffer of running statistics (``state.buffers``); right after x is averaged it follows
``buffer_policy`` (``hpcopt.algorithms.buffers.sync_buffers``, label "buffers").

The local step is the inner optimizer's (``inner_optimizer``: the SGD above, or AdamW,
``hpcopt.algorithms.inner``; adamw's m follows ``momentum_policy``, its v
``second_moment_policy``, label "second_moment"). The round's average is followed by the outer
optimizer's step (``outer_optimizer``, ``hpcopt.algorithms.outer``; eta_t there is lr_t at the
round's last nominal step, t = rounds * I - 1, the same on every rank): ``average``, the
default, is the restart above; ``nesterov`` with AdamW inside is DiLoCo (``--algorithm
diloco``), ``slowmo`` is SlowMo (``--algorithm slowmo``). A run that ends mid-round ends with
the plain average (the training loop's "final"), without an outer step. With ``fragments``,
``overlap`` or ``fragment_mix`` the rounds are streamed, fragment by fragment
(``hpcopt.algorithms.streaming``: Streaming DiLoCo). Which of the two a run has is its
timing (``hpcopt.algorithms.when``), the piece that decides what follows each local step.

Between rounds, ``group_size`` and ``group_interval`` add averages within groups of ranks
(``hpcopt.algorithms.groups``); ``wire`` sends the round's message cast or quantized, with
error feedback (``hpcopt.comm.wire``): the round's reducer (``hpcopt.algorithms.reducers``),
for whole-model rounds and fragments alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from ..comm.codec import WIRES
from ..comm.core import GROUP_LABEL
from ..comm.wire_nodes import NODE_LABEL, NODE_ROUNDS
from ..errors import HpcoptError
from .base import context, option
from .buffers import sync_buffers
from .data_parallel import AVERAGE_LABEL, DataParallelState, OuterOptions, Rounds
from .groups import GroupRounds
from .kinds import reducers
from .participation import check_participation, members_mean_, participating
from .reducers import PLAIN, WHOLE, Reducer, WireMean
from .state import VECTOR, Declared
from .streaming import FRAGMENT_LABEL, FragmentOptions
from .when import AtRoundStart, EveryInterval, Timing

#: The phases of a whole-model round (``hpcopt.algorithms.when``): after a round's last step
#: (PR-SGD's), or at the start of the next step (CELGC's, t = 0 included).
AFTER_STEP, AT_START = "after_step", "at_start"

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any
Oracle = Callable[[Array, Array], Any]
#: The wires that compress (their rounds on several nodes: ``node_round``).
COMPRESSING = tuple(wire for wire in WIRES if wire != "float32")


@dataclass(frozen=True, kw_only=True)
class RestartedSGD(FragmentOptions, GroupRounds, Rounds):
    """PR-SGD's rounds, with the outer optimizer a subclass chooses (``LocalSGD``, ``SlowMo``),
    group averages between them (``hpcopt.algorithms.groups``); streamed by fragments with
    ``fragments``, ``overlap``, ``fragment_mix`` (``hpcopt.algorithms.streaming``)."""

    local_steps: tuple[int, ...] = option((), "local steps per round of each rank (one value "
                                              "per rank); none = interval")
    wire: str = option("", f"what a round sends: {' | '.join(reducers.builtin())} (int8: a scale per "
                           "256 values), with error feedback (hpcopt.comm.wire), or a registered "
                           "reducer (hpcopt.algorithms.reducers); '' = x uncompressed")
    node_round: str = option("", "how a round crosses nodes: leader (a compressing wire's chunks "
                                 "by each node's first rank) | rails (by every rank of a node, its "
                                 "1/K: compressed rounds, and fragments without a wire) | flat (one "
                                 "collective of every rank); '' = leader for a compressing wire, "
                                 "flat for fragments without one (hpcopt.comm.wire_nodes)")
    participation: float = option(1.0, "fraction of ranks in each round's average")
    seed: int = context(0)

    #: When a whole-model round is taken (``AFTER_STEP``, ``AT_START``: CELGC's).
    round_phase: ClassVar[str] = AFTER_STEP

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(k < 1 for k in self.local_steps):
            raise HpcoptError(f"local_steps must all be >= 1, got {self.local_steps}")
        self.check_groups(self.interval, self.local_steps)
        check_participation(self.participation)
        if self.seed < 0:
            raise HpcoptError(f"seed must be >= 0, got {self.seed}")
        self.reducer  # noqa: B018 - its checks
        self.check_node_round()
        self.check_fragments(self.interval, {
            "local_steps": bool(self.local_steps), "momentum_policy": self.momentum_policy != "keep",
            "second_moment_policy": self.second_moment_policy != "keep",
            "wire": bool(self.wire) and self.overlap > 0,
            "participation": self.participation < 1 and self.overlap > 0})

    def check_node_round(self) -> None:
        """HpcoptError for a ``node_round`` that is not built for this run's rounds."""
        if self.node_round and self.node_round not in NODE_ROUNDS:
            raise HpcoptError(f"unknown node_round {self.node_round!r} (choose from "
                              f"{', '.join(NODE_ROUNDS)}, or '' for the default)")
        if not self.node_round or self.wire in COMPRESSING:
            return
        if self.wire or not self.streaming:
            raise HpcoptError(f"node_round applies to a compressing wire ({', '.join(COMPRESSING)}) or "
                              "to fragments without a wire, not to "
                              f"{f'wire {self.wire}' if self.wire else 'whole-model rounds without a wire'} "
                              "(see --averaging)")
        if self.node_round == "leader":
            raise HpcoptError("node_round leader is not built for fragments without a wire: rails or flat")

    @cached_property
    def timing(self) -> Timing:
        """When a round synchronises: every I_i steps (after the last, or at the next step's
        start: ``round_phase``), or the fragments in turn (streaming)."""
        if self.streaming:
            return self.fragment_schedule(self.interval, self.reducer, self.node_round == "rails")
        if self.round_phase == AT_START:
            return AtRoundStart(self.interval, self.local_steps)
        return EveryInterval(self.interval, self.local_steps)

    def in_flight(self, state: Any) -> bool:
        """Whether a fragment's reduction is still in flight after the last step."""
        return bool(self.timing.in_flight(state.step))

    @cached_property
    def reducer(self) -> Reducer:
        """How a round takes the ranks' mean: plain, or the reducer ``wire`` names (a wire
        with error feedback, or a registered one: ``hpcopt.algorithms.reducers``); a wire's
        crosses nodes as ``node_round`` says; over each round's participants with
        ``participation`` < 1 (``hpcopt.algorithms.participation``)."""
        reducer = reducers.make(self.wire, {}, self.run_context()) if self.wire else PLAIN
        if isinstance(reducer, WireMean) and self.node_round:  # '': the wire's own, leader
            reducer = replace(reducer, node_round=self.node_round)
        return participating(reducer, self.participation, self.seed)

    def steps_for(self, total_steps: int, rank: int, size: int) -> int:
        """Local steps rank ``rank`` runs so that every rank completes floor(T/I) rounds.

        Homogeneous: T. Heterogeneous: floor(T/I) * I_i (a partial last round is dropped).
        """
        if self.local_steps and len(self.local_steps) != size:
            raise HpcoptError(f"local_steps has {len(self.local_steps)} entries for {size} ranks")
        self.check_world(size)
        if not self.local_steps:
            return total_steps
        return total_steps // self.interval * self.local_steps[rank]

    def clock(self, state: Any) -> int | None:
        """A counter every rank passes through in the same order, or None between its ticks.

        Collectives outside the algorithm (logging, evaluation) may only run at its ticks: the
        local step when all ranks step together, the round with per-rank ``local_steps`` (at
        its end, or with the round at a step's start, where this rank's I_i steps end it).
        """
        if not self.local_steps:
            return state.step
        if self.round_phase == AT_START:
            return state.step // state.round_steps if state.step % state.round_steps == 0 else None
        return state.rounds if state.steps_in_round == 0 else None

    def clock_ticks(self, total_steps: int) -> int:
        """How many ticks of ``clock`` a run of T nominal steps has."""
        return total_steps // self.interval if self.local_steps else total_steps

    def init(self, x0: Array, comm: Comm, buffers: Array | None = None) -> DataParallelState:
        """State from x0; x0 is broadcast from rank 0 so every rank starts from the same model.
        ``buffers`` (the model's bound batch-norm statistics, the same initial values on every
        rank) is kept as ``state.buffers`` and synchronized at each round."""
        return self.new_state(x0, comm, buffers, DataParallelState)

    def declared(self) -> tuple[Declared, ...]:
        """Rounds' fields, the reducer's (the wire's error feedback e_i) and the timing's (a
        streaming run's fragments in flight)."""
        return super().declared() + self.reducer.declared + self.timing.declared

    def new_state(self, x0: Array, comm: Comm, buffers: Array | None, state_type: type) -> Any:
        """The rounds' state; with groups, every rank makes its group's communicator now
        (collective); the reducer's (the wire's error feedback) and the timing's (a streaming
        run's vector of what it sent and its reductions)."""
        state = super().new_state(x0, comm, buffers, state_type)
        self.open_groups(comm)
        for name, value in {**self.reducer.new_state(state.x), **self.timing.new_state(state.x)}.items():
            setattr(state, name, value)
        if isinstance(self.timing, AtRoundStart):
            state.round_steps = self.timing.interval_of(comm.rank)
        return state

    def step(self, state: DataParallelState, oracle: Oracle, comm: Comm) -> Any:
        """What the timing says precedes the step (CELGC's round), one local step, then what it
        says follows (a round, a group round, a fragment's turn).

        Returns the minibatch loss at the point where the gradient was taken.
        """
        self.timing.before_step(state, comm, self)
        loss = oracle(state.x, state.grad)
        self.local_step(state, comm)
        state.step += 1
        state.steps_in_round += 1
        self.timing.after_step(state, comm, self)
        return loss

    def local_step(self, state: DataParallelState, comm: Comm) -> None:
        """The inner optimizer's step from ``state.grad`` with step size lr_t (a clipping
        algorithm's: its rule's, ``hpcopt.algorithms.clipping``)."""
        self.inner_step(state, self.lr_at(state.step))

    def end_round(self, state: DataParallelState, comm: Comm) -> None:
        """The end of a streamed round, whose fragments took their turns: the batch-norm
        statistics by their policy, the round counted."""
        if state.buffers is not None:
            sync_buffers(state.buffers, self.buffer_policy, comm)
        state.rounds += 1
        state.steps_in_round = 0

    averaged_labels: ClassVar[tuple[str, ...]] = (AVERAGE_LABEL, FRAGMENT_LABEL, NODE_LABEL)
    round_labels: ClassVar[tuple[str, ...]] = (AVERAGE_LABEL, GROUP_LABEL, NODE_LABEL)

    def trace_columns(self) -> tuple[str, ...]:
        """The timing's (a streaming run's peak_bytes_in_flight)."""
        return self.timing.trace_columns()

    def trace_row(self, state: DataParallelState) -> dict[str, Any]:
        return self.timing.trace_row(state)

    def state_vectors(self) -> tuple[int, int]:
        """Rounds', and the per-rank vectors the reducer and the timing declare (the wire's
        error feedback, a streaming run's ``in_flight``)."""
        per_rank, shared = super().state_vectors()
        pieces = self.reducer.declared + self.timing.declared
        return per_rank + sum(kind == VECTOR for _, kind, _ in pieces), shared

    def synchronized(self, state: DataParallelState) -> bool:
        return self.timing.synchronized(state)

    def finish(self, state: DataParallelState, comm: Comm, label: str) -> None:
        """The timing first completes what is in flight (a streaming run's reductions); a
        complete round still pending (CELGC's phase) takes its outer step after the average."""
        pending = self.timing.pending(state, comm)
        self.timing.drain(state, comm, self)
        super().finish(state, comm, label)
        if pending:
            self.outer_step(state, eta=self.lr_at(state.rounds * self.interval - 1))

    def average(self, state: Any, comm: Comm, last_step: int | None = None) -> None:
        """The round: x_i <- mean_j x_j, the buffer policy, the momentum policies, then the
        outer step from the round's start. With ``wire`` the mean is taken through it (its
        error feedback: the declared field ``wire_error``); with ``participation`` over the
        round's participants, the policies' means too. ``last_step``: the round's last nominal
        step, whose lr is the outer step's eta (default: the round's I steps end here); -1 at
        the start, where the round's mean becomes the outer optimizer's anchor instead."""
        if last_step is None:
            last_step = (state.rounds + 1) * self.interval - 1
        self.reducer.mean_(state.x, state, WHOLE, comm, AVERAGE_LABEL)
        if state.buffers is not None:
            sync_buffers(state.buffers, self.buffer_policy, comm)
        self.round_policies(state, lambda buffer, label: members_mean_(self.reducer, buffer, state,
                                                                       comm, label))
        state.rounds += 1
        state.steps_in_round = 0
        if last_step >= 0:
            self.outer_step(state, eta=self.lr_at(last_step))
        elif (anchor := getattr(state, "anchor", None)) is not None:
            anchor[...] = state.x

    def describe(self) -> str:
        return (f"I={self.interval}{self.describe_groups()}{self.describe_optimizers()}"
                f"{self.describe_fragments()}")


@dataclass(frozen=True, kw_only=True)
class LocalSGD(RestartedSGD, OuterOptions):
    """PR-SGD hyper-parameters, validated at construction."""

    name: ClassVar[str] = "prsgd"
