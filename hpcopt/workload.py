"""The data-parallel problem a run trains: ``Workload``, built from a config (``hpcopt.build``)
or by user code (``hpcopt.torch``, docs/python.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .flat import ParamLayout
from .problems.classification import Evaluation
from .problems.language_model import LMEvaluation

Array = Any
#: What ``Workload.evaluate`` returns; each kind reports its own summary line and trace fields.
ModelEvaluation = Evaluation | LMEvaluation


@dataclass
class Workload:
    """A data-parallel problem: everything ``hpcopt.train`` needs besides the algorithm, built
    identically on every rank except for this rank's data. Built from the config's [data] and
    [model] sections (``hpcopt.build.build_workload``), or by user code (``hpcopt.torch``).

    ``problem.oracle(params, grads) -> loss`` draws this rank's next minibatch and writes the
    gradient; ``problem.sampler`` has ``state()`` and ``restore(state)``, so a checkpoint
    resumes the data order. ``evaluate(params, scratch, comm, buffers=None)`` evaluates a model
    on the test set (collective), so the training loop never needs to know what kind of problem
    it runs.
    """

    layout: ParamLayout      # the parameters' names and shapes in x0 (and in checkpoints)
    problem: Any
    x0: Array                # the initial parameters, one flat vector (the same on every rank)
    evaluate: Callable[..., ModelEvaluation]
    steps_per_epoch: int     # local steps of one pass over this rank's data
    description: str         # the data and model, for the run's header
    unit: str = "steps"      # what the throughput counts: steps, samples, tokens for a corpus
    processed: Callable[[int], int] = lambda steps: steps  # units this rank has processed in k steps
    #: Per-rank state of the problem beyond the sampler that a checkpoint must hold (the LSTM
    #: hidden state): (a flat vector of it, put such a vector back); None for classification.
    carried: tuple[Callable[[], Array], Callable[[Array], None]] | None = None
    #: The model's batch-norm running statistics, initialized and bound (the same on every
    #: rank); the algorithm's state keeps them. None for a model without batch norm.
    buffers: Array | None = None
    language_model: bool = False  # evaluations report perplexity (trace column eval_perplexity)
