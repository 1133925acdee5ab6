"""2-D convolution on NCHW arrays by im2col, with no ``as_strided`` (runs on NumPy and CuPy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import array_module
from .layers import Layer

Array = Any


def output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Positions a window of ``kernel`` takes along an axis of ``size`` padded by ``padding``."""
    return (size + 2 * padding - kernel) // stride + 1


def window(offset: int, count: int, stride: int) -> slice:
    """The input positions that kernel offset ``offset`` meets at ``count`` outputs of stride
    ``stride``."""
    return slice(offset, offset + stride * (count - 1) + 1, stride)


class Workspace:
    """Scratch arrays kept between calls and reallocated only when shape, dtype or device change."""

    def __init__(self) -> None:
        self._arrays: dict[str, Array] = {}

    def get(self, key: str, shape: tuple[int, ...], like: Array, zero: bool = False) -> Array:
        """An array of ``shape`` with ``like``'s dtype and device; zeros when new or ``zero``."""
        xp = array_module(like)
        array = self._arrays.get(key)
        if (array is None or array.shape != shape or array.dtype != like.dtype
                or array_module(array) is not xp):
            array = self._arrays[key] = xp.zeros(shape, dtype=like.dtype)
        elif zero:
            array.fill(0)
        return array


class Conv2d(Layer):
    """y[n, o] = b[o] + sum_{c, i, j} W[o, c, i, j] xpad[n, c, s*u + i, s*v + j]  (NCHW).

    ``weight`` is (out, in, k, k) as in PyTorch; He-normal initialization (std sqrt(2 / fan_in),
    the CIFAR ResNet code's ``kaiming_normal_``), zero bias. im2col: the padded input is copied
    into ``cols`` of shape (C, k, k, N, Ho, Wo) by one strided slice per kernel offset (k*k
    copies, each vectorized over batch and channels), then one GEMM W (O, C k k) @ cols
    (C k k, N Ho Wo). Backward: dW = dY cols^T (written into the gradient view), dcols = W^T dY,
    and col2im adds dcols back into the padded input one kernel offset at a time. ``cols`` and
    the padded input are reused between calls of the same shape.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, bias: bool = True, name: str = "conv") -> None:
        if min(in_channels, out_channels, kernel_size, stride) < 1 or padding < 0:
            raise ValueError(f"Conv2d needs positive channels, kernel and stride and padding >= 0,"
                             f" got {in_channels}->{out_channels}, k={kernel_size}, s={stride}, "
                             f"p={padding}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel, self.stride, self.padding = kernel_size, stride, padding
        self.bias, self.name = bias, name
        self._work = Workspace()

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        k = self.kernel
        shapes: list[tuple[str, tuple[int, ...]]] = [("weight", (self.out_channels, self.in_channels, k, k))]
        return shapes + [("bias", (self.out_channels,))] if self.bias else shapes

    def init_params(self, params: dict[str, Array], rng: np.random.Generator) -> None:
        std = np.sqrt(2.0 / (self.in_channels * self.kernel * self.kernel))
        w = rng.normal(0.0, std, size=params["weight"].shape)
        params["weight"][...] = array_module(params["weight"]).asarray(w)
        if self.bias:
            params["bias"][...] = 0

    def _check(self, x: Array) -> tuple[int, int]:
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"{self.name}: expected input (N, {self.in_channels}, H, W), "
                             f"got {x.shape}")
        k, s, p = self.kernel, self.stride, self.padding
        ho, wo = output_size(x.shape[2], k, s, p), output_size(x.shape[3], k, s, p)
        if ho < 1 or wo < 1:
            raise ValueError(f"{self.name}: input {x.shape[2:]} is smaller than the kernel {k} "
                             f"with padding {p}")
        return ho, wo

    def forward(self, x: Array, train: bool = True) -> Array:
        ho, wo = self._check(x)
        xp = array_module(x)
        n, c, h, w = x.shape
        k, s, p = self.kernel, self.stride, self.padding
        if p:
            padded = self._work.get("padded", (n, c, h + 2 * p, w + 2 * p), x)  # border stays 0
            padded[:, :, p:p + h, p:p + w] = x
        else:
            padded = x
        by_channel = padded.transpose(1, 0, 2, 3)
        cols = self._work.get("cols", (c, k, k, n, ho, wo), x)
        for i in range(k):
            for j in range(k):
                cols[:, i, j] = by_channel[:, :, window(i, ho, s), window(j, wo, s)]
        self._cols, self._input_shape = cols.reshape(c * k * k, n * ho * wo), x.shape
        out = self.params["weight"].reshape(self.out_channels, -1) @ self._cols
        if self.bias:
            out += self.params["bias"][:, None]
        return xp.ascontiguousarray(out.reshape(self.out_channels, n, ho, wo).transpose(1, 0, 2, 3))

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        xp = array_module(dy)
        n, c, h, w = self._input_shape
        o, ho, wo = dy.shape[1:]
        k, s, p = self.kernel, self.stride, self.padding
        dy_by_channel = xp.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(o, n * ho * wo)
        xp.matmul(dy_by_channel, self._cols.T, out=self.grads["weight"].reshape(o, -1))
        if self.bias:
            dy_by_channel.sum(axis=1, out=self.grads["bias"])
        if not need_input_grad:
            return None
        dcols = (self.params["weight"].reshape(o, -1).T @ dy_by_channel).reshape(c, k, k, n, ho, wo)
        dpadded = self._work.get("dpadded", (c, n, h + 2 * p, w + 2 * p), dy, zero=True)
        for i in range(k):
            for j in range(k):
                dpadded[:, :, window(i, ho, s), window(j, wo, s)] += dcols[:, i, j]
        return xp.ascontiguousarray(dpadded[:, :, p:p + h, p:p + w].transpose(1, 0, 2, 3))
