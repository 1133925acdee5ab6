"""Gradient clipping as a rule of the inner step: the step size it takes, and its own state.

Liu, Zhuang, Lei, Liao, "A Communication-Efficient Distributed Gradient Clipping Algorithm for
Training Deep Neural Networks", NeurIPS 2022. From the gradient g_i in ``state.grad``, before
the inner optimizer's step (``hpcopt.algorithms.inner``) takes it::

    n_i = ||g_i||   (local: l2 over all parameters; global: sqrt(mean_j ||g_j||^2), one scalar
                     allreduce a step, label "clip_norm")
    s_t = min(eta_t, gamma_t / (n_i + 1e-10)),   gamma_t = gamma * eta_t / eta_0

and the inner step runs with step size s_t instead of eta_t (weight decay and momentum shape only
the direction: the norm is the raw gradient's). Like optax's ``clip_by_global_norm``, a
transformation of the step any inner optimizer takes, composed with any round. Its state, per
rank (``ClippingState``): whether the last step was clipped (``clipped``), the steps clipped so
far (``clip_count``) and the norm the last step used (``grad_norm``); on the GPU 0-d device
arrays, read only when a trace row, checkpoint or summary needs them (no transfer a step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..backend import array_module
from ..errors import HpcoptError
from .base import option
from .data_parallel import DataParallelState, ScheduledSGD
from .state import AVERAGE, RESET, counter, flag, scalar

if TYPE_CHECKING:
    from ..comm import Comm

CLIP_NORMS = ("local", "global")
CLIP_NORM_LABEL = "clip_norm"
NORM_EPSILON = 1e-10  # added to ||g|| as in the authors' code


@dataclass
class ClippingState(DataParallelState):
    """A clipping rank's state: the data-parallel one and the clipping rule's fields."""

    clipped: Any = flag(RESET)             # whether the last step was clipped on this rank
    clip_count: Any = counter(AVERAGE)       # steps clipped on this rank so far
    grad_norm: Any = scalar(RESET, math.nan)  # the norm the last step's rule used


@dataclass(frozen=True, kw_only=True)
class Clipped(ScheduledSGD):
    """The clipping rule's option gamma, the step size it gives, and what it reports (the
    trace's ``clip_fraction``, the summary's clipped share)."""

    clips: ClassVar[bool] = True

    gamma: float = option(math.inf, "step-length bound: the step is "
                          "min(lr, gamma / ||g||) g, so a gradient is clipped when ||g|| > gamma / lr; "
                          "inf = no clipping")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.gamma > 0:  # inf is allowed (no clipping), nan is not
            raise HpcoptError(f"clipping gamma must be > 0 (inf disables clipping), got {self.gamma}")

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

    def clipped_step(self, state: ClippingState, norm: Any) -> None:
        """The inner step with step size min(eta_t, gamma_t / (norm + eps)), from state.grad
        (overwritten); the rule's state records it."""
        lr = self.lr_at(state.step)
        step_size = self.step_size(state.step, norm)
        on_host = isinstance(step_size, float)
        # a device step size enters in x's dtype, as a float does (NumPy's weak scalars)
        self.inner_step(state, step_size if on_host else step_size.astype(state.x.dtype))
        state.clipped = step_size < lr
        state.clip_count += state.clipped
        state.grad_norm = float(norm) if on_host else norm

    def trace_columns(self) -> tuple[str, ...]:
        """clip_fraction: the window's clipped steps / steps over all ranks."""
        return ("clip_fraction",)

    def step_clipped(self, state: ClippingState) -> Any:
        return state.clipped

    def summary_tallies(self, state: ClippingState) -> tuple[float, ...]:
        """The steps this rank clipped, and the steps it took."""
        return int(state.clip_count), state.step

    def summary_report(self, sums: Sequence[float]) -> tuple[dict[str, Any], list[str]]:
        """``clip_fraction``: clipped steps / steps over all ranks, and its line."""
        clipped, steps = sums
        fraction = float(clipped / steps) if steps else 0.0
        return ({"clip_fraction": fraction},
                [f"clipped           {100 * fraction:.1f}% of the steps (all ranks)"])


def gradient_norm(state: ClippingState, clip_norm: str, comm: Comm) -> Any:
    """n_i of ``state.grad`` (module docstring): local (on the GPU it stays there) or global."""
    norm = comm.backend.xp.linalg.norm(state.grad)
    if clip_norm == "global":
        local = float(norm)
        norm = math.sqrt(comm.allreduce_scalar(local * local, label=CLIP_NORM_LABEL) / comm.size)
    return norm


def check_clip_norm(clip_norm: str) -> None:
    if clip_norm not in CLIP_NORMS:
        raise HpcoptError(f"unknown clipping norm {clip_norm!r} (choose from {', '.join(CLIP_NORMS)})")
