"""Few-shot learning: a small ReLU MLP trained on a few samples per class with a hinge loss."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..data.datasets import Dataset
from ..nn import mlp
from ..nn.margin import multiclass_hinge
from ..rng import stream
from .attack import scaled_features
from .staged import StagedProblem


def few_shot(dataset: Dataset, shots: int = 5, hidden: Sequence[int] = (32,), seed: int = 0,
             dtype: Any = np.float64, xp: ModuleType = np) -> StagedProblem:
    """``shots`` training samples per class (chosen by stream(seed, "few_shot", label)), the
    multiclass hinge loss on all of them (full batch), He-initialised weights. The training
    samples go to ``xp``'s device; the test set (``extras``) stays on the host."""
    x_train, x_test = scaled_features(dataset)
    chosen = np.concatenate([
        stream(seed, "few_shot", int(c)).choice(np.flatnonzero(dataset.y_train == c), shots,
                                                replace=False)
        for c in range(dataset.num_classes)])
    features = xp.ascontiguousarray(x_train[chosen], dtype=dtype)
    labels = xp.asarray(dataset.y_train[chosen])
    model = mlp(features.shape[1], hidden, dataset.num_classes)
    params = np.zeros(model.layout.size, dtype=dtype)
    model.init(params, stream(seed, "init"))
    return StagedProblem(
        name="few_shot", model=model, params=params, input_shape=features.shape,
        source=lambda k: features, sink=lambda k, logits: multiclass_hinge(logits, labels),
        extras={"test_features": x_test.astype(dtype), "test_labels": dataset.y_test}, xp=xp)


def accuracy(problem: StagedProblem, params: np.ndarray, features: np.ndarray,
             labels: np.ndarray) -> float:
    """Serial test accuracy of the whole model at ``params``."""
    problem.model.bind(params, np.zeros_like(params))
    return float((problem.model.forward(features, train=False).argmax(axis=1) == labels).mean())
