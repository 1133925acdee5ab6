"""Supervised classification: model + softmax cross-entropy + this rank's minibatch sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Backend
from ..comm import Comm
from ..nn import Sequential, softmax_cross_entropy

Array = Any


@dataclass
class Evaluation:
    """Metrics of one model on one data set, summed over every rank's part."""

    loss: float
    accuracy: float
    samples: int


class ClassificationProblem:
    """``oracle(params, grads) -> loss``: draws this rank's next minibatch, writes the gradient."""

    def __init__(self, model: Sequential, features: Array, labels: Array, sampler: Any,
                 backend: Backend) -> None:
        self.model, self.sampler, self.backend = model, sampler, backend
        self.features, self.labels = features, labels

    def oracle(self, params: Array, grads: Array) -> Array:
        idx = self.backend.asarray(self.sampler.next_batch())
        self.model.bind(params, grads)
        loss, dlogits = softmax_cross_entropy(self.model.forward(self.features[idx]), self.labels[idx])
        self.model.backward(dlogits)
        return loss

    def evaluate(self, params: Array, scratch_grads: Array, features: Array, labels: Array,
                 comm: Comm, chunk: int = 1024) -> Evaluation:
        """Loss and accuracy of ``params`` on (features, labels), this rank's block of them.

        Each rank evaluates its own contiguous block; one allreduce (label "eval") sums the
        totals. ``features``/``labels`` are the full evaluation set on every rank.
        """
        n = int(labels.shape[0])
        lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
        self.model.bind(params, scratch_grads)
        totals = np.zeros(3)
        for start in range(lo, hi, chunk):
            stop = min(hi, start + chunk)
            logits = self.model.forward(features[start:stop], train=False)
            loss, _ = softmax_cross_entropy(logits, labels[start:stop])
            correct = (logits.argmax(axis=1) == labels[start:stop]).sum()
            totals += (float(loss) * (stop - start), float(correct), stop - start)
        comm.allreduce_host_(totals, label="eval")
        return Evaluation(loss=totals[0] / totals[2], accuracy=totals[1] / totals[2],
                          samples=int(totals[2]))
