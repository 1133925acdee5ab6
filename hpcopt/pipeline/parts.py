"""From a Config to the parts of a pipeline run: the staged problem, its stage plan, the algorithm.

``build_problem`` is the only costly part (the attack trains its classifier first), so it runs
after ``plan_for`` has checked, from the architecture alone, that the job has one rank per
stage. Everything here is deterministic in the config: every rank builds the same problem.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import numpy as np

from ..algorithms.pprs import PPRS, PipelinedAGD, PipelinedGD
from ..algorithms.registration import create
from ..config import Config
from ..data.datasets import load_dataset
from ..errors import HpcoptError
from ..nn import Sequential
from ..problems.attack import adversarial_attack, scaled_features, train_classifier
from ..problems.few_shot import few_shot
from ..problems.l1_chain import l1_chain
from ..problems.staged import StagedProblem
from .split import StagePlan

#: Epochs of minibatch SGD that train the attacked classifier (MNIST-5k: ~91% test accuracy
#: with one hidden layer of 128, ~2 s).
CLASSIFIER_EPOCHS = 5
#: The l1 chain's shape: parameter blocks (so at most this many stages), each of this size.
L1_BLOCKS, L1_BLOCK_DIM, L1_ROWS = 8, 4, 64
Algorithm = PPRS | PipelinedAGD | PipelinedGD


def build_problem(config: Config, architecture_only: bool = False,
                  xp: ModuleType = np) -> StagedProblem:
    """The configured problem, its data in ``xp`` (the run's array module; the attacked
    classifier trains on the host). ``architecture_only``: the same layers with untrained
    parameters (for planning stages before any costly work)."""
    data, dtype, seed = config.data, np.dtype(config.run.dtype), config.run.seed
    if data.problem == "l1_chain":
        return l1_chain(L1_BLOCKS, L1_BLOCK_DIM, L1_ROWS, seed=seed, dtype=dtype, xp=xp)
    dataset = load_dataset(data.dataset, data.path or None, data.test_fraction, seed)
    if data.problem == "few_shot":
        if data.shots > int(np.bincount(dataset.y_train).min()):
            raise HpcoptError(f"shots {data.shots} is more than the smallest class of "
                              f"{data.dataset} holds")
        return few_shot(dataset, data.shots, config.model.hidden, seed=seed, dtype=dtype, xp=xp)
    _, x_test = scaled_features(dataset)
    if architecture_only:
        from ..nn import mlp

        model = mlp(x_test.shape[1], config.model.hidden, dataset.num_classes)
        params = np.zeros(model.layout.size)
        images, labels = x_test[:data.images], dataset.y_test[:data.images]
    else:
        model, params = train_classifier(dataset, config.model.hidden, CLASSIFIER_EPOCHS,
                                         seed=seed)
        images, labels = _correctly_classified(model, params, x_test, dataset.y_test, data.images)
    if images.shape[0] < data.images:
        raise HpcoptError(f"the test set has only {images.shape[0]} images, asked for {data.images}")
    return adversarial_attack(model, params, images, labels, data.eps, dtype=dtype, xp=xp)


def _correctly_classified(model: Sequential, params: np.ndarray, x: np.ndarray, y: np.ndarray,
                          count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` test images the classifier gets right (the ones worth attacking)."""
    model.bind(params, np.zeros_like(params))
    right = np.flatnonzero(model.forward(x, train=False).argmax(axis=1) == y)[:count]
    return x[right], y[right]


def plan_for(config: Config, model: Sequential, world_size: int) -> StagePlan:
    """The stage plan (explicit ``stages`` or balanced by parameters) for ``world_size`` ranks:
    HpcoptError unless it has exactly one stage per rank."""
    if config.model.stages:
        plan = StagePlan.explicit(model, config.model.stages)
    else:
        plan = StagePlan.balanced(model, world_size)
    plan.check_world_size(world_size)
    return plan


def build_algorithm(config: Config, problem: StagedProblem, trainable: int) -> Algorithm:
    """PPRS or a pipelined baseline; ``trainable`` is d, all stages' trainable parameters."""
    algo = config.algorithm
    if (algo.algorithm == "pprs" and algo.outer == "accelerated"
            and (problem.radius is None or problem.lipschitz is None)):
        raise HpcoptError(f"the accelerated outer loop needs a known radius and Lipschitz constant: "
                          f"use --problem l1_chain, or --outer nesterov for {problem.name}")
    return create(algo.algorithm, dataclasses.asdict(algo),
                  {"radius": problem.radius, "lipschitz": problem.lipschitz,
                   "dimension": trainable, "seed": config.run.seed})


def describe(config: Config, problem: StagedProblem, plan: StagePlan, algorithm: Algorithm) -> str:
    """The problem, stages and algorithm in a few words, for the run's header."""
    data, algo = config.data, config.algorithm
    what = {"attack": f"attack on {data.images} {data.dataset} images (eps {data.eps:g}), mlp "
                      f"{'-'.join(map(str, config.model.hidden))} frozen",
            "few_shot": f"few-shot {data.shots}/class on {data.dataset}, mlp "
                        f"{'-'.join(map(str, config.model.hidden))}",
            "l1_chain": "l1 chain (1/m)||A theta - b||_1"}[data.problem]
    if algo.algorithm == "pprs":
        assert isinstance(algorithm, PPRS)
        how = f"K={algo.samples}, gamma={algorithm.smoothing_scale:g}, {algo.outer}"
    else:
        how = "one sample"
    return (f"{what}, {plan.num_stages} stage(s) cut at layers {list(plan.bounds[1:-1])}, "
            f"{algo.pipeline} schedule, {how}, lr {algo.lr:g}, momentum {algo.momentum:g}")
