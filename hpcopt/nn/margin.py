"""Non-smooth margin losses on logits: value and a (sub)gradient w.r.t. the logits, in one pass.

With margin_b = z_b[y_b] - max_{j != y_b} z_b[j] (true logit minus the best wrong one):

- ``multiclass_hinge`` (Crammer & Singer): mean_b max(0, m - margin_b), to train a classifier;
- ``attack_margin`` (Carlini & Wagner's f_6): mean_b max(margin_b, -kappa), minimised by an
  attacker: it pushes the true class below the best wrong class by kappa, then stops.
"""

from __future__ import annotations

from typing import Any

from ..backend import array_module

Array = Any


def _margins(logits: Array, labels: Array) -> tuple[Array, Array, Array]:
    """(rows, margin per row, index of the best wrong class per row)."""
    xp = array_module(logits)
    rows = xp.arange(logits.shape[0])
    wrong = logits.copy()
    wrong[rows, labels] = -xp.inf
    best = wrong.argmax(axis=1)
    return rows, logits[rows, labels] - wrong[rows, best], best


def multiclass_hinge(logits: Array, labels: Array, margin: float = 1.0) -> tuple[Array, Array]:
    """mean_b max(0, m - margin_b) and its gradient (1/B on the best wrong class, -1/B on y_b)."""
    xp = array_module(logits)
    rows, margins, best = _margins(logits, labels)
    active = (margin - margins > 0).astype(logits.dtype) / logits.shape[0]
    grad = xp.zeros_like(logits)
    grad[rows, best] += active
    grad[rows, labels] -= active
    return xp.maximum(margin - margins, 0).mean(), grad


def attack_margin(logits: Array, labels: Array, kappa: float = 0.0) -> tuple[Array, Array]:
    """mean_b max(margin_b, -kappa) and its gradient (1/B on y_b, -1/B on the best wrong class)."""
    xp = array_module(logits)
    rows, margins, best = _margins(logits, labels)
    active = (margins > -kappa).astype(logits.dtype) / logits.shape[0]
    grad = xp.zeros_like(logits)
    grad[rows, labels] += active
    grad[rows, best] -= active
    return xp.maximum(margins, -kappa).mean(), grad
