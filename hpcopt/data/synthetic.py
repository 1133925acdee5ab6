"""Synthetic problems with a known minimizer, the float64 reference for optimizer tests.

Both problems average a per-sample loss over rows of ``features``; ``loss(x, idx)`` and
``gradient(x, idx)`` restrict the average to the rows ``idx`` (all rows when ``idx`` is None).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from hpcopt.errors import HpcoptError
from hpcopt.rng import stream

_NEWTON_TOLERANCE = 1e-12
_NEWTON_MAX_STEPS = 100


@dataclass(frozen=True, eq=False)
class SyntheticProblem(ABC):
    """Data (``features`` (n, d), ``targets`` (n,)), the minimizer ``x_star`` and ``f_star``."""

    name: str
    features: np.ndarray
    targets: np.ndarray
    x_star: np.ndarray
    f_star: float

    def _rows(self, idx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if idx is None:
            return self.features, self.targets
        return self.features[idx], self.targets[idx]

    @abstractmethod
    def loss(self, x: np.ndarray, idx: np.ndarray | None = None) -> float:
        """The objective at ``x`` averaged over rows ``idx``."""

    @abstractmethod
    def gradient(self, x: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        """The gradient of ``loss(., idx)`` at ``x``."""


@dataclass(frozen=True, eq=False)
class LeastSquaresProblem(SyntheticProblem):
    """``(1/2m) ||A_I x - b_I||^2`` over the ``m`` selected rows ``I``."""

    def loss(self, x: np.ndarray, idx: np.ndarray | None = None) -> float:
        a, b = self._rows(idx)
        return _least_squares_loss(a, b, x)

    def gradient(self, x: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        a, b = self._rows(idx)
        return a.T @ (a @ x - b) / b.size


@dataclass(frozen=True, eq=False)
class LogisticRegressionProblem(SyntheticProblem):
    """``mean_I log(1 + exp(-s_i a_i.x)) + (l2/2) ||x||^2`` with signs ``s_i = 2 y_i - 1``."""

    l2: float

    def loss(self, x: np.ndarray, idx: np.ndarray | None = None) -> float:
        a, y = self._rows(idx)
        return _logistic_loss(a, y, self.l2, x)

    def gradient(self, x: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        a, y = self._rows(idx)
        return _logistic_gradient(a, y, self.l2, x)


def _least_squares_loss(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> float:
    residual = a @ x - b
    return float(residual @ residual / (2 * b.size))


def _signed_margins(a: np.ndarray, y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    signs = 2.0 * y - 1.0
    return signs, signs * (a @ x)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


def _logistic_loss(a: np.ndarray, y: np.ndarray, l2: float, x: np.ndarray) -> float:
    _, margins = _signed_margins(a, y, x)
    return float(np.mean(np.logaddexp(0.0, -margins)) + 0.5 * l2 * (x @ x))


def _logistic_gradient(a: np.ndarray, y: np.ndarray, l2: float, x: np.ndarray) -> np.ndarray:
    signs, margins = _signed_margins(a, y, x)
    return -(a.T @ (signs * _sigmoid(-margins))) / y.size + l2 * x


def _logistic_hessian(a: np.ndarray, y: np.ndarray, l2: float, x: np.ndarray) -> np.ndarray:
    _, margins = _signed_margins(a, y, x)
    weights = _sigmoid(margins) * _sigmoid(-margins)
    return (a.T * weights) @ a / y.size + l2 * np.eye(x.size)


def _check_size(n: int, d: int) -> None:
    if n < 1 or d < 1:
        raise HpcoptError(f"a synthetic problem needs n >= 1 and d >= 1, got n={n}, d={d}")


def least_squares(n: int, d: int, noise: float, seed: int) -> LeastSquaresProblem:
    """Gaussian ``A`` (n, d), ``b = A x_true + noise * N(0, 1)``; ``x_star`` from lstsq
    (the minimum-norm minimizer when ``n < d``)."""
    _check_size(n, d)
    if noise < 0:
        raise HpcoptError(f"noise must be non-negative, got {noise}")
    rng = stream(seed, "synthetic", 0)
    a = rng.standard_normal((n, d))
    b = a @ rng.standard_normal(d) + noise * rng.standard_normal(n)
    x_star = np.linalg.lstsq(a, b, rcond=None)[0]
    return LeastSquaresProblem("least_squares", a, b, x_star, _least_squares_loss(a, b, x_star))


def logistic_regression(n: int, d: int, l2: float, seed: int) -> LogisticRegressionProblem:
    """Gaussian ``A`` (n, d), labels ``y ~ Bernoulli(sigmoid(A x_true))`` with
    ``||x_true|| ~ 2``; ``x_star`` by damped Newton to gradient norm < 1e-12."""
    _check_size(n, d)
    if not l2 > 0:
        raise HpcoptError(f"l2 must be positive (it makes the minimizer unique), got {l2}")
    rng = stream(seed, "synthetic", 1)
    a = rng.standard_normal((n, d))
    x_true = 2.0 * rng.standard_normal(d) / np.sqrt(d)
    y = (rng.random(n) < _sigmoid(a @ x_true)).astype(np.int64)
    x_star = _newton(a, y, l2)
    return LogisticRegressionProblem(
        "logistic_regression", a, y, x_star, _logistic_loss(a, y, l2, x_star), l2
    )


def _newton(a: np.ndarray, y: np.ndarray, l2: float) -> np.ndarray:
    """Newton's method from 0 with Armijo backtracking while far from the minimizer; full
    steps once the Newton decrement is below 1e-10 (there loss differences drown in rounding)."""
    x = np.zeros(a.shape[1])
    for _ in range(_NEWTON_MAX_STEPS):
        gradient = _logistic_gradient(a, y, l2, x)
        if np.linalg.norm(gradient) < _NEWTON_TOLERANCE:
            return x
        step = -np.linalg.solve(_logistic_hessian(a, y, l2, x), gradient)
        decrement = -(gradient @ step)
        t = 1.0
        if decrement > 1e-10:
            loss = _logistic_loss(a, y, l2, x)
            while _logistic_loss(a, y, l2, x + t * step) > loss - 1e-4 * t * decrement:
                t *= 0.5
        x = x + t * step
    raise RuntimeError(f"Newton's method did not reach gradient norm {_NEWTON_TOLERANCE}")
