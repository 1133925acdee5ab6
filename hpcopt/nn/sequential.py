"""A chain of layers over one flat parameter buffer and one flat gradient buffer."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..flat import ParamLayout
from .layers import Layer

Array = Any


class Sequential:
    """Layers applied in order; parameter ``p`` of layer ``name`` is the flat view ``name.p``."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        names = [layer.name for layer in layers if layer.param_shapes()]
        if len(set(names)) != len(names):
            raise ValueError(f"layers with parameters need unique names, got {names}")
        self.layers = list(layers)
        self.layout = ParamLayout.from_items(
            (f"{layer.name}.{p}", shape) for layer in layers for p, shape in layer.param_shapes()
        )
        self._bound: tuple[int, int] | None = None

    def _split(self, views: dict[str, Array], layer: Layer) -> dict[str, Array]:
        return {p: views[f"{layer.name}.{p}"] for p, _ in layer.param_shapes()}

    def init(self, params: Array, rng: np.random.Generator) -> None:
        """Initialize the flat parameter vector in place, layer by layer."""
        views = self.layout.views(params)
        for layer in self.layers:
            layer.init_params(self._split(views, layer), rng)

    def bind(self, params: Array, grads: Array) -> None:
        """Point every layer at views of ``params`` and ``grads`` (cheap when already bound)."""
        key = (id(params), id(grads))
        if self._bound == key:
            return
        pviews, gviews = self.layout.views(params), self.layout.views(grads)
        for layer in self.layers:
            layer.bind(self._split(pviews, layer), self._split(gviews, layer))
        self._bound = key

    def forward(self, x: Array, train: bool = True) -> Array:
        for layer in self.layers:
            x = layer.forward(x, train)
        return x

    def backward(self, dy: Array, need_input_grad: bool = False) -> Array | None:
        """Back-propagate ``dy``; writes every parameter gradient; dL/dx if asked for."""
        last = len(self.layers) - 1
        for i in range(last, -1, -1):
            dy = self.layers[i].backward(dy, need_input_grad=need_input_grad or i > 0)
        return dy
