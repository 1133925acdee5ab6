"""Pooling on NCHW arrays (one strided slice per window offset), and flattening."""

from __future__ import annotations

from math import prod
from typing import Any

from ..backend import array_module
from .conv import output_size, window
from .layers import Layer

Array = Any


class _Pool2d(Layer):
    """Windows of ``kernel_size`` x ``kernel_size`` every ``stride`` (default: the kernel size),
    no padding."""

    def __init__(self, kernel_size: int, stride: int | None = None) -> None:
        stride = kernel_size if stride is None else stride
        if kernel_size < 1 or stride < 1:
            raise ValueError(f"pooling needs kernel and stride >= 1, got {kernel_size}, {stride}")
        self.kernel, self.stride = kernel_size, stride

    def _offsets(self, x: Array) -> list[tuple[slice, slice]]:
        """Per kernel offset (i, j), the input slices that offset meets at every output."""
        if x.ndim != 4:
            raise ValueError(f"{self.name}: expected an NCHW input, got shape {x.shape}")
        k, s = self.kernel, self.stride
        ho, wo = output_size(x.shape[2], k, s, 0), output_size(x.shape[3], k, s, 0)
        if ho < 1 or wo < 1:
            raise ValueError(f"{self.name}: input {x.shape[2:]} is smaller than the window {k}")
        return [(window(i, ho, s), window(j, wo, s)) for i in range(k) for j in range(k)]


class MaxPool2d(_Pool2d):
    """y = max over each window; the gradient goes to the first maximum of the window."""

    name = "maxpool"

    def forward(self, x: Array, train: bool = True) -> Array:
        xp = array_module(x)
        self._slices, self._input_shape = self._offsets(x), x.shape
        rows, cols = self._slices[0]
        out = x[:, :, rows, cols].copy()
        self._argmax = xp.zeros(out.shape, dtype=xp.int16)
        for index, (rows, cols) in enumerate(self._slices[1:], start=1):
            candidate = x[:, :, rows, cols]
            self._argmax = xp.where(candidate > out, index, self._argmax)
            xp.maximum(out, candidate, out=out)
        return out

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        if not need_input_grad:
            return None
        xp = array_module(dy)
        dx = xp.zeros(self._input_shape, dtype=dy.dtype)
        for index, (rows, cols) in enumerate(self._slices):
            dx[:, :, rows, cols] += dy * (self._argmax == index)
        return dx


class AvgPool2d(_Pool2d):
    """y = mean over each window."""

    name = "avgpool"

    def forward(self, x: Array, train: bool = True) -> Array:
        self._slices, self._input_shape = self._offsets(x), x.shape
        rows, cols = self._slices[0]
        out = x[:, :, rows, cols].copy()
        for rows, cols in self._slices[1:]:
            out += x[:, :, rows, cols]
        out /= len(self._slices)
        return out

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        if not need_input_grad:
            return None
        xp = array_module(dy)
        dx = xp.zeros(self._input_shape, dtype=dy.dtype)
        share = dy / len(self._slices)
        for rows, cols in self._slices:
            dx[:, :, rows, cols] += share
        return dx


class GlobalAvgPool2d(Layer):
    """(N, C, H, W) -> (N, C): the mean over all positions of each channel."""

    name = "gap"

    def forward(self, x: Array, train: bool = True) -> Array:
        self._input_shape = x.shape
        return x.mean(axis=(2, 3))

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        if not need_input_grad:
            return None
        xp = array_module(dy)
        n, c, h, w = self._input_shape
        return xp.broadcast_to((dy / (h * w))[:, :, None, None], self._input_shape).copy()


class Flatten(Layer):
    """(N, ...) -> (N, prod(...)), C order (a view when the input is contiguous)."""

    name = "flatten"

    def forward(self, x: Array, train: bool = True) -> Array:
        self._input_shape = x.shape
        return x.reshape(x.shape[0], prod(x.shape[1:]))

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        return dy.reshape(self._input_shape) if need_input_grad else None
