"""Muon as the inner optimizer: momentum, then the update of each weight matrix orthogonalised.

Jordan, Jin, Boza, You, Cesista, Newhouse, Bernstein, "Muon: An optimizer for hidden layers in
neural networks", 2024 (kellerjordan.github.io/posts/muon); as the inner optimizer of DiLoCo it
is MuLoCo (Thérien et al., "MuLoCo: Muon is a practical inner optimizer for DiLoCo", 2025). On
every rank, from the gradient g of the flat vector::

    x <- (1 - lr wd) x                                  (decoupled weight decay; wd = 0: none)
    b <- mu b + g;  d = b | g + mu b (nesterov) | g     (sgd's momentum, its buffer and policy)
    each 2-D parameter W (shape r x c):  D_W <- NS5(D_W) sqrt(max(1, r / c))
    x <- x - lr d

NS5 is the quintic Newton-Schulz iteration that takes a matrix to about U V^T (its singular
values into about [0.7, 1.2]): X = D / (||D||_F + 1e-7), transposed to be wide, then five times
A = X X^T, X <- a X + (b A + c A A) X with (a, b, c) = (3.4445, -4.7750, 2.0315), in x's dtype
(the paper runs it in bfloat16). The shape is the parameter's as the model stores it (hpcopt's
dense layers: inputs x outputs; a torch module's: outputs x inputs). Every other parameter
(biases, convolution kernels, batch-norm scales) takes the plain momentum-SGD step d: the same
buffer, no orthogonalisation (the paper gives those to AdamW; here they stay with SGD, so Muon
keeps no state besides sgd's buffer). Options: ``momentum``, ``nesterov`` (Muon's own default
is 0.95 with Nesterov), ``weight_decay``, ``lr``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..backend import array_module
from ..errors import HpcoptError
from .inner import SGD, Sgd, weight_decay
from .momentum import momentum_direction
from .pieces import Piece

Array = Any

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def newton_schulz5(direction: Array) -> Array:
    """About U V^T of ``direction`` (r x c, U S V^T its SVD): module docstring."""
    xp = array_module(direction)
    a, b, c = NS_COEFFICIENTS
    tall = direction.shape[0] > direction.shape[1]
    X = direction.T if tall else direction
    X = X / (xp.linalg.norm(X) + 1e-7)
    for _ in range(NS_STEPS):
        A = X @ X.T
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.T if tall else X


def muon_step(x: Array, grad: Array, buffer: Array | None, lr: Any, *,
              shapes: tuple[tuple[int, ...], ...], momentum: float, nesterov: bool,
              weight_decay: float) -> None:
    """One Muon step on x in place (module docstring); ``grad`` is overwritten, ``buffer`` (b;
    None without momentum) updated; ``shapes``: the parameters' in the flat vector, in order."""
    xp = array_module(x)
    if weight_decay:
        x *= 1 - lr * weight_decay
    direction = momentum_direction(grad, buffer, momentum, nesterov)
    if direction is not grad:  # heavy ball's direction is the buffer itself: keep it
        grad[...] = direction
    start = 0
    for shape in shapes:
        stop = start + math.prod(shape)
        if len(shape) == 2:
            matrix = grad[start:stop].reshape(shape)
            matrix[...] = newton_schulz5(matrix) * math.sqrt(max(1.0, shape[0] / shape[1]))
        start = stop
    x -= xp.multiply(grad, lr, out=grad)


@dataclass(frozen=True)
class Muon(Sgd):
    """The inner optimizer Muon: sgd's options and momentum buffer, the step of each weight
    matrix orthogonalised; ``shapes``: the model's parameters in the flat vector."""

    shapes: tuple[tuple[int, ...], ...] = ()

    def new_state(self, x0: Array) -> dict[str, Array | None]:
        if sum(map(math.prod, self.shapes)) != x0.size:
            raise HpcoptError("inner_optimizer muon needs the shapes of the model's parameters "
                              "(a workload with a parameter layout)")
        return super().new_state(x0)

    def step(self, state: Any, lr: Any, k: tuple[int, int]) -> None:
        muon_step(state.x, state.grad, state.momentum, lr, shapes=self.shapes,
                  momentum=self.momentum, nesterov=self.nesterov, weight_decay=self.weight_decay)

    def describe(self) -> str:
        nesterov = ", nesterov" if self.nesterov else ""
        return f"muon (mu {self.momentum:g}{nesterov}, wd {self.weight_decay:g})"


#: The registered inner optimizer ``muon``: sgd's options; the parameters' shapes from the run.
MUON = Piece(lambda o: Muon(o["momentum"], o["nesterov"], weight_decay(o),
                            shapes=o.context.get("parameter_shapes", ())), SGD.options)
