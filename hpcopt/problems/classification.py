"""Supervised classification: model + softmax cross-entropy + this rank's minibatch sampler."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Backend
from ..comm import Comm
from ..nn import Sequential, softmax_cross_entropy

Array = Any
Augment = Callable[[Array, int, int], Array]  # (batch, epoch, batch index) -> augmented batch


@dataclass
class Evaluation:
    """Metrics of one model on one data set, summed over every rank's part."""

    loss: float
    accuracy: float
    samples: int

    def summary_line(self) -> str:
        """The run summary's first line (a NaN accuracy, e.g. a regression: the loss alone)."""
        if math.isnan(self.accuracy):
            return f"test loss         {self.loss:.6g} ({self.samples} samples)"
        return f"test accuracy     {self.accuracy:.4f} (loss {self.loss:.4f}, {self.samples} samples)"

    def row_fields(self) -> dict[str, float]:
        """The trace row's evaluation columns."""
        return {"eval_loss": self.loss, "eval_accuracy": self.accuracy}

    def final_fields(self) -> dict[str, Any]:
        """The trace summary's attributes of a final evaluation."""
        return {"eval_loss": self.loss, "eval_accuracy": self.accuracy, "eval_samples": self.samples}


class ClassificationProblem:
    """``oracle(params, grads) -> loss``: draws this rank's next minibatch, writes the gradient.

    ``augment`` (e.g. ``hpcopt.data.augment.Augmentation``) transforms each training batch,
    keyed by the sampler's (epoch, batch index) before the draw. Models with running statistics
    must have their buffers bound (``model.bind_buffers``) before the first call.
    """

    def __init__(self, model: Sequential, features: Array, labels: Array, sampler: Any,
                 backend: Backend, augment: Augment | None = None) -> None:
        self.model, self.sampler, self.backend = model, sampler, backend
        self.features, self.labels, self.augment = features, labels, augment

    def oracle(self, params: Array, grads: Array) -> Array:
        key = (self.sampler.epoch, self.sampler.position) if self.augment else None
        idx = self.sampler.next_batch_placed(self.backend.asarray)
        self.model.bind(params, grads)
        inputs = self.features[idx]
        if self.augment:
            assert key is not None  # taken above whenever augment is set
            inputs = self.augment(inputs, *key)
        loss, dlogits = softmax_cross_entropy(self.model.forward(inputs), self.labels[idx])
        self.model.backward(dlogits)
        return loss

    def evaluate(self, params: Array, scratch_grads: Array, features: Array, labels: Array,
                 comm: Comm, chunk: int = 1024, buffers: Array | None = None) -> Evaluation:
        """Loss and accuracy of ``params`` on (features, labels), this rank's block of them.

        Each rank evaluates its own contiguous block; one allreduce (label "eval") sums the
        totals. ``features``/``labels`` are the full evaluation set on every rank. Batch norm
        uses its running statistics: ``buffers`` if given (the training buffers are bound
        again afterwards), else the bound ones.
        """
        n = int(labels.shape[0])
        lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
        self.model.bind(params, scratch_grads)
        training_buffers = self.model.buffers
        if buffers is not None:
            self.model.bind_buffers(buffers)
        chunks: list[int] = []
        values: list[Any] = []  # each chunk's loss and correct count, read at once
        for start in range(lo, hi, chunk):
            stop = min(hi, start + chunk)
            logits = self.model.forward(features[start:stop], train=False)
            loss, _ = softmax_cross_entropy(logits, labels[start:stop])
            values += (loss, (logits.argmax(axis=1) == labels[start:stop]).sum())
            chunks.append(stop - start)
        totals = np.zeros(3)
        values = self.backend.floats_to_host(values)
        for count, loss, correct in zip(chunks, values[::2], values[1::2]):
            totals += (loss * count, correct, count)
        if buffers is not None and training_buffers is not None:
            self.model.bind_buffers(training_buffers)
        comm.allreduce_host_(totals, label="eval")
        return Evaluation(loss=totals[0] / totals[2], accuracy=totals[1] / totals[2],
                          samples=int(totals[2]))
