"""Batch normalization over every axis but the channel axis 1: (N, C) or (N, C, H, W)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .layers import Layer

Array = Any


class BatchNorm(Layer):
    """y = gamma * xhat + beta per channel (Ioffe & Szegedy 2015); PyTorch's conventions.

    Training: xhat = (x - mean_B) / sqrt(var_B + eps) with the batch's biased variance, and the
    running statistics (buffers, outside the trained parameters) move in place:
    ``running_mean <- (1 - momentum) running_mean + momentum mean_B``, and the same for
    ``running_var`` with the unbiased batch variance var_B * m / (m - 1), m = values per channel.
    Evaluation: xhat = (x - running_mean) / sqrt(running_var + eps); buffers are only read.
    Parameters ``weight`` (gamma, init 1) and ``bias`` (beta, init 0).
    """

    def __init__(self, channels: int, momentum: float = 0.1, eps: float = 1e-5,
                 name: str = "bn") -> None:
        if channels < 1 or not 0 <= momentum <= 1 or eps <= 0:
            raise ValueError(f"BatchNorm needs channels >= 1, momentum in [0, 1], eps > 0, "
                             f"got {channels}, {momentum}, {eps}")
        self.channels, self.momentum, self.eps, self.name = channels, momentum, eps, name

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [("weight", (self.channels,)), ("bias", (self.channels,))]

    def buffer_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [("running_mean", (self.channels,)), ("running_var", (self.channels,))]

    def init_params(self, params: dict[str, Array], rng: np.random.Generator) -> None:
        params["weight"][...] = 1
        params["bias"][...] = 0

    def init_buffers(self, buffers: dict[str, Array]) -> None:
        buffers["running_mean"][...] = 0
        buffers["running_var"][...] = 1

    def forward(self, x: Array, train: bool = True) -> Array:
        if x.ndim < 2 or x.shape[1] != self.channels:
            raise ValueError(f"{self.name}: expected input (N, {self.channels}, ...), "
                             f"got {x.shape}")
        self._axes = (0, *range(2, x.ndim))
        self._shape = (1, self.channels) + (1,) * (x.ndim - 2)
        self._count, self._train = x.size // self.channels, train
        if train:
            if self._count < 2:
                raise ValueError(f"{self.name}: training needs more than one value per channel")
            mean = x.mean(axis=self._axes)
            centred = x - mean.reshape(self._shape)
            var = (centred * centred).mean(axis=self._axes)
            self._invstd = 1 / (var + self.eps) ** 0.5
            self._update_running(mean, var)
        else:
            centred = x - self.buffers["running_mean"].reshape(self._shape)
            self._invstd = 1 / (self.buffers["running_var"] + self.eps) ** 0.5
        self._xhat = centred * self._invstd.reshape(self._shape)
        gamma, beta = self.params["weight"], self.params["bias"]
        return self._xhat * gamma.reshape(self._shape) + beta.reshape(self._shape)

    def _update_running(self, mean: Array, var: Array) -> None:
        m, count = self.momentum, self._count
        running_mean, running_var = self.buffers["running_mean"], self.buffers["running_var"]
        running_mean *= 1 - m
        running_mean += m * mean
        running_var *= 1 - m
        running_var += (m * count / (count - 1)) * var

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        """dgamma = sum dy xhat, dbeta = sum dy; training: dx = gamma invstd / m
        (m dy - dbeta - xhat dgamma) (the batch statistics depend on x); eval: gamma invstd dy."""
        dgamma, dbeta = self.grads["weight"], self.grads["bias"]
        (dy * self._xhat).sum(axis=self._axes, out=dgamma)
        dy.sum(axis=self._axes, out=dbeta)
        if not need_input_grad:
            return None
        scale = (self.params["weight"] * self._invstd).reshape(self._shape)
        if not self._train:
            return dy * scale
        shape, count = self._shape, self._count
        centred_dy = count * dy - dbeta.reshape(shape) - self._xhat * dgamma.reshape(shape)
        return (scale / count) * centred_dy
