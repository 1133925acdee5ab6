"""An additive perturbation of the input: the trainable parameter of an adversarial attack."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .layers import Layer

Array = Any


class AdditivePerturbation(Layer):
    """y = x + delta, with ``delta`` broadcast over the leading axes of x; initialized to 0.

    delta has the shape of one input (one delta shared by the batch) or of the whole batch (one
    delta per sample); d loss/d delta sums dy over the broadcast axes.
    """

    def __init__(self, shape: Sequence[int], name: str = "perturbation") -> None:
        if not shape or any(n < 1 for n in shape):
            raise ValueError(f"AdditivePerturbation needs a positive shape, got {tuple(shape)}")
        self.shape, self.name = tuple(int(n) for n in shape), name

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [("delta", self.shape)]

    def init_params(self, params: dict[str, Array], rng: np.random.Generator) -> None:
        params["delta"][...] = 0

    def forward(self, x: Array, train: bool = True) -> Array:
        return x + self.params["delta"]

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        extra = dy.ndim - len(self.shape)
        if extra:
            dy.sum(axis=tuple(range(extra)), out=self.grads["delta"])
        else:
            self.grads["delta"][...] = dy
        return dy if need_input_grad else None
