"""The PPRS paper's adversarial attack: an l_inf-bounded input perturbation of a trained MLP.

Stage 0 starts with an ``AdditivePerturbation`` layer holding one delta per attacked image (the
only trainable parameters); the trained classifier's layers follow, frozen. The attacker
minimises the clipped margin loss (``attack_margin``: true logit minus the best wrong logit,
floored at -kappa) subject to ||delta||_inf <= eps and images + delta in [0, 1].
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..backend import CPU
from ..data.datasets import Dataset
from ..data.sampler import MinibatchSampler
from ..nn import Sequential, mlp
from ..nn.margin import attack_margin
from ..nn.perturbation import AdditivePerturbation
from ..rng import stream
from .classification import ClassificationProblem
from .staged import StagedProblem


def scaled_features(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Train and test pixels scaled to [0, 1] by the training set's largest value."""
    scale = max(float(dataset.x_train.max()), 1.0)
    return dataset.x_train / scale, dataset.x_test / scale


def train_classifier(dataset: Dataset, hidden: Sequence[int] = (128,), epochs: float = 10,
                     lr: float = 0.1, batch_size: int = 32,
                     seed: int = 0) -> tuple[Sequential, np.ndarray]:
    """A ReLU MLP trained serially by minibatch SGD on [0, 1]-scaled pixels: (model, params)."""
    x_train, _ = scaled_features(dataset)
    model = mlp(x_train.shape[1], hidden, dataset.num_classes)
    params, grads = np.zeros(model.layout.size), np.zeros(model.layout.size)
    model.init(params, stream(seed, "init"))
    n = x_train.shape[0]
    sampler = MinibatchSampler(np.arange(n), batch_size, seed, 0)
    problem = ClassificationProblem(model, x_train, dataset.y_train, sampler, CPU)
    for _ in range(max(1, int(epochs * (n // batch_size)))):
        problem.oracle(params, grads)
        params -= lr * grads
    return model, params


def adversarial_attack(model: Sequential, params: np.ndarray, images: np.ndarray,
                       labels: np.ndarray, eps: float, kappa: float = 1.0,
                       dtype: Any = np.float64, xp: ModuleType = np) -> StagedProblem:
    """Attack ``images`` (n x features, in [0, 1]) against the trained ``model``/``params``
    (host arrays); the images and labels the stages read go to ``xp``'s device."""
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    images = np.ascontiguousarray(images, dtype=dtype)
    labels = np.asarray(labels)
    frozen = copy.deepcopy(model.layers)  # independent of the classifier's bindings
    attack = Sequential([AdditivePerturbation(images.shape, name="perturbation"), *frozen])
    n = images.size
    start = np.concatenate([np.zeros(n), params]).astype(dtype)
    pixels, classes = xp.asarray(images), xp.asarray(labels)
    lower, upper = np.full(start.size, -np.inf), np.full(start.size, np.inf)
    lower[:n] = np.maximum(-eps, -images.ravel())
    upper[:n] = np.minimum(eps, 1 - images.ravel())
    return StagedProblem(
        name="attack", model=attack, params=start, input_shape=images.shape,
        source=lambda k: pixels, sink=lambda k, logits: attack_margin(logits, classes, kappa),
        frozen=frozenset(layer.name for layer in frozen if layer.param_shapes()),
        lower=lower, upper=upper, extras={"labels": labels, "eps": eps}, xp=xp)
