"""Outer optimizers: what a data-parallel round does with the ranks' average.

A round ends with the mean of the ranks' models, xbar = (1/N) sum_i x_i (the round's one
allreduce). The outer optimizer treats the round's starting point x_0 (the anchor) as its
parameters and the pseudo-gradient Delta = x_0 - xbar as their gradient; every rank continues
from the new anchor::

    average   x_0 <- xbar                                        (PR-SGD, CELGC; no state)
    sgd       b <- mu b + Delta (mu > 0);  x_0 <- x_0 - lr (Delta | b)
    nesterov  b <- mu b + Delta;           x_0 <- x_0 - lr (Delta + mu b)
    slowmo    u <- mu u + Delta / eta;     x_0 <- x_0 - lr eta u

lr = ``outer_lr``, mu = ``outer_momentum``: the options each outer optimizer reads, with its
own default where a run leaves one at the flag's (``OUTER_OPTIONS``: lr 1, mu 0; registered in
``hpcopt.algorithms.kinds.outer_optimizers``: ``AVERAGE``, ``SGD``, ``NESTEROV``, ``SLOWMO``
here, ``FEDADAM`` and ``FEDYOGI`` in ``hpcopt.algorithms.fedopt``). ``nesterov`` with mu left
unset takes DiLoCo's mu 0.9, and its lr 0.7 where lr is left unset too (``DILOCO_MOMENTUM``,
``DILOCO_LR``). ``sgd`` with mu
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

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from ..backend import array_module
from .fedopt import FEDOPT_BETA2, FEDOPT_TAU
from .pieces import Piece, PieceOptions, fraction, positive

Array = Any

#: The outer optimizers' options, each at its unset value (the flag's default): an outer
#: optimizer reads its own (``Piece.options``), with its own default where one is unset;
#: another one set is refused.
OUTER_OPTIONS = {"outer_lr": 1.0, "outer_momentum": 0.0, "outer_beta2": FEDOPT_BETA2,
                 "outer_tau": FEDOPT_TAU}
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
    """One outer optimizer (``kind``: average, sgd, nesterov or slowmo), its lr and momentum
    mu; its buffer is the state field ``buffer_field``."""

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


def _momentum_outer(kind: str, options: PieceOptions) -> OuterOptimizer:
    """sgd, slowmo: lr and mu as set (their own defaults are the options' 1 and 0)."""
    return OuterOptimizer(kind, positive("outer_lr", options["outer_lr"]),
                          fraction("outer_momentum", options["outer_momentum"]))


def _nesterov(options: PieceOptions) -> OuterOptimizer:
    """DiLoCo's mu 0.9 where ``outer_momentum`` is unset, then also its lr 0.7 where
    ``outer_lr`` is (a set momentum keeps lr as set, 1 included)."""
    lr = positive("outer_lr", options["outer_lr"])
    momentum = fraction("outer_momentum", options["outer_momentum"])
    if options.is_unset("outer_momentum"):
        momentum, lr = DILOCO_MOMENTUM, options.get("outer_lr", DILOCO_LR)
    return OuterOptimizer("nesterov", lr, momentum)


MOMENTUM_OPTIONS = ("outer_lr", "outer_momentum")
AVERAGE = Piece(lambda options: OuterOptimizer("average"))
SGD = Piece(partial(_momentum_outer, "sgd"), MOMENTUM_OPTIONS)
NESTEROV = Piece(_nesterov, MOMENTUM_OPTIONS)
SLOWMO = Piece(partial(_momentum_outer, "slowmo"), MOMENTUM_OPTIONS)
