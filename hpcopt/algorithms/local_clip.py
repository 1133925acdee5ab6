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

CELGC is not a round of its own: it is PR-SGD's one round (``LocalSGD``) with three pieces
chosen, as DiLoCo is a preset of it. The clipping rule of the inner step
(``hpcopt.algorithms.clipping``: gamma, the local or global norm, its own state), the round at
a step's start (``round_phase``, ``hpcopt.algorithms.when.AtRoundStart``) and the reducer over
each round's participants (``participation``, ``hpcopt.algorithms.participation``, which every
round has). So it takes the round's other pieces as PR-SGD does. ``wire``: each round's mean
through the compressed wire, over the participants; the first round (of x_0) too. ``local_steps``:
rank i's rounds before its steps t % I_i == 0, outer eta at the round's nominal last step.
``fragments``: Streaming DiLoCo's fragments, which take their turns after the steps, with the
clipped inner step. Refused: ``clip_norm global`` with ``local_steps`` (ranks with their own
round lengths do not step together, so there is no common step whose norms to share).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..comm.wire_nodes import NODE_LABEL
from ..errors import HpcoptError
from .base import option
from .buffers import sync_buffers
from .clipping import (
    CLIP_NORM_LABEL,
    CLIP_NORMS,
    NORM_EPSILON,
    Clipped,
    ClippingState,
    check_clip_norm,
    gradient_norm,
)
from .local_sgd import AT_START, AVERAGE_LABEL, LocalSGD
from .streaming import FRAGMENT_LABEL

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any
Oracle = Callable[[Array, Array], Any]

#: The clipping rule's state, under the name CELGC's state had.
LocalClipState = ClippingState
__all__ = ["CLIP_NORMS", "CLIP_NORM_LABEL", "NORM_EPSILON", "LocalClip", "LocalClipState",
           "NaiveParallelClip"]


@dataclass(frozen=True, kw_only=True)
class LocalClip(Clipped, LocalSGD):
    """CELGC: PR-SGD's round with the clipping rule, the round at a step's start and partial
    participation (module docstring); validated at construction."""

    name: ClassVar[str] = "celgc"
    round_phase: ClassVar[str] = AT_START
    averaged_labels: ClassVar[tuple[str, ...]] = (AVERAGE_LABEL, FRAGMENT_LABEL, NODE_LABEL)
    round_labels: ClassVar[tuple[str, ...]] = (AVERAGE_LABEL, NODE_LABEL)

    clip_norm: str = option("local", "the norm clipped: local ||g_i|| or global sqrt(mean_j ||g_j||^2)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_clip_norm(self.clip_norm)
        if self.clip_norm == "global" and self.local_steps:
            raise HpcoptError("clip_norm global applies only when every rank takes its steps with "
                              "the others (not with local_steps: the ranks' steps do not line up, "
                              "so there is no common step whose norms to share)")

    def init(self, x0: Array, comm: Comm, buffers: Array | None = None) -> ClippingState:
        """The round's state with the clipping rule's; x0 is broadcast from rank 0, ``buffers``
        (the batch-norm statistics) follow ``buffer_policy`` after each average of x (over all
        ranks, also with partial participation); with groups every rank makes its group's
        communicator now (collective)."""
        return self.new_state(x0, comm, buffers, ClippingState)

    def local_step(self, state: Any, comm: Comm) -> None:
        """The clipped inner step on this rank's norm (``clip_norm``)."""
        self.clipped_step(state, gradient_norm(state, self.clip_norm, comm))

    def trace_columns(self) -> tuple[str, ...]:
        """clip_fraction, and the timing's (a streaming run's peak_bytes_in_flight)."""
        return Clipped.trace_columns(self) + self.timing.trace_columns()

    def describe(self) -> str:
        return (f"I={self.interval}{self.describe_groups()}, gamma={self.gamma:g} ({self.clip_norm} norm)"
                f"{self.describe_optimizers()}{self.describe_fragments()}")


@dataclass(frozen=True, kw_only=True)
class NaiveParallelClip(Clipped):
    """The baseline: g = (1/N) sum_i g_i every step (label "average"), one clipped step on g."""

    name: ClassVar[str] = "naive_clip"
    #: Options it has no use for but accepts at the value it embodies: it averages every step.
    implied: ClassVar[dict[str, Any]] = {"interval": 1}

    def init(self, x0: Array, comm: Comm, buffers: Array | None = None) -> ClippingState:
        """State from x0, broadcast from rank 0; ``buffers`` follow ``buffer_policy`` every step
        (as PyTorch's DDP broadcasts buffers every step; they are small)."""
        return self.new_state(x0, comm, buffers, ClippingState)

    def step(self, state: ClippingState, oracle: Oracle, comm: Comm) -> Any:
        """Gradient, its average over ranks, one clipped step; returns this rank's loss."""
        loss = oracle(state.x, state.grad)
        comm.average_(state.grad, label=AVERAGE_LABEL)
        self.clipped_step(state, comm.backend.xp.linalg.norm(state.grad))
        state.step += 1
        if state.buffers is not None:
            sync_buffers(state.buffers, self.buffer_policy, comm)
        state.rounds += 1
        return loss

    def describe(self) -> str:
        return f"gamma={self.gamma:g}{self.describe_inner()}"
