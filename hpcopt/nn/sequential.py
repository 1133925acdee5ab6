"""A chain of layers over one flat parameter buffer, one flat gradient buffer and one flat buffer
of non-trained state (batch-norm running statistics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..flat import ParamLayout
from .container import (
    BUFFERS,
    PARAMS,
    chain_backward,
    chain_forward,
    check_unique_names,
    child_views,
    nested_shapes,
)
from .layers import Layer

Array = Any


class Sequential:
    """Layers applied in order; parameter ``p`` of layer ``name`` is the flat view ``name.p``.

    ``layout`` describes the trained parameters (what the algorithms update and average);
    ``buffer_layout`` the non-trained state, allocated and bound separately
    (``buffer_layout.zeros``, ``init_buffers``, ``bind_buffers``). A model without batch
    normalization has an empty ``buffer_layout`` and needs no buffer at all.
    """

    def __init__(self, layers: Sequence[Layer]) -> None:
        check_unique_names(layers)
        self.layers = list(layers)
        self.layout = ParamLayout.from_items(nested_shapes(self.layers, PARAMS))
        self.buffer_layout = ParamLayout.from_items(nested_shapes(self.layers, BUFFERS))
        self.buffers: Array | None = None
        # the arrays last bound, held so their ids cannot be reused by new arrays meanwhile
        self._bound: tuple[Array, Array] | None = None

    def init(self, params: Array, rng: np.random.Generator) -> None:
        """Initialize the flat parameter vector in place, layer by layer."""
        views = self.layout.views(params)
        for layer in self.layers:
            layer.init_params(child_views(views, layer, layer.param_shapes()), rng)

    def bind(self, params: Array, grads: Array) -> None:
        """Point every layer at views of ``params`` and ``grads`` (cheap when already bound)."""
        if self._bound is not None and self._bound[0] is params and self._bound[1] is grads:
            return
        pviews, gviews = self.layout.views(params), self.layout.views(grads)
        for layer in self.layers:
            shapes = layer.param_shapes()
            layer.bind(child_views(pviews, layer, shapes), child_views(gviews, layer, shapes))
        self._bound = (params, grads)

    def init_buffers(self, buffers: Array) -> None:
        """Fill a flat buffer of ``buffer_layout`` with the initial state (mean 0, variance 1)."""
        views = self.buffer_layout.views(buffers)
        for layer in self.layers:
            layer.init_buffers(child_views(views, layer, layer.buffer_shapes()))

    def bind_buffers(self, buffers: Array) -> None:
        """Point every layer at views of ``buffers``; training forwards update it in place."""
        if buffers is self.buffers:
            return
        views = self.buffer_layout.views(buffers)
        for layer in self.layers:
            layer.bind_buffers(child_views(views, layer, layer.buffer_shapes()))
        self.buffers = buffers

    def forward(self, x: Array, train: bool = True) -> Array:
        if self.buffers is None and self.buffer_layout.size:
            raise RuntimeError("this model keeps running statistics: call bind_buffers first")
        return chain_forward(self.layers, x, train)

    def backward(self, dy: Array, need_input_grad: bool = False) -> Array | None:
        """Back-propagate ``dy``; writes every parameter gradient; dL/dx if asked for."""
        return chain_backward(self.layers, dy, need_input_grad)
