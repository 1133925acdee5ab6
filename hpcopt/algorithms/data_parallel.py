"""What the data-parallel algorithms share: their state, the step-size and inner-optimizer
options, the rounds (interval, what a round does to the inner optimizer's state, the outer
optimizer), the checks of momentum and batch-norm policy, and the end of a run.

A data-parallel rank holds its own model x_i in one flat buffer; ranks agree at averaging
rounds. The local step is the inner optimizer's (``hpcopt.algorithms.inner``: sgd, adamw or
muon, each a piece with its own moments); a round's average is followed by the outer
optimizer's step (``hpcopt.algorithms.outer``). The state's fields declare what a checkpoint
holds (``hpcopt.algorithms.state``), the pieces' among them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import HpcoptError
from .base import DATA_PARALLEL, check_momentum, context, context_fields, option, positive_finite
from .buffers import BUFFER_POLICIES, check_buffer_policy, sync_buffers
from .inner import INNER_OPTIONS, Inner, declared
from .kinds import inner_optimizers, outer_optimizers
from .momentum import (
    MOMENTUM_LABEL,
    MOMENTUM_POLICIES,
    SECOND_MOMENT_LABEL,
    apply_momentum_policy,
    check_momentum_policy,
)
from .outer import OUTER_OPTIONS, Outer
from .reducers import WHOLE
from .schedules import SCHEDULES, Schedule
from .schedules import describe as describe_schedule
from .state import AVERAGE, SAME, SHARED, Declared, counter, declaring, model, scratch, vector

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any

AVERAGE_LABEL = "average"  # the communication label of a round's average of the models


@dataclass
class DataParallelState:
    """What every data-parallel rank carries between steps (the checkpoint saves the declared
    fields: x per rank only mid-round, the averaged model otherwise)."""

    x: Array = model()
    grad: Array = scratch()
    step: int = counter(SAME)            # local steps taken on this rank
    rounds: int = counter(SAME)          # averaging rounds completed
    steps_in_round: int = counter(SAME)  # local steps since the last averaging
    buffers: Array | None = vector(AVERAGE)  # batch-norm running statistics (None: the model has none)
    # the pieces add their own fields (``ScheduledSGD.declared``): the inner optimizer's
    # moments, the outer optimizer's anchor and moments, the wire's error feedback, the
    # fragments in flight


@dataclass(frozen=True, kw_only=True)
class ScheduledSGD:
    """Options every data-parallel algorithm has: the step size lr_t and its schedule, the inner
    optimizer (sgd with momentum, or adamw), weight decay and the batch-norm buffer policy;
    context: the world size and run length (sqrt_nt, cosine)."""

    parallelism: ClassVar[str] = DATA_PARALLEL
    clips: ClassVar[bool] = False
    implied: ClassVar[dict[str, Any]] = {}

    lr: float = option(0.1, "learning rate eta")
    schedule: str = option("constant",
                           "learning-rate schedule: constant | step (decay at milestones) | sqrt_nt | "
                           "cosine (from lr after the warmup to 0 at the run's last step)")
    warmup: int = option(0, "linear warmup W: local step t < W takes the schedule's lr_t times "
                            "(t+1)/W; 0 = none")
    decay: float = option(0.1, "step schedule: factor applied at each milestone")
    milestones: tuple[int, ...] = option((), "step schedule: increasing steps at which lr is "
                                             "multiplied by decay")
    momentum: float = option(INNER_OPTIONS["momentum"], "heavy-ball momentum mu; 0 = plain SGD")
    nesterov: bool = option(INNER_OPTIONS["nesterov"], "Nesterov momentum instead of heavy ball")
    inner_optimizer: str = option("sgd", f"the local step: {' | '.join(inner_optimizers.builtin())} "
                                         "(momentum and nesterov are sgd's and muon's; muon "
                                         "orthogonalises each weight matrix's step, other "
                                         "parameters take sgd's; its Newton-Schulz iterations "
                                         "cost the same at any batch: about 36x sgd's time per "
                                         "step on the default MLP at batch 32, 6x at 512, "
                                         "docs/algorithms.md)")
    adam_beta1: float = option(INNER_OPTIONS["adam_beta1"], "adamw: decay of the first moment m")
    adam_beta2: float = option(INNER_OPTIONS["adam_beta2"], "adamw: decay of the second moment v")
    adam_eps: float = option(INNER_OPTIONS["adam_eps"], "adamw: eps added to sqrt(v)")
    weight_decay: float = option(INNER_OPTIONS["weight_decay"],
                                 "weight decay wd: sgd adds wd x to each local gradient (L2), "
                                      "adamw multiplies x by 1 - lr wd (decoupled)")
    buffer_policy: str = option("average", f"batch-norm statistics at a round: "
                                           f"{', '.join(BUFFER_POLICIES)}")
    workers: int = context(1)
    total_steps: int = context(1)
    parameter_shapes: tuple[tuple[int, ...], ...] = context(())  # the model's, in the flat vector

    #: The labels of the averaging whose bytes the run's summary reports ("averaging the d
    #: parameters"), and those of a round's calls whose modelled seconds it shows per call.
    averaged_labels: ClassVar[tuple[str, ...]] = (AVERAGE_LABEL,)
    round_labels: ClassVar[tuple[str, ...]] = (AVERAGE_LABEL,)

    def __post_init__(self) -> None:
        positive_finite("lr", self.lr)
        if self.schedule not in SCHEDULES:
            raise HpcoptError(f"unknown schedule {self.schedule!r} (choose from {', '.join(SCHEDULES)})")
        check_momentum(self.momentum, self.nesterov)
        check_buffer_policy(self.buffer_policy)
        self.lr_schedule  # noqa: B018 - the schedule's own checks (decay, milestones)
        self.inner  # noqa: B018 - its checks, of the options it reads; the others must be unset

    @property
    def adamw(self) -> bool:
        return self.inner_optimizer == "adamw"

    @cached_property
    def inner(self) -> Inner:
        """The inner optimizer ``inner_optimizer`` names, made from the options it reads
        (``hpcopt.algorithms.pieces``)."""
        return inner_optimizers.make(self.inner_optimizer, self.options_of(INNER_OPTIONS),
                                     self.run_context())

    def options_of(self, kind: Mapping[str, Any]) -> dict[str, Any]:
        """This algorithm's values of one kind of piece's options (``kind``: theirs, unset)."""
        return {key: getattr(self, key) for key in kind}

    def run_context(self) -> dict[str, Any]:
        """The facts of the run (its context fields) a piece may read."""
        return {key: getattr(self, key) for key in context_fields(type(self))}

    def declared(self) -> tuple[Declared, ...]:
        """The state fields the pieces keep besides ``state_type``'s: the inner optimizer's."""
        return declared(self.inner)

    @cached_property
    def lr_schedule(self) -> Schedule:
        return Schedule(self.schedule, self.lr, self.decay, self.milestones, self.workers,
                        self.total_steps, self.warmup)

    def lr_at(self, t: int) -> float:
        """lr_t at the (0-based) local step t."""
        return self.lr_schedule(t)

    def new_state(self, x0: Array, comm: Comm, buffers: Array | None, state_type: type) -> Any:
        """``state_type`` from x0, broadcast from rank 0 so every rank starts from the same model;
        ``buffers`` (the model's bound batch-norm statistics) is kept as ``state.buffers``.
        ``state.x`` holds x0's values in node-shared memory where the averaging can reduce it
        there in place (``Comm.shared_like``); the model is bound to it at its first step.
        ``state_type`` gains the fields the pieces declare (``declared``) where it lacks them."""
        moments = self.inner.new_state(x0)
        comm.bcast_(x0, root=0, label="init")
        x = comm.shared_like(x0)
        return declaring(state_type, self.declared())(
            x=x, grad=comm.backend.xp.zeros_like(x0), buffers=buffers, **moments)

    def inner_step(self, state: DataParallelState, lr: Any) -> None:
        """x <- the inner optimizer's step from the gradient in ``state.grad`` (overwritten)
        with step size ``lr``: a float, or a 0-d device array in x's dtype."""
        self.inner.step(state, lr, self.moment_steps(state))

    def moment_steps(self, state: DataParallelState) -> tuple[int, int]:
        """AdamW's k1, k2: the steps its moments m, v have accumulated, this one included
        (here never reset: every step so far)."""
        return state.step + 1, state.step + 1

    def state_vectors(self) -> tuple[int, int]:
        """(per-rank, shared) vectors of d values the state holds besides x: the inner
        optimizer's moments."""
        return self.inner.vectors, 0

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

    def round_ends(self, state: DataParallelState, tick: int) -> bool:
        """Whether clock tick ``tick`` ends a round (where ``--on-rank-loss continue`` keeps its
        snapshots): without an interval, wherever every rank holds the same x."""
        return self.synchronized(state)

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

    def in_flight(self, state: Any) -> bool:
        """Whether a reduction is still in flight after the last step: none (blocking rounds)."""
        return False

    def describe_schedule(self) -> str:
        """The lr schedule beyond a constant lr, for the run's header ("" for none)."""
        return describe_schedule(self.schedule, self.warmup)

    def warnings(self) -> tuple[str, ...]:
        """What rank 0 warns of at the start (``hpcopt: warning: ...``): options that run but
        that users rarely mean. A warmup longer than the run: its step size never reaches lr."""
        if self.warmup > self.total_steps:
            return (f"warmup {self.warmup} is longer than the run ({self.total_steps} steps): the step "
                    f"size is still warming up at the end, at {self.total_steps}/{self.warmup} of the "
                    "schedule's lr (shorten --warmup, or train longer)",)
        return ()

    # -- what the algorithm reports besides the loss (the session names no algorithm) ----------

    def trace_columns(self) -> tuple[str, ...]:
        """The columns it adds to every trace row (``hpcopt.io.trace.OPTIONAL_COLUMNS``): none."""
        return ()

    def trace_row(self, state: Any) -> dict[str, Any]:
        """The values of its own ``trace_columns`` that it knows at a row (the trace window
        fills the others, e.g. clip_fraction): none."""
        return {}

    def step_clipped(self, state: Any) -> Any:
        """Whether its last step was clipped (the trace window counts them when ``clips``): no."""
        return False

    def summary_tallies(self, state: Any) -> tuple[float, ...]:
        """This rank's numbers the run's summary sums over the ranks (for ``summary_report``)."""
        return ()

    def summary_report(self, sums: Sequence[float]) -> tuple[dict[str, Any], list[str]]:
        """From ``summary_tallies`` summed over the ranks: the run summary's fields it sets
        (``hpcopt.run.data_parallel.Summary``) and the lines it adds there."""
        return {}, []

    def describe_inner(self) -> str:
        """The inner optimizer, for ``describe`` (empty for sgd)."""
        inner = self.inner.describe()
        return f", {inner}" if inner else ""


@dataclass(frozen=True, kw_only=True)
class Rounds(ScheduledSGD):
    """Options of the algorithms that average every I local steps, and what a round does: the
    momentum policies on the inner optimizer's state, then the outer optimizer's step."""

    interval: int = option(8, "I: local steps between averaging rounds (1 = parallel mini-batch SGD)")
    momentum_policy: str = option("keep", f"momentum buffers (sgd's b, adamw's m) at a round: "
                                          f"{' | '.join(MOMENTUM_POLICIES)}")
    second_moment_policy: str = option("keep", f"adamw's second moment v at a round: "
                                               f"{' | '.join(MOMENTUM_POLICIES)}")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.interval < 1:
            raise HpcoptError(f"interval I must be >= 1, got {self.interval}")
        check_momentum_policy(self.momentum_policy)
        check_momentum_policy(self.second_moment_policy, "second_moment_policy")
        if not self.adamw and self.second_moment_policy != "keep":
            raise HpcoptError(f"second_moment_policy applies only to inner_optimizer adamw, "
                              f"not {self.inner_optimizer}")
        self.outer  # noqa: B018 - its checks

    def round_ends(self, state: DataParallelState, tick: int) -> bool:
        """Every I ticks (the models may differ there: CELGC's, a streaming run's)."""
        return tick % self.interval == 0

    def warnings(self) -> tuple[str, ...]:
        """ScheduledSGD's, and AdamW's first moment averaged at the rounds while its second is
        not: where a rank's gradient of a parameter is 0 (a pixel its shard never lights, a
        dead unit), its own v stays 0 while the averaged m is not, and m / (sqrt(v) + eps)
        steps that parameter by up to lr m / eps."""
        found = super().warnings()
        if self.adamw and self.momentum_policy == "average" and self.second_moment_policy != "average":
            found += (f"momentum_policy average with adamw and second_moment_policy "
                      f"{self.second_moment_policy}: where a rank's gradient of a parameter is 0, its "
                      "second moment v stays near 0 while the averaged first moment m is not, and "
                      "m / (sqrt(v) + eps) can make the run diverge; pass --second-moment-policy "
                      "average too",)
        return found

    @property
    def outer(self) -> Outer:
        """The outer optimizer a round applies (``OuterOptions``: the options'; SlowMo: its own)."""
        raise NotImplementedError

    def new_state(self, x0: Array, comm: Comm, buffers: Array | None, state_type: type) -> Any:
        """ScheduledSGD's state and the outer optimizer's (its declared ``fields``, added to
        ``state_type`` where it lacks them). The moments that a policy averages at the rounds
        live in node-shared memory where the averaging can reduce them there
        (``Comm.shared_like``), like x."""
        state = super().new_state(x0, comm, buffers, state_type)
        for name, policy in zip(self.inner.fields, self.moment_policies):
            moment = getattr(state, name)
            if moment is not None and policy == "average":
                setattr(state, name, comm.shared_like(moment))
        for name, value in self.outer.new_state(state.x).items():
            setattr(state, name, value)
        return state

    def declared(self) -> tuple[Declared, ...]:
        """The inner optimizer's fields and the outer optimizer's (shared)."""
        return super().declared() + tuple((name, SHARED, None) for name in self.outer.fields)

    @property
    def moment_policies(self) -> tuple[str, str]:
        """The policies of the inner optimizer's first and second moment at a round."""
        return self.momentum_policy, self.second_moment_policy

    def round_policies(self, state: DataParallelState, average: Callable[[Array, str], Any]) -> None:
        """``momentum_policy`` on the inner optimizer's first moment (sgd's b or adamw's m,
        label "momentum") and ``second_moment_policy`` on its second (adamw's v, label
        "second_moment"); ``average(buffer, label)`` averages a buffer in place."""
        for name, policy, label in zip(self.inner.fields, self.moment_policies,
                                       (MOMENTUM_LABEL, SECOND_MOMENT_LABEL)):
            apply_momentum_policy(getattr(state, name), policy, average, label)

    def moment_steps(self, state: DataParallelState) -> tuple[int, int]:
        """A moment reset at each round has accumulated this round's steps, another all of them."""
        since_reset, since_start = state.steps_in_round + 1, state.step + 1
        return (since_reset if self.momentum_policy == "reset" else since_start,
                since_reset if self.second_moment_policy == "reset" else since_start)

    def state_vectors(self) -> tuple[int, int]:
        """ScheduledSGD's, and the outer optimizer's state (shared)."""
        per_rank, _ = super().state_vectors()
        kept = self.outer.new_state(np.zeros(1))  # which fields this run holds, on a stand-in x
        return per_rank, sum(value is not None for value in kept.values())

    def outer_step(self, state: DataParallelState, eta: float, mean: Array | None = None,
                   part: slice = WHOLE) -> None:
        """The outer optimizer's step, the one place every round takes it (whole-model rounds
        and streaming fragments alike): from the round's mean (``state.x`` unless given; a
        fragment's: ``mean`` and ``part`` of the model) on that part of each of its fields
        (``state.grad``, free between steps, as scratch); ``mean`` becomes the new start.
        ``eta``: the base lr at the round's last step."""
        values = {name: None if (value := getattr(state, name)) is None else value[part]
                  for name in self.outer.fields}
        self.outer.step(state.x[part] if mean is None else mean, values, state.grad[part], eta)

    def describe_optimizers(self) -> str:
        """The inner and outer optimizers, for ``describe`` (empty for sgd and the average)."""
        outer = self.outer.describe()
        return self.describe_inner() + (f", {outer}" if outer else "")


@dataclass(frozen=True, kw_only=True)
class OuterOptions(Rounds):
    """The outer optimizer chosen by options (PR-SGD, CELGC)."""

    outer_optimizer: str = option("average", f"what a round does with the ranks' mean: "
                                             f"{' | '.join(outer_optimizers.builtin())} "
                                             "(hpcopt.algorithms.outer)")
    outer_lr: float = option(OUTER_OPTIONS["outer_lr"],
                             "the outer optimizer's learning rate (sgd, nesterov: 1 = DiLoCo's 0.7 "
                             "where outer_momentum is 0, slowmo; fedadam, fedyogi: 1 = 0.01)")
    outer_momentum: float = option(OUTER_OPTIONS["outer_momentum"],
                                   "the outer optimizer's momentum (sgd: heavy ball, "
                                   "nesterov: 0 = DiLoCo's 0.9, slowmo: its beta, fedadam and "
                                   "fedyogi: their beta1, 0 = 0.9)")
    outer_beta2: float = option(OUTER_OPTIONS["outer_beta2"],
                                "fedadam, fedyogi: decay beta2 of the outer second moment v")
    outer_tau: float = option(OUTER_OPTIONS["outer_tau"],
                              "fedadam, fedyogi: tau added to sqrt(v) (their adaptivity)")

    @cached_property
    def outer(self) -> Outer:
        """The outer optimizer ``outer_optimizer`` names, made from the options it reads
        (``hpcopt.algorithms.pieces``)."""
        return outer_optimizers.make(self.outer_optimizer, self.options_of(OUTER_OPTIONS),
                                     self.run_context())
