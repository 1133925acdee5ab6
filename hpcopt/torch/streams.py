"""A torch language model that carries its state across the windows of contiguous token streams
(truncated BPTT, as AWD-LSTM trains and ``hpcopt.problems.language_model`` does in NumPy).

Rank r's training tokens (``corpus_shard``: ``block``, its contiguous block; ``iid``, a random
share of chunks of consecutive tokens) are cut into ``batch_size`` parallel streams and walked
in order in windows of ``bptt`` tokens (``StreamWindows``). The module's
``forward(tokens, state)`` returns ``(scores, new_state)``; the new state, detached, is the
next window's, and ``None`` (the module's zero state) starts every pass over the rank's
streams, at the rank's own stream position. The state is this rank's ``carried`` vector in a
checkpoint (after the module's integer buffers, if any), so a resumed run continues bit for bit.
Evaluation walks each rank's contiguous block of the evaluation tokens in
``min(batch_size, EVAL_STREAMS)`` streams, carrying the state from a zero one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..comm import Comm
from ..data.bptt import BpttSampler, corpus_shard, rank_streams, streams_of
from ..errors import HpcoptError
from ..problems.language_model import LMEvaluation
from ..workload import Workload
from .adapter import TorchModel
from .arrays import as_array, device_of
from .check import check_trainable
from .problem import Loss, TorchProblem
from .state import State, as_vector, detached, from_vector

Array = Any

#: Streams an evaluation walks at most (as ``--model lstm``'s test split).
EVAL_STREAMS = 10


class StreamWindows(BpttSampler):
    """A ``BpttSampler`` over this rank's (L, B) stream tensor serving (B, T) windows; its state
    has ``MinibatchSampler``'s keys (a checkpoint stores it alike), ``shard_size`` being the
    windows of one pass. ``starts_pass``: whether the window last served began a pass."""

    def __init__(self, streams: torch.Tensor, bptt: int, seed: int, rank: int) -> None:
        super().__init__(streams, bptt, rank)
        self.seed = seed
        self.starts_pass = False

    @property
    def sampler(self) -> StreamWindows:
        return self

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.starts_pass = self.position == 0
        inputs, targets = self.next_window()
        return inputs.t(), targets.t()

    def tokens(self, steps: int) -> int:
        """Training tokens of the first ``steps`` windows (the last of a pass is shorter)."""
        per_pass = self.streams.shape[0] - 1
        passes, rest = divmod(steps, self.windows_per_epoch)
        return self.batch_size * (passes * per_pass + min(rest * self.bptt, per_pass))

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "batch_size": self.batch_size,
                "shard_size": self.windows_per_epoch, "seed": self.seed, "rank": self.rank}

    def restore(self, state: dict) -> None:
        """Continue from ``state()``; HpcoptError if it is malformed or from other settings."""
        expected = self.state()
        if set(state) != set(expected):
            raise HpcoptError(f"sampler state has keys {sorted(state)}, expected {sorted(expected)}")
        for key in ("batch_size", "shard_size", "seed", "rank"):
            if state[key] != expected[key]:
                raise HpcoptError(f"sampler state was saved with {key} {state[key]}, but this run "
                                  f"has {key} {expected[key]} (shard_size: windows per pass)")
        epoch, position = state["epoch"], state["position"]
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in (epoch, position)):
            raise HpcoptError(f"sampler state epoch and position must be integers, got {epoch!r}, "
                              f"{position!r}")
        if epoch < 0 or not 0 <= position < self.windows_per_epoch:
            raise HpcoptError(f"sampler state (epoch {epoch}, position {position}) is outside "
                              f"0..{self.windows_per_epoch - 1}")
        self.epoch, self.position = int(epoch), int(position)


class StreamProblem(TorchProblem):
    """``TorchProblem`` on ``StreamWindows``, carrying the module's state from window to window.

    ``state`` is the state after the last window (detached), ``template`` one of its nesting,
    shapes and dtypes (from ``check_trainable``)."""

    def __init__(self, model: TorchModel, loss: Loss, batches: StreamWindows, template: State) -> None:
        super().__init__(model, loss, batches)
        self.windows, self.template = batches, template
        self.state: State | None = None

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        outputs, state = self.model.module(inputs, None if self.windows.starts_pass else self.state)
        self.state = detached(state)
        return outputs

    def carried(self) -> Array:
        """The module's integer buffers (if any) and its state (zeros before the first window)
        as one vector of the model's dtype."""
        state = as_vector(self.template if self.state is None else self.state)
        if self.state is None:
            state.zero_()
        parts = [self.model.counters()] if self.model.has_counters else []
        xp = self.model.backend.xp
        return xp.concatenate([*parts, as_array(state, self.model.backend)])

    def load_carried(self, vector: Array) -> None:
        """Put a vector from ``carried`` back (HpcoptError if its size does not fit)."""
        values = torch.from_numpy(np.array(self.model.backend.to_host(vector)).reshape(-1))
        counted = self.model.counters().size if self.model.has_counters else 0
        state = from_vector(self.template, values[counted:])
        if self.model.has_counters:
            self.model.load_counters(values[:counted].numpy())
        self.state = state

    def evaluate_streams(self, params: Array, streams: torch.Tensor, bptt: int, comm: Comm,
                         buffers: Array | None = None) -> LMEvaluation:
        """Mean next-token loss of ``params`` on this rank's (L, B) evaluation ``streams`` in
        windows of ``bptt``, the state carried from a zero one; one allreduce (label "eval")
        sums (loss x tokens, tokens) over the ranks."""
        windows = BpttSampler(streams, bptt)
        total = torch.zeros((), dtype=torch.float64, device=streams.device)
        count, state = 0, None
        with self.evaluating(params, buffers):
            for _ in range(windows.windows_per_epoch):
                inputs, targets = windows.next_window()
                outputs, state = self.model.module(inputs.t(), state)
                total += self.loss(outputs, targets.t()).double() * targets.numel()
                count += targets.numel()
        totals = np.array([total.item(), count], dtype=np.float64)
        comm.allreduce_host_(totals, label="eval")
        return lm_evaluation(totals[0] / totals[1], int(totals[1]))


def lm_evaluation(loss: float, tokens: int) -> LMEvaluation:
    """A mean next-token loss over ``tokens`` and its perplexity."""
    return LMEvaluation(loss=loss, perplexity=math.exp(min(loss, 700.0)), tokens=tokens)


def eval_streams(problem: StreamProblem, tokens: Any, comm: Comm) -> torch.Tensor:
    """This rank's contiguous block of ``tokens`` in ``min(batch size, EVAL_STREAMS)`` streams,
    on the model's device."""
    count = min(problem.windows.batch_size, EVAL_STREAMS)
    block = rank_streams(np.asarray(tokens).reshape(-1), count, comm.rank, comm.size)
    return torch.from_numpy(block).to(device_of(problem.model.backend))


def stream_workload(model: TorchModel, loss: Loss, train: Any, valid: Any, comm: Comm, *, bptt: int,
                    batch_size: int, seed: int, partition: str) -> Workload:
    """This rank's workload for a module that carries its state (``model`` from
    ``prepared_model``), on the streams of its share of ``train``, evaluated on ``valid``.
    HpcoptError if the module does not follow the convention (``check_trainable``), the
    partition is not ``iid`` or ``block``, or a rank's share is too small for its streams."""
    if partition not in ("iid", "block"):
        raise HpcoptError(f"a language model that carries its state trains on contiguous streams "
                          f"dealt iid or block, not {partition}")
    tokens = np.asarray(train).reshape(-1)

    def streams(rank: int) -> np.ndarray:
        shard = corpus_shard(tokens, np.zeros(1, dtype=np.int64), partition, rank, comm.size, seed)
        return streams_of(shard, batch_size, rank, comm.size)

    device = device_of(model.backend)
    windows = StreamWindows(torch.from_numpy(streams(comm.rank)).to(device), bptt, seed, comm.rank)
    # an epoch is a pass over the shortest rank's streams, so every rank counts the same steps
    shortest = min(streams(r).shape[0] for r in range(comm.size))
    probe = StreamWindows(windows.streams, bptt, seed, comm.rank)
    first_x, first_y = probe.next_batch()
    template = check_trainable(model, loss, first_x, first_y, stateful=True)
    problem = StreamProblem(model, loss, windows, template)
    valid_streams = eval_streams(problem, valid, comm)

    def evaluate(params: Array, scratch: Array, c: Any, buffers: Array | None = None) -> LMEvaluation:
        return problem.evaluate_streams(params, valid_streams, bptt, c, buffers)

    description = (f"torch {type(model.module).__name__}, {batch_size} streams of "
                   f"{windows.streams.shape[0]:,} tokens per rank (partition {partition}), windows of "
                   f"{bptt} tokens, state carried")
    return Workload(model.layout, problem, model.bound()[0], evaluate, -(-(shortest - 1) // bptt),
                    description, "tokens", windows.tokens,
                    carried=(problem.carried, problem.load_carried), buffers=model.buffers,
                    language_model=True)
