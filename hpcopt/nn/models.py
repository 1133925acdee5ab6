"""Ready-made models built from the layers."""

from __future__ import annotations

from typing import Sequence

from .layers import Layer, Linear, ReLU, Tanh
from .sequential import Sequential

ACTIVATIONS = {"relu": ReLU, "tanh": Tanh}


def mlp(inputs: int, hidden: Sequence[int], outputs: int, activation: str = "relu") -> Sequential:
    """Multi-layer perceptron: Linear(fc1) -> act -> ... -> Linear(fcK), logits out."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r} (choose from {', '.join(ACTIVATIONS)})")
    sizes = [inputs, *hidden, outputs]
    layers: list[Layer] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        layers.append(Linear(fan_in, fan_out, name=f"fc{i}"))
        if i < len(sizes) - 1:
            layers.append(ACTIVATIONS[activation]())
    return Sequential(layers)
