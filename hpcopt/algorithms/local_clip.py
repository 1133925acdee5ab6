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

The baseline (``NaiveParallelClip``) averages gradients every step (label "average") and takes
the same clipped step on g = (1/N) sum_i g_i, so every rank holds the same model.

With gamma = inf CELGC is PR-SGD (``LocalSGD``) with the same I: PR-SGD averages after step t
when (t + 1) % I == 0, CELGC before step t + 1, the same point; they differ only by CELGC's
no-op average of the common x_0 at t = 0 and by the last average, which PR-SGD takes inside the
run when I divides T and the training loop takes (label "final") otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..backend import array_module
from ..comm import Comm
from ..errors import UserError
from ..rng import stream
from .buffers import check_buffer_policy, sync_buffers
from .local_sgd import AVERAGE_LABEL, MOMENTUM_LABEL
from .momentum import MOMENTUM_POLICIES, apply_momentum_policy, momentum_direction
from .schedules import Schedule

Array = Any
Oracle = Callable[[Array, Array], Any]

CLIP_NORMS = ("local", "global")
CLIP_NORM_LABEL = "clip_norm"
NORM_EPSILON = 1e-10  # added to ||g|| as in the authors' code


@dataclass
class LocalClipState:
    """Everything a clipping rank carries between steps (the checkpoint saves exactly this)."""

    x: Array
    grad: Array
    momentum: Array | None
    step: int = 0              # steps taken (the same on every rank)
    rounds: int = 0            # averaging rounds completed
    steps_in_round: int = 0    # local steps since the last averaging
    buffers: Array | None = None  # batch-norm running statistics (None: the model has none)
    # On the GPU the next three are 0-d device arrays, read (int(), bool(), float()) only when
    # a trace row, checkpoint or summary needs them: the clipping rule costs no transfer a step.
    clipped: Any = False       # whether the last step was clipped on this rank
    clip_count: Any = 0        # steps clipped on this rank so far
    grad_norm: Any = math.nan  # the norm the last step's rule used


@dataclass(frozen=True)
class _ClippedSGD:
    """Hyper-parameters and the update shared by CELGC and the baseline."""

    schedule: Schedule
    gamma: float
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    buffer_policy: str = "average"  # batch-norm statistics: local, average, rank0 (see init)

    def __post_init__(self) -> None:
        check_buffer_policy(self.buffer_policy)
        if not self.gamma > 0:  # inf is allowed (no clipping), nan is not
            raise UserError(f"clipping gamma must be > 0 (inf disables clipping), got {self.gamma}")
        if not 0 <= self.momentum < 1:
            raise UserError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.nesterov and self.momentum == 0:
            raise UserError("nesterov needs momentum > 0")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise UserError(f"weight_decay must be >= 0, got {self.weight_decay}")

    def steps_for(self, total_steps: int, rank: int, size: int) -> int:
        """Every rank runs all T steps."""
        return total_steps

    def clock(self, state: LocalClipState) -> int:
        """The step: all ranks step together, so any step is a safe point for a collective."""
        return state.step

    def clock_ticks(self, total_steps: int) -> int:
        return total_steps

    def step_size(self, t: int, norm: Any) -> Any:
        """min(eta_t, gamma_t / (norm + 1e-10)) with gamma_t = gamma * eta_t / eta_0.

        ``norm`` on the host gives a float; a 0-d device array gives a 0-d float64 device array
        with the same value, without a transfer to the host."""
        lr = self.schedule(t)
        gamma_t = self.gamma * (lr / self.schedule.lr)
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
        comm.bcast_(x0, root=0, label="init")
        xp = comm.backend.xp
        momentum = xp.zeros_like(x0) if self.momentum > 0 else None
        return LocalClipState(x=x0, grad=xp.zeros_like(x0), momentum=momentum, buffers=buffers)

    def _update(self, state: LocalClipState, norm: Any) -> None:
        """x <- x - min(eta_t, gamma_t / (norm + eps)) d, d from state.grad (overwritten)."""
        if self.weight_decay:
            state.grad += self.weight_decay * state.x
        direction = momentum_direction(state.grad, state.momentum, self.momentum, self.nesterov)
        lr = self.schedule(state.step)
        step_size = self.step_size(state.step, norm)
        on_host = isinstance(step_size, float)
        # a device step size enters in x's dtype, as a float does (NumPy's weak scalars)
        state.x -= (step_size if on_host else step_size.astype(state.x.dtype)) * direction
        state.clipped = step_size < lr
        state.clip_count += state.clipped
        state.grad_norm = float(norm) if on_host else norm
        state.step += 1


@dataclass(frozen=True)
class LocalClip(_ClippedSGD):
    """CELGC hyper-parameters (see the module docstring), validated at construction."""

    interval: int = 1
    norm: str = "local"
    momentum_policy: str = "keep"
    participation: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.interval < 1:
            raise UserError(f"interval I must be >= 1, got {self.interval}")
        if self.norm not in CLIP_NORMS:
            raise UserError(f"unknown clipping norm {self.norm!r} "
                            f"(choose from {', '.join(CLIP_NORMS)})")
        if self.momentum_policy not in MOMENTUM_POLICIES:
            raise UserError(f"unknown momentum_policy {self.momentum_policy!r} "
                            f"(choose from {', '.join(MOMENTUM_POLICIES)})")
        if not 0 < self.participation <= 1:
            raise UserError(f"participation fraction must be in (0, 1], got {self.participation}")
        if self.seed < 0:
            raise UserError(f"seed must be >= 0, got {self.seed}")

    def participants(self, round_index: int, size: int) -> np.ndarray:
        """The sorted ranks whose models form round ``round_index``'s average: all of them, or
        ceil(p N) drawn without replacement from ``stream(seed, "participation", round)``."""
        if self.participation == 1:
            return np.arange(size)
        count = max(1, math.ceil(self.participation * size - 1e-9))  # 0.7 * 10 is 7.000000000000001
        chosen = stream(self.seed, "participation", round_index).choice(size, count, replace=False)
        return np.sort(chosen)

    def step(self, state: LocalClipState, oracle: Oracle, comm: Comm) -> Any:
        """Average if t % I == 0, then one locally clipped step; returns the minibatch loss."""
        if state.step % self.interval == 0:
            self.average(state, comm)
        loss = oracle(state.x, state.grad)
        norm = comm.backend.xp.linalg.norm(state.grad)  # on the GPU: stays there
        if self.norm == "global":
            local = float(norm)
            norm = math.sqrt(comm.allreduce_scalar(local * local, label=CLIP_NORM_LABEL) / comm.size)
        self._update(state, norm)
        state.steps_in_round += 1
        return loss

    def average(self, state: LocalClipState, comm: Comm) -> None:
        """x_i <- mean of x_j over this round's participants, and the momentum policy."""
        members = self.participants(state.rounds, comm.size)
        self._mean_over(state.x, members, comm, AVERAGE_LABEL)
        apply_momentum_policy(state.momentum, self.momentum_policy,
                              lambda b: self._mean_over(b, members, comm, MOMENTUM_LABEL))
        if state.buffers is not None:
            sync_buffers(state.buffers, self.buffer_policy, comm)
        state.rounds += 1
        state.steps_in_round = 0

    @staticmethod
    def _mean_over(buf: Array, members: np.ndarray, comm: Comm, label: str) -> None:
        """buf <- (1/|S|) sum_{j in S} buf_j on every rank: one allreduce of the buffer."""
        if members.size == comm.size:
            comm.average_(buf, label=label)
            return
        if comm.rank not in members:
            buf[...] = 0
        comm.allreduce_(buf, MPI.SUM, label=label)
        buf /= members.size


@dataclass(frozen=True)
class NaiveParallelClip(_ClippedSGD):
    """The baseline: g = (1/N) sum_i g_i every step (label "average"), one clipped step on g."""

    def step(self, state: LocalClipState, oracle: Oracle, comm: Comm) -> Any:
        """Gradient, its average over ranks, one clipped step; returns this rank's loss."""
        loss = oracle(state.x, state.grad)
        comm.average_(state.grad, label=AVERAGE_LABEL)
        self._update(state, comm.backend.xp.linalg.norm(state.grad))
        if state.buffers is not None:
            sync_buffers(state.buffers, self.buffer_policy, comm)
        state.rounds += 1
        return loss
