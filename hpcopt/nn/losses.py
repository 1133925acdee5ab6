"""Losses: value and gradient with respect to the model output, in one pass."""

from __future__ import annotations

from typing import Any

from ..backend import array_module

Array = Any


def softmax_cross_entropy(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Mean cross-entropy of softmax(logits) against integer labels, and d loss / d logits.

    loss = -(1/B) sum_b log softmax(z_b)[y_b];  d loss/d z_b = (softmax(z_b) - onehot(y_b)) / B.
    Computed with the row maximum subtracted for stability. The loss is a 0-d array on the
    logits' device (no host round-trip); ``float()`` it when the host needs it.
    """
    xp = array_module(logits)
    batch = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    sums = exp.sum(axis=1)
    rows = xp.arange(batch)
    loss = (xp.log(sums) - shifted[rows, labels]).mean()
    grad = exp
    grad /= sums[:, None]
    grad[rows, labels] -= 1
    grad /= batch
    return loss, grad
