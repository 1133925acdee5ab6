"""FedAdam and FedYogi: Adam and Yogi as the outer optimizer, on the round's pseudo-gradient.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021 (Algorithm 2). With Delta = x_0 - xbar (the anchor minus the ranks'
mean, the pseudo-gradient of ``hpcopt.algorithms.outer``), at every round::

    m <- b1 m + (1 - b1) Delta
    v <- b2 v + (1 - b2) Delta^2                          (fedadam)
    v <- v - (1 - b2) Delta^2 sign(v - Delta^2)           (fedyogi)
    x_0 <- x_0 - lr m / (sqrt(v) + tau)

elementwise, without bias correction, from m = 0 and v = tau^2 (the paper's v_{-1} >= tau^2).
The paper writes Delta the other way round (mean - x_0) and adds the step; the bits are the
same. b1 = ``outer_momentum`` (0: the paper's 0.9), b2 = ``outer_beta2`` (0.99), tau =
``outer_tau`` (1e-3), lr = ``outer_lr`` (left unset: 0.01, FedAdam's and FedYogi's own default
here, whatever another outer optimizer's is; the paper tunes it per task). m and v are
``shared()`` state (``/shared/outer_exp_avg``, ``/shared/outer_exp_avg_sq``): every rank
applies the same update to the same mean, so they add no communication, and ``resume
--ranks-changed`` carries them over as they are, as it does the anchor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..backend import array_module
from .pieces import Piece, PieceOptions, fraction, positive

Array = Any

#: The paper's b1, b2 and tau, and our lr where a run leaves ``outer_lr`` unset.
FEDOPT_BETA1, FEDOPT_BETA2, FEDOPT_TAU, FEDOPT_LR = 0.9, 0.99, 1e-3, 0.01


@dataclass(frozen=True)
class AdaptiveOuter:
    """FedAdam (``kind`` "fedadam") or FedYogi ("fedyogi"): module docstring."""

    kind: str
    lr: float = FEDOPT_LR
    beta1: float = FEDOPT_BETA1
    beta2: float = FEDOPT_BETA2
    tau: float = FEDOPT_TAU

    @property
    def fields(self) -> tuple[str, ...]:
        return ("anchor", "outer_exp_avg", "outer_exp_avg_sq")

    def new_state(self, x: Array) -> dict[str, Array | None]:
        """The anchor (a copy of the common x), m = 0 and v = tau^2."""
        xp = array_module(x)
        v = xp.empty_like(x)
        v[...] = self.tau * self.tau
        return {"anchor": x.copy(), "outer_exp_avg": xp.zeros_like(x), "outer_exp_avg_sq": v}

    def step(self, mean: Array, state: Mapping[str, Array | None], scratch: Array, eta: float) -> None:
        """The update above; ``mean`` (free once Delta is taken) and ``scratch`` as working
        memory, then ``mean`` <- the new anchor."""
        anchor, m, v = state["anchor"], state["outer_exp_avg"], state["outer_exp_avg_sq"]
        assert anchor is not None and m is not None and v is not None
        xp = array_module(mean)
        delta = xp.subtract(anchor, mean, out=scratch)
        m *= self.beta1
        m += xp.multiply(delta, 1 - self.beta1, out=mean)
        square = xp.multiply(delta, delta, out=mean)  # Delta is no longer needed: scratch is free
        if self.kind == "fedadam":
            v *= self.beta2
            square *= 1 - self.beta2
            v += square
        else:
            sign = xp.sign(xp.subtract(v, square, out=scratch), out=scratch)
            square *= 1 - self.beta2
            square *= sign
            v -= square
        step = xp.sqrt(v, out=scratch)
        step += self.tau
        xp.divide(m, step, out=step)
        step *= self.lr
        anchor -= step
        mean[...] = anchor

    def describe(self) -> str:
        return (f"outer {self.kind} (lr {self.lr:g}, betas {self.beta1:g}, {self.beta2:g}, "
                f"tau {self.tau:g})")


def _adaptive(kind: str, options: PieceOptions) -> AdaptiveOuter:
    """fedadam, fedyogi from their four options: lr and b1 their own defaults where unset."""
    positive("outer_lr", options["outer_lr"])
    fraction("outer_momentum", options["outer_momentum"])
    return AdaptiveOuter(kind, options.get("outer_lr", FEDOPT_LR),
                         options.get("outer_momentum", FEDOPT_BETA1),
                         fraction("outer_beta2", options["outer_beta2"]),
                         positive("outer_tau", options["outer_tau"]))


ADAPTIVE_OPTIONS = ("outer_lr", "outer_momentum", "outer_beta2", "outer_tau")
FEDADAM = Piece(partial(_adaptive, "fedadam"), ADAPTIVE_OPTIONS)
FEDYOGI = Piece(partial(_adaptive, "fedyogi"), ADAPTIVE_OPTIONS)
