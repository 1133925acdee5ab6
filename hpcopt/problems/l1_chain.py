"""A non-smooth convex problem with a known minimum, cut into stages that all hold parameters.

    f(theta) = (1/m) ||A theta - b||_1,   b = A theta*,   so min f = f(theta*) = 0

with A (m x d, m > d, Gaussian: full column rank almost surely, theta* the unique minimizer).
theta is split into blocks theta_1..theta_B (one ``ResidualAffine`` layer each, holding its
columns A_i): stage 0 receives -b, each layer adds A_i theta_i to the running residual, and the
last stage's sink takes the mean absolute value. f is L-Lipschitz with L = mean_i ||a_i||
(any subgradient is (1/m) A^T s with |s_i| <= 1), and R = ||theta_0 - theta*||.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..backend import array_module
from ..nn import Layer, Sequential
from ..rng import stream
from .staged import StagedProblem

Array = Any


class ResidualAffine(Layer):
    """y = x + A theta added to every row of x; A (m x d_i) is fixed data (on the parameters'
    device, shared by the pipeline's per-sample copies of the layer), theta the parameter."""

    constants = ("matrix",)

    def __init__(self, matrix: Array, name: str) -> None:
        self.matrix, self.name = matrix, name

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [("theta", (self.matrix.shape[1],))]

    def init_params(self, params: dict[str, Array], rng: np.random.Generator) -> None:
        params["theta"][...] = 0

    def forward(self, x: Array, train: bool = True) -> Array:
        return x + self.matrix @ self.params["theta"]

    def backward(self, dy: Array, need_input_grad: bool = True) -> Array | None:
        self.grads["theta"][...] = dy.sum(axis=0) @ self.matrix
        return dy if need_input_grad else None


def l1_chain(blocks: int = 4, block_dim: int = 3, rows: int = 24, seed: int = 0,
             dtype: Any = np.float64, xp: ModuleType = np) -> StagedProblem:
    """(1/m)||A theta - b||_1 over ``blocks`` layers of ``block_dim`` parameters; theta_0 = 0.
    A and b are drawn on the host and copied to ``xp``'s device."""
    if blocks < 1 or block_dim < 1 or rows <= blocks * block_dim:
        raise ValueError(f"need blocks, block_dim >= 1 and rows > blocks * block_dim, got "
                         f"{blocks}, {block_dim}, {rows}")
    d = blocks * block_dim
    rng = stream(seed, "l1_chain")
    a = rng.standard_normal((rows, d)).astype(dtype)
    theta_star = rng.standard_normal(d).astype(dtype)
    b = a @ theta_star
    layers = [ResidualAffine(xp.array(a[:, i * block_dim:(i + 1) * block_dim]), name=f"block{i}")
              for i in range(blocks)]
    start = xp.asarray(-b[None, :])

    def sink(k: int, residual: Array) -> tuple[Array, Array]:
        xp = array_module(residual)
        return xp.abs(residual).mean(), xp.sign(residual) / residual.size

    return StagedProblem(
        name="l1_chain", model=Sequential(layers), params=np.zeros(d, dtype=dtype),
        input_shape=start.shape, source=lambda k: start, sink=sink, f_star=0.0,
        radius=float(np.linalg.norm(theta_star)),
        lipschitz=float(np.linalg.norm(a, axis=1).mean()),
        extras={"theta_star": theta_star}, xp=xp)
