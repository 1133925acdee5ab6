"""Inner optimizers: the local step every data-parallel rank takes on its own model.

With step size s_t (lr_t, or CELGC's clipped min(lr_t, gamma_t / ||g||)) and weight decay wd::

    sgd    d = g + wd x;  b <- mu b + d;  d = b | d + mu b | d;  x <- x - s_t d
           (heavy ball | nesterov | mu = 0: hpcopt.algorithms.momentum)
    adamw  x <- x (1 - s_t wd)
           m <- beta1 m + (1 - beta1) g
           v <- beta2 v + (1 - beta2) g^2
           x <- x - s_t (m / (1 - beta1^k1)) / (sqrt(v / (1 - beta2^k2)) + eps)

AdamW: Loshchilov, Hutter, "Decoupled Weight Decay Regularization", ICLR 2019, in PyTorch's
form (``torch.optim.AdamW``: decay first, eps added after the bias correction of v). DiLoCo's
inner optimizer (Douillard et al., arXiv 2311.08105). m and v are per rank; k1 and k2 count
the steps since each was last zeroed (at the start, and at each round when its policy is
``reset``), this one included, so the bias correction is that of a fresh AdamW after a reset.

Each inner optimizer is a piece (``Inner``): its options, the per-rank moments it keeps
(declared state, rescaled by their average) and its step. The registry
``hpcopt.algorithms.kinds.inner_optimizers`` holds them by name (``SGD``, ``ADAMW`` here,
``hpcopt.algorithms.muon.MUON``), each made from the options it reads (``INNER_OPTIONS``);
``ScheduledSGD.inner`` makes the one ``inner_optimizer`` names.

Both steps are elementwise, so ``blockwise`` runs them on NumPy vectors block by block: each
block's slices stay in cache from one operation to the next, and every vector is read from
memory once and written once per step, with the bits of the whole-vector operations
(docs/design.md, "Passes over the parameters").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np

from ..backend import array_module
from ..errors import HpcoptError
from .momentum import momentum_direction
from .pieces import Piece, PieceOptions
from .state import AVERAGE, VECTOR, Declared

Array = Any

#: AdamW's options and their defaults (PyTorch's): refused with sgd unless left at these.
ADAMW_DEFAULTS = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8}
#: The inner optimizers' options, each at its unset value (the flag's default): an inner
#: optimizer reads its own (``Piece.options``); another one set is refused.
INNER_OPTIONS = {"momentum": 0.0, "nesterov": False, **ADAMW_DEFAULTS, "weight_decay": 0.0}
#: Elements per block of a NumPy step: a block of each vector (256 KB in float32) stays in the
#: core's cache between the step's operations.
BLOCK = 1 << 16


class Inner(Protocol):
    """An inner optimizer: the local step and the per-rank moments it keeps.

    ``fields`` names its moments, the first moment first (a round applies ``momentum_policy``
    to it and ``second_moment_policy`` to a second); ``new_state`` makes them (None: this run
    keeps none); ``step`` takes one step on ``state.x`` from ``state.grad`` (overwritten) with
    step size ``lr`` (a float, or a 0-d device array in x's dtype); ``k`` is the steps each
    moment has accumulated, this one included (AdamW's bias correction)."""

    @property
    def fields(self) -> tuple[str, ...]: ...

    @property
    def vectors(self) -> int:
        """How many of ``fields`` this run keeps (vectors like x)."""
        ...

    def new_state(self, x0: Array) -> dict[str, Array | None]: ...

    def step(self, state: Any, lr: Any, k: tuple[int, int]) -> None: ...

    def describe(self) -> str: ...


def declared(inner: Inner) -> tuple[Declared, ...]:
    """The state fields ``inner`` keeps: per-rank vectors, averaged on another number of ranks."""
    return tuple((name, VECTOR, AVERAGE) for name in inner.fields)


@dataclass(frozen=True)
class Sgd:
    """sgd: heavy-ball or Nesterov momentum mu (its buffer b: ``momentum``; none at mu = 0)
    and L2 weight decay wd (module docstring)."""

    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    fields: tuple[str, ...] = ("momentum",)

    def new_state(self, x0: Array) -> dict[str, Array | None]:
        return {"momentum": array_module(x0).zeros_like(x0) if self.vectors else None}

    @property
    def vectors(self) -> int:
        return int(self.momentum > 0)

    def step(self, state: Any, lr: Any, k: tuple[int, int]) -> None:
        """Block by block (``blockwise``): one read and one write of each vector."""
        blockwise(partial(sgd_step, lr=lr, momentum=self.momentum, nesterov=self.nesterov,
                          weight_decay=self.weight_decay), state.x, state.grad, state.momentum)

    def describe(self) -> str:
        return ""


@dataclass(frozen=True)
class AdamW:
    """adamw: moments m (``exp_avg``) and v (``exp_avg_sq``), decoupled weight decay wd
    (module docstring)."""

    beta1: float = ADAMW_DEFAULTS["adam_beta1"]
    beta2: float = ADAMW_DEFAULTS["adam_beta2"]
    eps: float = ADAMW_DEFAULTS["adam_eps"]
    weight_decay: float = 0.0
    fields: tuple[str, ...] = ("exp_avg", "exp_avg_sq")

    def __post_init__(self) -> None:
        check_adamw(self.beta1, self.beta2, self.eps)

    def new_state(self, x0: Array) -> dict[str, Array | None]:
        xp = array_module(x0)
        return {"exp_avg": xp.zeros_like(x0), "exp_avg_sq": xp.zeros_like(x0)}

    @property
    def vectors(self) -> int:
        return 2

    def step(self, state: Any, lr: Any, k: tuple[int, int]) -> None:
        """Block by block (``blockwise``): one read and one write of each vector."""
        k1, k2 = k
        blockwise(partial(adamw_step, lr=lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps,
                          weight_decay=self.weight_decay, k1=k1, k2=k2),
                  state.x, state.grad, state.exp_avg, state.exp_avg_sq)

    def describe(self) -> str:
        return f"adamw (betas {self.beta1:g}, {self.beta2:g}, wd {self.weight_decay:g})"


def weight_decay(options: PieceOptions) -> float:
    """The option ``weight_decay`` (wd >= 0), which every built-in inner optimizer reads."""
    value = options["weight_decay"]
    if not (value >= 0 and math.isfinite(value)):
        raise HpcoptError(f"weight_decay must be >= 0, got {value}")
    return float(value)


SGD = Piece(lambda o: Sgd(o["momentum"], o["nesterov"], weight_decay(o)),
            ("momentum", "nesterov", "weight_decay"))
ADAMW = Piece(lambda o: AdamW(o["adam_beta1"], o["adam_beta2"], o["adam_eps"], weight_decay(o)),
              (*ADAMW_DEFAULTS, "weight_decay"))



def check_adamw(beta1: float, beta2: float, eps: float) -> None:
    for name, beta in (("adam_beta1", beta1), ("adam_beta2", beta2)):
        if not 0 <= beta < 1:
            raise HpcoptError(f"{name} must be in [0, 1), got {beta}")
    if not (eps > 0 and math.isfinite(eps)):
        raise HpcoptError(f"adam_eps must be > 0, got {eps}")


def blockwise(step: Callable[..., None], first: Array, *rest: Array | None) -> None:
    """``step(*blocks)`` on consecutive blocks of BLOCK elements of the flat NumPy vectors
    ``first, *rest`` (None passed as None); other arrays (CuPy: one kernel per operation
    anyway) whole. For an elementwise ``step`` the result is bit for bit that of
    ``step(first, *rest)``."""
    if array_module(first) is not np:
        step(first, *rest)
        return
    for start in range(0, max(first.size, 1), BLOCK):
        block = slice(start, start + BLOCK)
        step(first[block], *(None if v is None else v[block] for v in rest))


def sgd_step(x: Array, grad: Array, buffer: Array | None, lr: Any, *, momentum: float,
             nesterov: bool, weight_decay: float) -> None:
    """One sgd step on x in place (module docstring); ``grad`` is overwritten, ``buffer`` (b;
    None without momentum) updated. ``lr`` is a float or a 0-d device array in x's dtype."""
    xp = array_module(x)
    if weight_decay:
        grad += weight_decay * x
    direction = momentum_direction(grad, buffer, momentum, nesterov)
    x -= xp.multiply(direction, lr, out=grad)


def adamw_step(x: Array, grad: Array, m: Array, v: Array, lr: Any, *, beta1: float,
               beta2: float, eps: float, weight_decay: float, k1: int, k2: int) -> None:
    """One AdamW step on x in place (module docstring); ``grad`` is overwritten. ``lr`` is a
    float or a 0-d device array in x's dtype. No new array of size d is kept."""
    xp = array_module(x)
    if weight_decay:
        x *= 1 - lr * weight_decay
    m *= beta1
    m += (1 - beta1) * grad
    grad *= grad
    grad *= 1 - beta2
    v *= beta2
    v += grad
    denominator = xp.sqrt(v, out=grad)
    denominator /= math.sqrt(1 - beta2 ** k2)
    denominator += eps
    step = xp.divide(m, denominator, out=grad)
    step *= lr / (1 - beta1 ** k1)
    x -= step
