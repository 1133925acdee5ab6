"""Staged problems: a sequential model with its data, ready to be cut into pipeline stages.

A ``StagedProblem`` is the same object on every rank: the whole model (layer objects only; a
stage allocates nothing but its own block), the initial flat parameter vector, what enters
stage 0 (``source``) and the loss at the last stage (``sink``). ``setup_stage`` builds this
rank's part of a pipeline run: the ``Pipeline``, the trainable block x0 and its box.

The data behind ``source``, ``sink`` and the layers (images, labels, fixed matrices) live in the
array module ``xp`` the problem was built for (numpy, or cupy for a GPU run: the constructors
take ``xp``); ``params``, ``lower`` and ``upper`` are host arrays, which ``setup_stage`` slices
and copies to the run's device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from ..algorithms.pprs import Box
from ..comm import Comm
from ..nn import Sequential
from ..pipeline import Pipeline, StagePlan
from ..pipeline.executor import Sink, Source

Array = Any


@dataclass(eq=False)
class StagedProblem:
    """Model, initial parameters, data ends and (optional) constraints and known optimum.

    ``lower``/``upper`` bound the whole flat parameter vector (+-inf where free); ``f_star``,
    ``radius`` (||theta_0 - theta*||) and ``lipschitz`` are known for synthetic problems. ``xp``
    is the array module of the data (and of the arrays ``value_and_grad`` takes).
    """

    name: str
    model: Sequential
    params: np.ndarray
    input_shape: tuple[int, ...]
    source: Source
    sink: Sink
    frozen: frozenset[str] = frozenset()
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    f_star: float | None = None
    radius: float | None = None
    lipschitz: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    xp: ModuleType = np

    def trainable_mask(self) -> np.ndarray:
        """True on the coordinates of the flat vector that belong to trainable layers."""
        mask = np.zeros(self.model.layout.size, dtype=bool)
        offset = 0
        for layer in self.model.layers:
            n = sum(int(np.prod(shape)) for _, shape in layer.param_shapes())
            mask[offset:offset + n] = layer.name not in self.frozen
            offset += n
        return mask

    def value_and_grad(self, params: Array, grad: Array) -> float:
        """Serial reference: f(params) on one process, its full gradient written to ``grad``."""
        self.model.bind(params, grad)
        loss, dout = self.sink(0, self.model.forward(self.source(0)))
        self.model.backward(dout)
        return float(loss)

    def value(self, params: Array) -> float:
        return self.value_and_grad(params, np.zeros_like(params))


@dataclass
class StageSetup:
    """This rank's part of a pipeline run."""

    pipeline: Pipeline
    x0: Array          # the trainable block (a copy; the optimizer updates it in place)
    box: Box | None


def setup_stage(problem: StagedProblem, comm: Comm, plan: StagePlan | None = None,
                kind: str = "1f1b", label: str = "pipeline", dtype: Any = np.float64) -> StageSetup:
    """Cut ``problem`` into comm.size stages (balanced by parameter count unless ``plan``) and
    build this rank's stage on ``comm.backend`` (the problem's ``xp``). HpcoptError before any
    communication when the sizes disagree."""
    plan = plan or StagePlan.balanced(problem.model, comm.size)
    backend = comm.backend
    mine = problem.params[plan.param_slice(problem.model, comm.rank)]
    block = backend.xp.array(mine, dtype=dtype)
    pipeline = Pipeline(problem.model, plan, block, comm, problem.input_shape,
                        source=problem.source, sink=problem.sink, frozen=problem.frozen,
                        kind=kind, label=label)
    trainable = pipeline.global_trainable
    box = None
    if problem.lower is not None or problem.upper is not None:
        size = problem.params.size
        lower = problem.lower if problem.lower is not None else np.full(size, -np.inf)
        upper = problem.upper if problem.upper is not None else np.full(size, np.inf)
        box = Box(backend.asarray(lower[trainable], dtype), backend.asarray(upper[trainable], dtype))
    return StageSetup(pipeline, block[pipeline.trainable].copy(), box)
