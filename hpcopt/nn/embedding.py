"""Token embedding: a lookup table on a view of the flat parameter buffer."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module
from .layers import Layer

Array = Any


class Embedding(Layer):
    """y[..., :] = W[ids[...], :] with W of shape (vocab, dim); uniform(-0.1, 0.1) initialization.

    dL/dW[v] = sum of dy over the positions holding token v (a scatter-add).
    """

    def __init__(self, vocab: int, dim: int, name: str = "embedding") -> None:
        if vocab < 1 or dim < 1:
            raise ValueError(f"Embedding needs positive sizes, got vocab {vocab}, dim {dim}")
        self.vocab, self.dim, self.name = vocab, dim, name

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [("weight", (self.vocab, self.dim))]

    def init_params(self, params: dict[str, Array], rng: np.random.Generator) -> None:
        w = rng.uniform(-0.1, 0.1, size=(self.vocab, self.dim))
        params["weight"][...] = array_module(params["weight"]).asarray(w)

    def forward(self, x: Array, train: bool = True) -> Array:
        """``x``: integer token ids of any shape; returns shape ``x.shape + (dim,)``."""
        self._ids = x
        return self.params["weight"][x]

    def backward(self, dy: Array, need_input_grad: bool = False,
                 accumulate: bool = False) -> None:
        """Write dL/dW (token ids have no gradient). ``accumulate=True`` adds to the gradient
        view instead of overwriting it: the second use of a tied weight."""
        xp = array_module(dy)
        grad = self.grads["weight"]
        if not accumulate:
            grad[...] = 0
        xp.add.at(grad, self._ids.reshape(-1), dy.reshape(-1, self.dim))
        return None
