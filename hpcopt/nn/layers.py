"""Elementary layers. Parameters and gradients are views into a model's flat buffers.

Contract: ``bind(params, grads)`` hands a layer its views (name -> array); ``forward(x)`` keeps
what backward needs; ``backward(dy)`` OVERWRITES the layer's gradient views (no accumulation)
and returns dL/dx (or None when ``need_input_grad`` is False, for the first layer). ``backward``
never writes into ``dy`` (a residual block hands the same ``dy`` to two branches).

Non-trained state (batch-norm running statistics) lives in a second flat buffer with the same
naming scheme: ``buffer_shapes``, ``init_buffers`` and ``bind_buffers(views)``. ``forward`` with
``train=True`` may update those views in place; with ``train=False`` it only reads them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module

Array = Any


class Layer:
    """A layer without parameters unless it overrides ``param_shapes``.

    ``constants`` names attributes holding fixed data (never written by forward or backward,
    e.g. a problem's matrix): a pipeline's per-sample copies of the layer share them instead of
    copying them (``hpcopt.pipeline.executor``).
    """

    name: str = "layer"
    constants: tuple[str, ...] = ()

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return []

    def init_params(self, params: dict[str, Array], rng: np.random.Generator) -> None:
        """Fill freshly allocated parameter views in place."""

    def bind(self, params: dict[str, Array], grads: dict[str, Array]) -> None:
        self.params, self.grads = params, grads

    def buffer_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Non-trained state (kept out of the parameter buffer); none unless overridden."""
        return []

    def init_buffers(self, buffers: dict[str, Array]) -> None:
        """Fill freshly allocated buffer views in place."""

    def bind_buffers(self, buffers: dict[str, Array]) -> None:
        self.buffers = buffers

    def forward(self, x: Array, train: bool = True) -> Array:
        raise NotImplementedError

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        raise NotImplementedError


class Linear(Layer):
    """y = x W + b with W of shape (fan_in, fan_out); He-uniform initialization."""

    def __init__(self, fan_in: int, fan_out: int, name: str = "linear") -> None:
        if fan_in < 1 or fan_out < 1:
            raise ValueError(f"Linear needs positive sizes, got {fan_in} -> {fan_out}")
        self.fan_in, self.fan_out, self.name = fan_in, fan_out, name

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [("weight", (self.fan_in, self.fan_out)), ("bias", (self.fan_out,))]

    def init_params(self, params: dict[str, Array], rng: np.random.Generator) -> None:
        bound = np.sqrt(6.0 / self.fan_in)
        w = rng.uniform(-bound, bound, size=(self.fan_in, self.fan_out))
        params["weight"][...] = array_module(params["weight"]).asarray(w)
        params["bias"][...] = 0

    def forward(self, x: Array, train: bool = True) -> Array:
        self._x = x
        return x @ self.params["weight"] + self.params["bias"]

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        xp = array_module(dy)
        xp.matmul(self._x.T, dy, out=self.grads["weight"])
        dy.sum(axis=0, out=self.grads["bias"])
        return dy @ self.params["weight"].T if need_input_grad else None


class ReLU(Layer):
    """y = max(x, 0)."""

    name = "relu"

    def forward(self, x: Array, train: bool = True) -> Array:
        self._mask = x > 0
        return x * self._mask

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        return dy * self._mask if need_input_grad else None


class Tanh(Layer):
    """y = tanh(x); dy/dx = 1 - y^2."""

    name = "tanh"

    def forward(self, x: Array, train: bool = True) -> Array:
        self._y = array_module(x).tanh(x)
        return self._y

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        return dy * (1 - self._y * self._y) if need_input_grad else None

