"""From a Config to the parts of a run: backend, data shard, model, problem, algorithm."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import rng
from .algorithms.local_sgd import LocalSGD
from .algorithms.schedules import Schedule
from .backend import Backend, get_backend
from .comm import Comm
from .config import Config
from .data.datasets import Dataset, load_dataset
from .data.partition import partition_indices
from .data.sampler import MinibatchSampler
from .errors import UserError
from .nn import Sequential, mlp
from .problems.classification import ClassificationProblem

Array = Any


@dataclass
class RunParts:
    """Everything ``train`` needs, built identically on every rank except for the data shard."""

    config: Config
    backend: Backend
    dataset: Dataset
    model: Sequential
    problem: ClassificationProblem
    algorithm: LocalSGD
    x0: Array
    total_steps: int         # T, the nominal number of local steps
    local_steps: int         # steps this rank runs (differs from T only with local_steps)
    test_features: Array
    test_labels: Array


def build_run(config: Config, comm: Comm) -> RunParts:
    """Build every part; raises UserError for anything the user must fix (on any rank)."""
    backend = get_backend(config.run.device)
    dtype = np.dtype(config.run.dtype)
    data = config.data
    dataset = load_dataset(data.dataset, data.path or None, data.test_fraction, config.run.seed)
    n_train = dataset.x_train.shape[0]
    shard = partition_indices(data.partition, n_train, comm.rank, comm.size, config.run.seed)
    sampler = MinibatchSampler(np.arange(shard.size), data.batch_size, config.run.seed, comm.rank)
    total_steps = config.run.steps or _steps_for_epochs(config.run.epochs, n_train, comm.size,
                                                         data.batch_size)
    features = dataset.x_train[shard].reshape(shard.size, -1)
    model = mlp(features.shape[1], config.model.hidden, dataset.num_classes, config.model.activation)
    problem = ClassificationProblem(model, backend.asarray(features, dtype),
                                    backend.asarray(dataset.y_train[shard]), sampler, backend)
    algo = config.algorithm
    schedule = Schedule(algo.schedule, algo.lr, algo.decay, algo.milestones, comm.size, total_steps)
    algorithm = LocalSGD(schedule, algo.interval, algo.momentum, algo.nesterov,
                         algo.momentum_policy, algo.local_steps)
    local_steps = algorithm.steps_for(total_steps, comm.rank, comm.size)
    x0_host = np.zeros(model.layout.size)
    model.init(x0_host, rng.stream(config.run.seed, "init"))
    n_test = dataset.x_test.shape[0]
    return RunParts(config, backend, dataset, model, problem, algorithm,
                    backend.asarray(x0_host, dtype), total_steps, local_steps,
                    backend.asarray(dataset.x_test.reshape(n_test, -1), dtype),
                    backend.asarray(dataset.y_test))


def _steps_for_epochs(epochs: float, n_train: int, workers: int, batch_size: int) -> int:
    """T such that the N ranks together see about ``epochs`` passes over the training set."""
    per_epoch = (n_train // workers) // batch_size
    if per_epoch < 1:
        raise UserError(f"batch size {batch_size} is larger than a shard "
                        f"({n_train // workers} samples per rank with {workers} ranks)")
    return max(1, math.ceil(epochs * per_epoch))
