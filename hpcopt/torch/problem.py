"""A torch module + loss + this rank's batches as an hpcopt problem (the interface of
``hpcopt.problems.classification.ClassificationProblem``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from ..comm import Comm
from ..problems.classification import Evaluation
from .adapter import TorchModel
from .arrays import as_array, device_of
from .data import Batches

Array = Any
#: ``loss(outputs, targets)``: the mean loss of a batch as a 0-d tensor (e.g. nn.CrossEntropyLoss()).
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TorchProblem:
    """``oracle(params, grads) -> loss``: draws this rank's next batch, writes the gradient of
    the batch's mean loss at ``params`` into ``grads`` (``TorchModel.backward``).

    The module trains in train mode (batch norm normalizes by the batch and updates the bound
    running statistics); ``evaluate`` switches to eval mode and back. Before each batch the
    device's default generator is seeded from (seed, rank, epoch, position) of the sampler, so
    random layers (dropout) draw the same on a resumed run as on the uninterrupted one.
    """

    def __init__(self, model: TorchModel, loss: Loss, batches: Batches) -> None:
        self.model, self.loss, self.batches = model, loss, batches
        self.sampler = batches.sampler
        device = device_of(model.backend)
        self._generator = (torch.cuda.default_generators[device.index] if device.type == "cuda"
                           else torch.default_generator)
        model.module.train()

    def oracle(self, params: Array, grads: Array) -> Array:
        self.model.bind(params, grads)
        s = self.sampler
        self._generator.manual_seed(_mix(s.seed, s.rank, s.epoch, s.position))
        inputs, targets = self.batches.next_batch()
        loss = self.loss(self._forward(inputs), targets)
        self.model.backward(loss)
        return as_array(loss.detach(), self.model.backend)

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The module's outputs on a training batch (a stateful problem carries its state here)."""
        return self.model.module(inputs)

    def evaluate(self, params: Array, scratch_grads: Array, inputs: torch.Tensor,
                 targets: torch.Tensor, comm: Comm, chunk: int = 1024,
                 buffers: Array | None = None) -> Evaluation:
        """Mean loss and accuracy of ``params`` on (inputs, targets), this rank's block of them.

        Every rank holds the whole set and evaluates its contiguous block in eval mode; one
        allreduce (label "eval") sums the totals. Accuracy (argmax of 2-d outputs against
        integer targets) is nan for any other kind of output. Batch norm uses ``buffers`` if
        given, else the bound statistics. The module is bound to what it was bound to before
        on return. ``scratch_grads`` is unused (no gradient is taken); it keeps the signature
        of the other problems.
        """
        n = int(targets.shape[0])
        lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
        loss_sum = torch.zeros((), dtype=torch.float64, device=inputs.device)
        correct = torch.zeros((), dtype=torch.float64, device=inputs.device)
        with self.evaluating(params, buffers):
            for start in range(lo, hi, chunk):
                stop = min(hi, start + chunk)
                outputs, labels = self.model.module(inputs[start:stop]), targets[start:stop]
                loss_sum += self.loss(outputs, labels).double() * (stop - start)
                correct += _correct(outputs, labels)
        totals = np.array([loss_sum.item(), correct.item(), hi - lo], dtype=np.float64)
        comm.allreduce_host_(totals, label="eval")
        return Evaluation(loss=totals[0] / totals[2], accuracy=totals[1] / totals[2],
                          samples=int(totals[2]))

    @contextmanager
    def evaluating(self, params: Array, buffers: Array | None = None) -> Iterator[None]:
        """The module bound to ``params`` (and ``buffers``, if given) in eval mode, without
        gradients; bound back to what it was bound to, in train mode, on leaving."""
        model, module = self.model, self.model.module
        (trained, _), training_buffers = model.bound(), model.buffers
        model.bind(params)
        if buffers is not None:
            model.bind_buffers(buffers)
        module.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            module.train()
            if trained is not None:
                model.bind(trained)
            if buffers is not None and training_buffers is not None:
                model.bind_buffers(training_buffers)


def _correct(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | float:
    """How many rows of ``outputs`` have their largest value at the label; nan unless the
    outputs are (batch, classes) scores and the labels integers."""
    if outputs.ndim != 2 or labels.ndim != 1 or labels.is_floating_point():
        return math.nan
    return (outputs.argmax(dim=1) == labels).sum()


def _mix(*keys: int) -> int:
    """A 63-bit seed from non-negative integers (a fixed formula: the same on every Python)."""
    value = 0
    for key in keys:
        value = (value * 1_000_003 + key) % (1 << 63)
    return value
