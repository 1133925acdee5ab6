"""Residual blocks: y = branch(x) + shortcut(x), and the parameter-free option-A shortcut."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backend import array_module
from .container import Container, chain_backward, chain_forward
from .layers import Layer

Array = Any


class ShortcutA(Layer):
    """Option A of He et al. 2016 as in the CIFAR ResNet code: x[:, :, ::s, ::s] with zero
    channels added on both sides, (out - in) // 2 before and the rest after. No parameters."""

    name = "shortcut"

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        if not 1 <= in_channels <= out_channels or stride < 1:
            raise ValueError(f"option-A shortcut needs 1 <= in <= out channels and stride >= 1, "
                             f"got {in_channels} -> {out_channels}, stride {stride}")
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.before = (out_channels - in_channels) // 2

    def forward(self, x: Array, train: bool = True) -> Array:
        xp, s = array_module(x), self.stride
        self._input_shape = x.shape
        kept = x[:, :, ::s, ::s]
        out = xp.zeros((x.shape[0], self.out_channels, *kept.shape[2:]), dtype=x.dtype)
        out[:, self.before:self.before + self.in_channels] = kept
        return out

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        if not need_input_grad:
            return None
        xp, s = array_module(dy), self.stride
        dx = xp.zeros(self._input_shape, dtype=dy.dtype)
        dx[:, :, ::s, ::s] = dy[:, self.before:self.before + self.in_channels]
        return dx


class Residual(Container):
    """y = branch(x) + shortcut(x); the identity when ``shortcut`` is None. Entries are named
    ``<name>.<child>.<entry>``; the layer after the sum (ReLU in a ResNet) is not part of it."""

    def __init__(self, branch: Sequence[Layer], shortcut: Layer | None = None,
                 name: str = "block") -> None:
        super().__init__([*branch, *([shortcut] if shortcut else [])], name)
        self.branch, self.shortcut = list(branch), shortcut

    def forward(self, x: Array, train: bool = True) -> Array:
        y = chain_forward(self.branch, x, train)
        skip = x if self.shortcut is None else self.shortcut.forward(x, train)
        if y.shape != skip.shape:
            raise ValueError(f"{self.name}: branch gives {y.shape}, shortcut {skip.shape}")
        return y + skip

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        dx = chain_backward(self.branch, dy, need_input_grad)
        skip = dy if self.shortcut is None else self.shortcut.backward(dy, need_input_grad)
        if not need_input_grad:
            return None
        assert dx is not None and skip is not None  # both return the input gradient when asked
        return dx + skip
