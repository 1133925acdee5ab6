"""Momentum shared by the data-parallel algorithms: the step direction and the round policy
(of sgd's momentum buffer and of adamw's moments, ``hpcopt.algorithms.inner``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import HpcoptError

Array = Any

MOMENTUM_POLICIES = ("keep", "average", "reset")
#: The labels of a round's averages of the first moment (sgd's b, adamw's m) and of adamw's v.
MOMENTUM_LABEL, SECOND_MOMENT_LABEL = "momentum", "second_moment"


def check_momentum_policy(policy: str, name: str = "momentum_policy") -> None:
    if policy not in MOMENTUM_POLICIES:
        raise HpcoptError(f"unknown {name} {policy!r} (choose from {', '.join(MOMENTUM_POLICIES)})")


def momentum_direction(grad: Array, buffer: Array | None, mu: float, nesterov: bool) -> Array:
    """The step direction, updating the momentum buffer in place.

    No buffer: d = g. Heavy ball: b <- mu b + g, d = b. Nesterov: b <- mu b + g, d = g + mu b
    (written into ``grad``, PyTorch's form). No new array of size d is kept.
    """
    if buffer is None:
        return grad
    buffer *= mu
    buffer += grad
    if not nesterov:
        return buffer
    grad += mu * buffer
    return grad


def apply_momentum_policy(buffer: Array | None, policy: str, average: Callable[[Array, str], Any],
                          label: str) -> None:
    """At an averaging round: ``keep`` the local buffer (None: this run has none), ``average``
    it (``average(buffer, label)``: one allreduce) or ``reset`` it to zero."""
    if buffer is None:
        return
    if policy == "average":
        average(buffer, label)
    elif policy == "reset":
        buffer[...] = 0
