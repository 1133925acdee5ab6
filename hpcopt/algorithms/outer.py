"""Outer optimizers: what a data-parallel round does with the ranks' average.

A round ends with the mean of the ranks' models, xbar = (1/N) sum_i x_i (the round's one
allreduce). The outer optimizer treats the round's starting point x_0 (the anchor) as its
parameters and the pseudo-gradient Delta = x_0 - xbar as their gradient; every rank continues
from the new anchor::

    average   x_0 <- xbar                                        (PR-SGD, CELGC; no state)
    sgd       b <- mu b + Delta (mu > 0);  x_0 <- x_0 - lr (Delta | b)
    nesterov  b <- mu b + Delta;           x_0 <- x_0 - lr (Delta + mu b)
    slowmo    u <- mu u + Delta / eta;     x_0 <- x_0 - lr eta u

lr = ``outer_lr``, mu = ``outer_momentum``. ``nesterov`` with mu left at 0 takes DiLoCo's mu
0.9, and its lr 0.7 where lr is left at 1 (``DILOCO_MOMENTUM``, ``DILOCO_LR``). ``sgd`` with mu
= 0 and lr = 1 is ``average`` up to rounding; with mu > 0 it is heavy-ball momentum on the
pseudo-gradient (FedAvgM: Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification", 2019). ``nesterov`` is DiLoCo's outer step
(Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models", arXiv
2311.08105, 2023: lr 0.7, mu 0.9), PyTorch's ``SGD(nesterov=True)`` on Delta. ``slowmo`` is
SlowMo's slow momentum (Wang, Tantia, Ballas, Rabbat, ICLR 2020, Algorithm 1: beta = mu, alpha =
lr) with eta the base step size at the round's last nominal step; ``--algorithm slowmo`` is this
step. ``fedadam`` and ``fedyogi`` (Reddi et al., ICLR 2021) are Adam and Yogi on Delta, with two
moments (``hpcopt.algorithms.fedopt``).

The anchor and the buffer b (u) are the same on every rank (every rank applies the same
update to the same average), so the outer step adds no communication; they are ``shared``
state fields, saved once per checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..backend import array_module
from ..errors import HpcoptError
from .fedopt import ADAPTIVE, FEDOPT_BETA1, FEDOPT_BETA2, FEDOPT_LR, FEDOPT_TAU, AdaptiveOuter

Array = Any

OUTER_OPTIMIZERS = ("average", "sgd", "nesterov", "slowmo", *ADAPTIVE)
#: DiLoCo's outer step (Douillard et al., 2023): ``nesterov``'s lr and mu where a run leaves them
DILOCO_LR, DILOCO_MOMENTUM = 0.7, 0.9


class Outer(Protocol):
    """An outer optimizer: what a round does with the ranks' mean, and the state it keeps.

    ``fields`` names the state fields it keeps between rounds, every one a ``shared()`` array
    like x (the same on every rank): ``Rounds.new_state`` adds those the algorithm's state
    class lacks, so a checkpoint holds them by declaration. ``"anchor"`` (the round's start
    x_0) is the one name with a meaning outside it: a round starts there (CELGC's first round,
    the wire's pseudo-gradient). ``step`` is called from one place (``Rounds.outer_step``), on
    the whole model or on a fragment's slices of the mean and of every field."""

    @property
    def fields(self) -> tuple[str, ...]: ...

    def new_state(self, x: Array) -> dict[str, Array | None]:
        """Each of ``fields`` at the start (None: this run keeps none)."""
        ...

    def step(self, mean: Array, state: Mapping[str, Array | None], scratch: Array, eta: float) -> None:
        """``mean`` holds the round's mean: update ``state`` from it and set ``mean`` to the
        model every rank continues from; ``scratch`` (like mean) may be overwritten; ``eta``
        is the base lr at the round's last step."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class OuterOptimizer:
    """One outer optimizer (``kind`` of ``OUTER_OPTIMIZERS``), its lr and momentum mu; its
    buffer is the state field ``buffer_field``."""

    kind: str = "average"
    lr: float = 1.0
    momentum: float = 0.0
    buffer_field: str = "outer_buffer"

    @property
    def fields(self) -> tuple[str, ...]:
        return ("anchor", self.buffer_field)

    @property
    def has_anchor(self) -> bool:
        """Whether it keeps the round's starting point (every kind but ``average``)."""
        return self.kind != "average"

    @property
    def has_buffer(self) -> bool:
        """Whether it keeps a momentum buffer (``slowmo`` always, as SlowMo's state has)."""
        return self.kind in ("nesterov", "slowmo") or (self.kind == "sgd" and self.momentum > 0)

    def new_state(self, x: Array) -> dict[str, Array | None]:
        """The anchor (a copy of the common x) and the zero buffer, None where it has none."""
        anchor = x.copy() if self.has_anchor else None
        buffer = array_module(x).zeros_like(x) if self.has_buffer else None
        return {"anchor": anchor, self.buffer_field: buffer}

    def step(self, mean: Array, state: Mapping[str, Array | None], scratch: Array, eta: float) -> None:
        """Move the anchor from the mean (module docstring) and set ``mean`` to the new anchor;
        ``eta`` is used by slowmo."""
        anchor, buffer = state["anchor"], state[self.buffer_field]
        if anchor is None:
            return
        delta = scratch
        delta[...] = anchor
        delta -= mean
        if self.kind == "slowmo":
            assert buffer is not None
            delta /= eta
            buffer *= self.momentum
            buffer += delta
            delta[...] = buffer
            delta *= self.lr * eta
        else:
            if buffer is not None:
                buffer *= self.momentum
                buffer += delta
                if self.kind == "nesterov":
                    delta += self.momentum * buffer
                else:
                    delta[...] = buffer
            delta *= self.lr
        anchor -= delta
        mean[...] = anchor

    def describe(self) -> str:
        if self.kind == "average":
            return ""
        momentum = f", mu {self.momentum:g}" if self.has_buffer else ""
        return f"outer {self.kind} (lr {self.lr:g}{momentum})"


def check_outer(kind: str, lr: float, momentum: float, names: tuple[str, str, str],
                buffer_field: str = "outer_buffer", beta2: float = FEDOPT_BETA2,
                tau: float = FEDOPT_TAU) -> Outer:
    """The outer optimizer of these option values (``nesterov`` with momentum 0: DiLoCo's, module
    docstring; ``fedadam``, ``fedyogi``: ``hpcopt.algorithms.fedopt``), or a HpcoptError
    naming the options (``names``: those of kind, lr and momentum; ``outer_beta2`` and
    ``outer_tau``: fedadam's and fedyogi's own)."""
    kind_name, lr_name, momentum_name = names
    if kind not in OUTER_OPTIMIZERS:
        raise HpcoptError(f"unknown {kind_name} {kind!r} (choose from {', '.join(OUTER_OPTIMIZERS)})")
    if not (lr > 0 and math.isfinite(lr)):
        raise HpcoptError(f"{lr_name} must be > 0, got {lr}")
    if not 0 <= momentum < 1:
        raise HpcoptError(f"{momentum_name} must be in [0, 1), got {momentum}")
    if kind == "average" and (lr != 1 or momentum != 0):
        changed = lr_name if lr != 1 else momentum_name
        raise HpcoptError(f"{changed} applies only to {kind_name} "
                          f"{', '.join(OUTER_OPTIMIZERS[1:])}, not average")
    if kind not in ADAPTIVE:
        for name, value, default in (("outer_beta2", beta2, FEDOPT_BETA2), ("outer_tau", tau, FEDOPT_TAU)):
            if value != default:
                raise HpcoptError(f"{name} applies only to {kind_name} {', '.join(ADAPTIVE)}, not {kind}")
    if kind == "nesterov" and momentum == 0:
        momentum, lr = DILOCO_MOMENTUM, DILOCO_LR if lr == 1 else lr
    if kind in ADAPTIVE:
        if not 0 <= beta2 < 1:
            raise HpcoptError(f"outer_beta2 must be in [0, 1), got {beta2}")
        if not (tau > 0 and math.isfinite(tau)):
            raise HpcoptError(f"outer_tau must be > 0, got {tau}")
        return AdaptiveOuter(kind, FEDOPT_LR if lr == 1 else lr, momentum or FEDOPT_BETA1, beta2, tau)
    return OuterOptimizer(kind, lr, momentum, buffer_field)
