"""A torch language model on a token stream (a corpus split) as a ``hpcopt.Workload``.

The training tokens are cut into non-overlapping windows of ``bptt`` tokens (inputs
``tokens[i*bptt : (i+1)*bptt]``, targets one token later), the windows are a ``TensorData`` set
dealt to the ranks by ``partition`` (``iid`` or ``block``) and drawn in random minibatches by
hpcopt's sampler, so a resumed run draws the same windows (bitwise resume). Every window starts
from the module's zero state: the first tokens of a window see no context.

A module that carries its state (``forward(tokens, state) -> (scores, new_state)``, detected
by ``returns_state``) trains instead on contiguous streams with the state carried from window
to window (``hpcopt.torch.streams``: truncated BPTT, as AWD-LSTM trains).

Evaluation is the mean next-token cross-entropy over the windows of the evaluation split, in
eval mode, reported as ``LMEvaluation`` (perplexity = exp(loss)); the trace gets an
``eval_perplexity`` column. ``evaluate_tokens`` evaluates a model on another split (the test
split after training on the valid one).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from ..backend import CPU, Backend
from ..comm import Comm
from ..problems.language_model import LMEvaluation
from ..workload import Workload
from .arrays import device_of, torch_dtype
from .build import ModuleOrFactory, prepared_model, torch_workload
from .check import returns_state
from .data import TensorData, as_tensor, to_device
from .streams import StreamProblem, eval_streams, lm_evaluation, stream_workload

Array = Any


def windows(tokens: Any, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each (n, bptt) int64 with n = (len(tokens) - 1) // bptt: window i is
    ``tokens[i*bptt : (i+1)*bptt]`` and its next tokens; the tail shorter than a window is dropped."""
    if bptt < 1:
        raise ValueError(f"bptt must be at least 1, got {bptt}")
    stream = as_tensor(np.asarray(tokens)).reshape(-1).to(torch.int64)
    n = (stream.numel() - 1) // bptt
    if n < 1:
        raise ValueError(f"{stream.numel()} tokens make no window of {bptt} (and its targets)")
    return (stream[:n * bptt].reshape(n, bptt).clone(),
            stream[1:n * bptt + 1].reshape(n, bptt).clone())


def sequence_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position: (batch, time, vocab) scores, (batch, time) ids."""
    return torch.nn.functional.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))


def language_workload(module: ModuleOrFactory, train: Any, valid: Any, comm: Comm, *,
                      bptt: int = 35, batch_size: int, seed: int = 0, dtype: Any = None,
                      backend: Backend = CPU, partition: str = "iid",
                      eval_chunk: int = 256) -> Workload:
    """This rank's workload for ``hpcopt.train``: ``module`` (a module or a factory of one,
    mapping (batch, time) token ids to (batch, time, vocab) scores) trained on the windows of
    the ``train`` token ids, ``batch_size`` windows per rank and step, evaluated on the windows
    of ``valid``. Throughput counts tokens. See ``torch_workload`` for the rest.

    A module whose forward returns (scores, state) carries its state: it trains on
    ``batch_size`` contiguous streams of this rank's share of ``train`` and is evaluated on
    streams of ``valid`` (``stream_workload``); ``eval_chunk`` is then unused."""
    inputs, targets = windows(train, bptt)
    model = prepared_model(module, comm, seed, dtype, backend)
    probe = to_device(inputs[:batch_size], device_of(backend), torch_dtype(model.dtype))
    if returns_state(model, probe):
        return stream_workload(model, sequence_loss, train, valid, comm, bptt=bptt,
                               batch_size=batch_size, seed=seed, partition=partition)
    workload = torch_workload(model, sequence_loss, TensorData(inputs, targets), comm,
                              batch_size=batch_size, seed=seed, dtype=dtype, backend=backend,
                              partition=partition, test=windows(valid, bptt), eval_chunk=eval_chunk)
    per_window = workload.evaluate

    def evaluate(params: Array, scratch: Array, c: Any, buffers: Array | None = None) -> LMEvaluation:
        return _perplexity(per_window(params, scratch, c, buffers), bptt)

    description = workload.description.replace(
        f"{inputs.shape[0]} samples", f"{inputs.shape[0]:,} windows of {bptt} tokens")
    return dataclasses.replace(workload, evaluate=evaluate, unit="tokens", language_model=True,
                               processed=lambda steps: steps * batch_size * bptt,
                               description=description)


def evaluate_tokens(workload: Workload, params: Array, tokens: Any, comm: Comm, *, bptt: int = 35,
                    chunk: int = 256) -> LMEvaluation:
    """``params`` (this rank's model vector, e.g. the averaged model at the end of a run)
    evaluated on the windows of ``tokens`` (collective: every rank evaluates its block); a
    module that carries its state on streams of ``tokens`` instead, the state carried."""
    problem = workload.problem
    if isinstance(problem, StreamProblem):
        return problem.evaluate_streams(params, eval_streams(problem, tokens, comm), bptt, comm)
    model = problem.model
    device, tdtype = device_of(model.backend), torch_dtype(model.dtype)
    inputs, targets = (to_device(t, device, tdtype) for t in windows(tokens, bptt))
    return _perplexity(problem.evaluate(params, params, inputs, targets, comm, chunk=chunk), bptt)


def _perplexity(evaluation: Any, bptt: int) -> LMEvaluation:
    return lm_evaluation(evaluation.loss, evaluation.samples * bptt)
