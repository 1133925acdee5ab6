"""Language modelling: an LSTM LM + this rank's token streams, seen by algorithms as an oracle."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Backend
from ..comm import Comm
from ..data.bptt import BpttSampler
from ..nn.language_model import LSTMLanguageModel
from ..nn.lstm import State

Array = Any


@dataclass
class LMEvaluation:
    """Mean next-token cross-entropy (nats) over all ranks' evaluation tokens, and exp of it."""

    loss: float
    perplexity: float
    tokens: int

    def summary_line(self) -> str:
        """The run summary's first line."""
        return f"test perplexity   {self.perplexity:.3f} (loss {self.loss:.4f}, {self.tokens} tokens)"

    def row_fields(self) -> dict[str, float]:
        """The trace row's evaluation columns (no accuracy: its column stays NaN)."""
        return {"eval_loss": self.loss, "eval_perplexity": self.perplexity}

    def final_fields(self) -> dict[str, Any]:
        """The trace summary's attributes of a final evaluation."""
        return {"eval_loss": self.loss, "eval_perplexity": self.perplexity, "eval_tokens": self.tokens}


class LanguageModelProblem:
    """``oracle(params, grads) -> loss``: the next BPTT window of this rank's streams.

    The hidden state is carried from window to window (detached: truncated BPTT) and reset to
    zeros at the start of every pass over the streams, as AWD-LSTM does per epoch. ``hidden``
    is part of a resumable run's state, next to ``sampler.state()``.
    """

    def __init__(self, model: LSTMLanguageModel, sampler: BpttSampler, backend: Backend,
                 dtype: Any) -> None:
        self.model, self.sampler, self.backend, self.dtype = model, sampler, backend, dtype
        self.hidden: list[State] = self._zero_state(sampler.batch_size)

    def _zero_state(self, batch: int) -> list[State]:
        return self.model.initial_state(batch, self.backend.xp, self.dtype)

    def oracle(self, params: Array, grads: Array) -> Array:
        if self.sampler.position == 0:
            self.hidden = self._zero_state(self.sampler.batch_size)
        inputs, targets = self.sampler.next_window()
        loss, self.hidden = self.model.loss_and_grad(params, grads, inputs, targets, self.hidden)
        return loss

    def evaluate(self, params: Array, scratch_grads: Array, streams: Array, bptt: int,
                 comm: Comm) -> LMEvaluation:
        """Loss and perplexity of ``params`` on this rank's evaluation ``streams`` (L, B).

        Every rank runs its own part from a zero state in windows of ``bptt`` steps; one
        allreduce (label "eval") sums (loss x tokens, tokens) over ranks. The result depends
        slightly on N (each part starts from a zero state), as with any split evaluation.
        """
        sampler = BpttSampler(streams, bptt)
        state = self._zero_state(sampler.batch_size)
        losses, sizes = [], []
        for _ in range(sampler.windows_per_epoch):
            inputs, targets = sampler.next_window()
            loss, state = self.model.loss(params, scratch_grads, inputs, targets, state)
            losses.append(loss)
            sizes.append(targets.size)
        totals = np.zeros(2)
        for loss, size in zip(self.backend.floats_to_host(losses), sizes):
            totals += (loss * size, size)
        comm.allreduce_host_(totals, label="eval")
        mean = totals[0] / totals[1]
        return LMEvaluation(loss=mean, perplexity=math.exp(min(mean, 700.0)),
                            tokens=int(totals[1]))
