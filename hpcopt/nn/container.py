"""Nested names for layers that hold layers, still on one flat parameter buffer.

A child ``c`` of a container named ``block1`` owns the entries ``block1.c.<name>`` of the
model's layouts; a container splits the views it is handed by that prefix and passes each child
its own. ``Sequential`` (the model) and ``Container`` (a layer) share these rules, so nesting
goes to any depth: ``block1.conv1.weight``, ``block1.bn1.running_mean``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import methodcaller
from typing import Any

import numpy as np

from .layers import Layer

Array = Any
Shapes = list[tuple[str, tuple[int, ...]]]


def check_unique_names(layers: Sequence[Layer]) -> None:
    """Layers that own parameters or buffers need distinct names (they prefix the entries)."""
    names = [layer.name for layer in layers if layer.param_shapes() or layer.buffer_shapes()]
    if len(set(names)) != len(names):
        raise ValueError(f"layers with parameters need unique names, got {names}")


PARAMS: Callable[[Layer], Shapes] = methodcaller("param_shapes")
BUFFERS: Callable[[Layer], Shapes] = methodcaller("buffer_shapes")


def nested_shapes(layers: Sequence[Layer], shapes_of: Callable[[Layer], Shapes]) -> Shapes:
    """``(layer.name + "." + entry, shape)`` for every entry of every layer, in order
    (``shapes_of`` is ``PARAMS`` or ``BUFFERS``)."""
    return [(f"{layer.name}.{name}", shape) for layer in layers for name, shape in shapes_of(layer)]


def child_views(views: dict[str, Array], layer: Layer, shapes: Shapes) -> dict[str, Array]:
    """The views of ``layer``'s own entries, with its name prefix removed."""
    return {name: views[f"{layer.name}.{name}"] for name, _ in shapes}


class Container(Layer):
    """A layer made of named child layers; subclasses define ``forward`` and ``backward``."""

    def __init__(self, children: Sequence[Layer], name: str) -> None:
        check_unique_names(children)
        self.children, self.name = list(children), name

    def param_shapes(self) -> Shapes:
        return nested_shapes(self.children, PARAMS)

    def buffer_shapes(self) -> Shapes:
        return nested_shapes(self.children, BUFFERS)

    def init_params(self, params: dict[str, Array], rng: np.random.Generator) -> None:
        for child in self.children:
            child.init_params(child_views(params, child, child.param_shapes()), rng)

    def bind(self, params: dict[str, Array], grads: dict[str, Array]) -> None:
        for child in self.children:
            shapes = child.param_shapes()
            child.bind(child_views(params, child, shapes), child_views(grads, child, shapes))

    def init_buffers(self, buffers: dict[str, Array]) -> None:
        for child in self.children:
            child.init_buffers(child_views(buffers, child, child.buffer_shapes()))

    def bind_buffers(self, buffers: dict[str, Array]) -> None:
        for child in self.children:
            child.bind_buffers(child_views(buffers, child, child.buffer_shapes()))


def chain_forward(layers: Sequence[Layer], x: Array, train: bool) -> Array:
    """Apply ``layers`` in order."""
    for layer in layers:
        x = layer.forward(x, train)
    return x


def chain_backward(layers: Sequence[Layer], dy: Array, need_input_grad: bool) -> Array | None:
    """Back-propagate through ``layers`` in reverse; dL/dx of the first one if asked for."""
    for i in range(len(layers) - 1, -1, -1):
        dy = layers[i].backward(dy, need_input_grad=need_input_grad or i > 0)
    return dy
