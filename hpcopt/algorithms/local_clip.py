"""Communication-efficient local gradient clipping (CELGC) and the naive parallel-clipping baseline.

Liu, Zhuang, Lei, Liao, "A Communication-Efficient Distributed Gradient Clipping Algorithm for
Training Deep Neural Networks", NeurIPS 2022. CELGC, on every rank i, for t = 0..T-1::

    if t % I == 0:  x_i <- (1/|S_r|) sum_{j in S_r} x_j     (round r = t // I; label "average")
    g_i = stochastic gradient at x_i                          (local minibatch)
    n_i = ||g_i||  (l2 over all parameters; "global": sqrt(mean_j ||g_j||^2), label "clip_norm")
    d_i = g_i + wd x_i ;  b_i <- mu b_i + d_i ;  d_i <- b_i | d_i + mu b_i (Nesterov)
    x_i <- x_i - min(eta_t, gamma_t / (n_i + 1e-10)) d_i

The average comes at the START of the step, t = 0 included (the authors' code); no gradient is
ever sent. S_r is every rank, or with ``participation`` p < 1 the ceil(p N) ranks that
``stream(seed, "participation", r)`` draws (the same on every rank); all ranks continue from
the participants' mean. Momentum buffers follow ``momentum_policy`` at each round (``keep``
local as in the authors' code, ``average`` over S_r on the label "momentum", ``reset``). Weight
decay enters the direction, not the norm (PyTorch's SGD after ``clip_grad_norm_``). A schedule
decays gamma with eta: gamma_t = gamma * eta_t / eta_0.

With ``group_size`` G and ``group_interval`` I1 (``hpcopt.algorithms.groups``), at the start of
a step t % I1 == 0 that starts no round, x_i becomes its group's mean (all the group's ranks,
whatever the participation of the global rounds; label "group_average"): local clipping inside
two-level periods.

The baseline (``NaiveParallelClip``) averages gradients every step (label "average") and takes
the same clipped step on g = (1/N) sum_i g_i, so every rank holds the same model.

With gamma = inf CELGC is PR-SGD (``LocalSGD``) with the same I: PR-SGD averages after step t
when (t + 1) % I == 0, CELGC before step t + 1, the same point; they differ only by CELGC's
no-op average of the common x_0 at t = 0 and by the last average, which PR-SGD takes inside the
run when I divides T and the training loop takes (label "final") otherwise.

The step above is the inner optimizer's with step size min(eta_t, gamma_t / (n_i + 1e-10))
(``inner_optimizer``: this SGD, or AdamW with that step size as its lr,
``hpcopt.algorithms.inner``). Each average but the first (of the common x_0, which starts the
first round) is followed by the outer optimizer's step (``outer_optimizer``,
``hpcopt.algorithms.outer``; eta there is eta_{t-1}, the round's last step's), and so is the
training loop's final average when the run ends on a complete round (I steps since the last
average, as when I divides T); evaluations and checkpoints between rounds see the plain mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..backend import array_module
from ..errors import HpcoptError
from .base import context, option
from .buffers import sync_buffers
from .data_parallel import DataParallelState, OuterOptions, ScheduledSGD
from .groups import GroupRounds
from .local_sgd import AVERAGE_LABEL
from .reducers import WHOLE, SubsetMean
from .state import AVERAGE, RESET, counter, flag, scalar

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any
Oracle = Callable[[Array, Array], Any]

CLIP_NORMS = ("local", "global")
CLIP_NORM_LABEL = "clip_norm"
NORM_EPSILON = 1e-10  # added to ||g|| as in the authors' code


@dataclass
class LocalClipState(DataParallelState):
    """A clipping rank's state: the data-parallel one and its clipping counters. On the GPU
    they are 0-d device arrays, read (int(), bool(), float()) only when a trace row,
    checkpoint or summary needs them: the clipping rule costs no transfer a step."""

    clipped: Any = flag(RESET)             # whether the last step was clipped on this rank
    clip_count: Any = counter(AVERAGE)       # steps clipped on this rank so far
    grad_norm: Any = scalar(RESET, math.nan)  # the norm the last step's rule used


@dataclass(frozen=True, kw_only=True)
class _ClippedSGD(ScheduledSGD):
    """Hyper-parameters and the update shared by CELGC and the baseline."""

    clips: ClassVar[bool] = True

    gamma: float = option(math.inf, "step-length bound: the step is "
                          "min(lr, gamma / ||g||) g, so a gradient is clipped when ||g|| > gamma / lr; "
                          "inf = no clipping")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.gamma > 0:  # inf is allowed (no clipping), nan is not
            raise HpcoptError(f"clipping gamma must be > 0 (inf disables clipping), got {self.gamma}")

    def trace_columns(self) -> tuple[str, ...]:
        """clip_fraction: the window's clipped steps / steps over all ranks."""
        return ("clip_fraction",)

    def step_clipped(self, state: LocalClipState) -> Any:
        return state.clipped

    def summary_tallies(self, state: LocalClipState) -> tuple[float, ...]:
        """The steps this rank clipped, and the steps it took."""
        return int(state.clip_count), state.step

    def summary_report(self, sums: Sequence[float]) -> tuple[dict[str, Any], list[str]]:
        """``clip_fraction``: clipped steps / steps over all ranks, and its line."""
        clipped, steps = sums
        fraction = float(clipped / steps) if steps else 0.0
        return ({"clip_fraction": fraction},
                [f"clipped           {100 * fraction:.1f}% of the steps (all ranks)"])

    def step_size(self, t: int, norm: Any) -> Any:
        """min(eta_t, gamma_t / (norm + 1e-10)) with gamma_t = gamma * eta_t / eta_0.

        ``norm`` on the host gives a float; a 0-d device array gives a 0-d float64 device array
        with the same value, without a transfer to the host."""
        lr = self.lr_at(t)
        gamma_t = self.gamma * (lr / self.lr)
        xp = array_module(norm)
        if xp is np:
            return min(lr, gamma_t / (float(norm) + NORM_EPSILON))
        return xp.minimum(lr, gamma_t / (norm.astype(xp.float64) + NORM_EPSILON))

    def init(self, x0: Array, comm: Comm, buffers: Array | None = None) -> LocalClipState:
        """State from x0; x0 is broadcast from rank 0 so every rank starts from the same model.

        ``buffers`` (the model's bound batch-norm statistics) is kept as ``state.buffers``.
        They never change a training step (batch norm normalizes a training batch by its own
        statistics), only evaluation: they follow ``buffer_policy`` right after each average of
        x (over all ranks, also with partial participation), so every step in the baseline (as
        PyTorch's DDP broadcasts buffers every step; they are small)."""
        return self.new_state(x0, comm, buffers, LocalClipState)

    def _update(self, state: LocalClipState, norm: Any) -> None:
        """The inner step with step size min(eta_t, gamma_t / (norm + eps)), from state.grad
        (overwritten)."""
        lr = self.lr_at(state.step)
        step_size = self.step_size(state.step, norm)
        on_host = isinstance(step_size, float)
        # a device step size enters in x's dtype, as a float does (NumPy's weak scalars)
        self.inner_step(state, step_size if on_host else step_size.astype(state.x.dtype))
        state.clipped = step_size < lr
        state.clip_count += state.clipped
        state.grad_norm = float(norm) if on_host else norm
        state.step += 1


@dataclass(frozen=True, kw_only=True)
class LocalClip(_ClippedSGD, OuterOptions, GroupRounds):
    """CELGC hyper-parameters (see the module docstring), validated at construction."""

    name: ClassVar[str] = "celgc"

    clip_norm: str = option("local", "the norm clipped: local ||g_i|| or global sqrt(mean_j ||g_j||^2)")
    participation: float = option(1.0, "fraction of ranks in each round's average")
    seed: int = context(0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clip_norm not in CLIP_NORMS:
            raise HpcoptError(f"unknown clipping norm {self.clip_norm!r} "
                              f"(choose from {', '.join(CLIP_NORMS)})")
        if not 0 < self.participation <= 1:
            raise HpcoptError(f"participation fraction must be in (0, 1], got {self.participation}")
        if self.seed < 0:
            raise HpcoptError(f"seed must be >= 0, got {self.seed}")
        self.check_groups(self.interval, ())

    @cached_property
    def reducer(self) -> SubsetMean:
        """How a round takes the mean: over its participants (all of them at participation 1)."""
        return SubsetMean(self.participation, self.seed)

    def step(self, state: LocalClipState, oracle: Oracle, comm: Comm) -> Any:
        """Average if t % I == 0 (else a group round when one is due), then one locally clipped
        step; returns the minibatch loss."""
        if state.step % self.interval == 0:
            self.average(state, comm)
        else:
            self.group_round(state.x, state.steps_in_round, comm)
        loss = oracle(state.x, state.grad)
        norm = comm.backend.xp.linalg.norm(state.grad)  # on the GPU: stays there
        if self.clip_norm == "global":
            local = float(norm)
            norm = math.sqrt(comm.allreduce_scalar(local * local, label=CLIP_NORM_LABEL) / comm.size)
        self._update(state, norm)
        state.steps_in_round += 1
        return loss

    def average(self, state: LocalClipState, comm: Comm) -> None:
        """x_i <- mean of x_j over this round's participants, the momentum policies, and (after
        the first) the outer step from the round's start."""
        def mean_(buffer: Array, label: str) -> None:
            self.reducer.mean_(buffer, state, WHOLE, comm, label)

        mean_(state.x, AVERAGE_LABEL)
        self.round_policies(state, mean_)
        if state.buffers is not None:
            sync_buffers(state.buffers, self.buffer_policy, comm)
        state.rounds += 1
        state.steps_in_round = 0
        if state.step > 0:
            self.outer_step(state, eta=self.lr_at(state.step - 1))
        elif (anchor := getattr(state, "anchor", None)) is not None:  # the first round's start
            anchor[...] = state.x

    def finish(self, state: DataParallelState, comm: Comm, label: str) -> None:
        """The training loop's final average; after a complete round also its outer step."""
        complete = state.steps_in_round == self.interval
        super().finish(state, comm, label)
        if complete:
            self.outer_step(state, eta=self.lr_at(state.step - 1))

    def init(self, x0: Array, comm: Comm, buffers: Array | None = None) -> LocalClipState:
        """_ClippedSGD's state; with groups, every rank makes its group's communicator now
        (collective)."""
        state = super().init(x0, comm, buffers)
        self.open_groups(comm)
        return state

    def steps_for(self, total_steps: int, rank: int, size: int) -> int:
        """Every rank runs all T steps; the groups must divide the ranks."""
        self.check_world(size)
        return total_steps

    def describe(self) -> str:
        return (f"I={self.interval}{self.describe_groups()}, gamma={self.gamma:g} ({self.clip_norm} norm)"
                f"{self.describe_optimizers()}")


@dataclass(frozen=True, kw_only=True)
class NaiveParallelClip(_ClippedSGD):
    """The baseline: g = (1/N) sum_i g_i every step (label "average"), one clipped step on g."""

    name: ClassVar[str] = "naive_clip"
    #: Options it has no use for but accepts at the value it embodies: it averages every step.
    implied: ClassVar[dict[str, Any]] = {"interval": 1}

    def step(self, state: LocalClipState, oracle: Oracle, comm: Comm) -> Any:
        """Gradient, its average over ranks, one clipped step; returns this rank's loss."""
        loss = oracle(state.x, state.grad)
        comm.average_(state.grad, label=AVERAGE_LABEL)
        self._update(state, comm.backend.xp.linalg.norm(state.grad))
        if state.buffers is not None:
            sync_buffers(state.buffers, self.buffer_policy, comm)
        state.rounds += 1
        return loss

    def describe(self) -> str:
        return f"gamma={self.gamma:g}{self.describe_inner()}"
