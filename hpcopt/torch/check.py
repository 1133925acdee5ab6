"""Before the first step: whether a module can train on the data at all.

One forward and backward pass on one batch shows it, so a module that cannot train (nothing to
train, a first layer that does not take the data, outputs that do not fit the classes or the
loss, a forward that returns no tensor) is refused while the workload is built, with one line
that names the batch's shape, rather than with a traceback from every rank at the first step.

A language model may carry its state from one window to the next: ``forward(tokens, state)``
returns ``(scores, new_state)``, ``state=None`` meaning its zero state (the convention of
``nn.LSTM``); ``returns_state`` tells the two kinds apart, ``check_trainable(stateful=True)``
checks the second.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..errors import HpcoptError
from .adapter import TorchModel
from .arrays import device_of, torch_dtype
from .problem import Loss
from .state import State, describe, detached, tensors

#: How much of an exception's message a refusal quotes.
QUOTED = 300


def returns_state(model: TorchModel, inputs: torch.Tensor) -> bool:
    """Whether the module's forward on ``inputs`` returns a pair (a tensor, anything): the
    carried-state convention. Runs it once without a gradient; changes nothing (as
    ``check_trainable``). False when forward fails: ``check_trainable`` then says why."""
    with _state_kept(model, inputs.device), torch.no_grad():
        try:
            outputs = model.module(inputs)
        except Exception:  # noqa: BLE001 - check_trainable quotes it
            return False
    return _is_pair(outputs)


def _is_pair(outputs: Any) -> bool:
    """Whether ``outputs`` is (a tensor, anything): what a stateful forward returns."""
    return isinstance(outputs, (tuple, list)) and len(outputs) == 2 and isinstance(outputs[0], torch.Tensor)


def check_trainable(model: TorchModel, loss: Loss, inputs: torch.Tensor, targets: torch.Tensor,
                    classes: int | None = None, stateful: bool = False) -> State | None:
    """HpcoptError unless ``model`` has trained parameters, its module maps the batch
    ``inputs`` (on the model's device) to a tensor (with ``classes``: of (batch, classes)
    scores), and ``loss`` of that against ``targets`` is one number whose gradient reaches the
    trained parameters. The module runs once in train mode; its persistent buffers and torch's
    random generators are as they were on return, and no ``.grad`` is touched.

    ``stateful``: the module must instead return (scores, state) from ``forward(inputs)``, the
    state tensors of the model's dtype nested in tuples and lists, and take that state back:
    ``forward(inputs, state)`` returns scores and a state of the same nesting, shapes and
    dtypes; the loss is checked on those scores. Returns that state, detached (None when not
    ``stateful``)."""
    if not model.layout.size:
        frozen = model.frozen_layout.size
        raise HpcoptError("the module has no parameters to train" +
                          (f": all {frozen:,} are frozen (requires_grad=False)" if frozen else ""))
    batch = f"a batch of inputs {_describe(inputs)}"
    state = None
    with _state_kept(model, inputs.device), torch.enable_grad():
        try:
            outputs = model.module(inputs)
        except Exception as exc:  # noqa: BLE001 - whatever the user's forward raises
            raise HpcoptError(f"the module cannot take {batch}: {_quote(exc)}") from None
        if stateful:
            state = _checked_state(model, outputs, batch)
            try:
                outputs = model.module(inputs, state)
            except Exception as exc:  # noqa: BLE001 - whatever the user's forward raises
                raise HpcoptError(f"the module cannot take its own state back, forward(tokens, state) "
                                  f"on {batch} and the state {describe(state)}: {_quote(exc)}") from None
            again = _checked_state(model, outputs, batch)
            if describe(again) != describe(state):
                raise HpcoptError(f"forward(tokens, state) on {batch} returns the state {describe(again)}, "
                                  f"but forward(tokens) returned {describe(state)}: the state must keep "
                                  "its nesting, shapes and dtypes from window to window")
            outputs = outputs[0]
        if not isinstance(outputs, torch.Tensor):
            raise HpcoptError(f"the module's forward returns {type(outputs).__name__}, not a tensor, "
                              f"on {batch}: {_tensor_hint(outputs)}")
        expected = (inputs.shape[0], classes)
        if classes is not None and tuple(outputs.shape) != expected:
            raise HpcoptError(f"the module maps {batch} to outputs {_describe(outputs)}, but the data "
                              f"has {classes} classes: its last layer must give {classes} scores per "
                              f"sample, outputs {expected}")
        against = f"its outputs {_describe(outputs)} on {batch} against targets {_describe(targets)}"
        try:
            value = loss(outputs, targets)
        except Exception as exc:  # noqa: BLE001 - whatever the loss raises
            raise HpcoptError(f"the loss fails on {against}: {_quote(exc)}") from None
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.is_floating_point():
            raise HpcoptError(f"the loss of {against} is {_value_kind(value)}, not one number "
                              "(a 0-d floating-point tensor, e.g. the batch's mean loss)")
        if not value.requires_grad:
            raise HpcoptError(f"the loss of {against} does not depend on the trained parameters "
                              "(does forward detach its outputs or run under torch.no_grad?)")
        trained = [p for p in model.module.parameters() if p.requires_grad]
        try:
            torch.autograd.grad(value.reshape(()), trained, allow_unused=True)
        except Exception as exc:  # noqa: BLE001 - whatever backward raises
            raise HpcoptError(f"the gradient of the loss of {against} fails: {_quote(exc)}") from None
    return state


def _checked_state(model: TorchModel, outputs: Any, batch: str) -> State:
    """The state of a stateful forward's ``outputs`` (scores, state), detached; HpcoptError
    unless it is that pair with a state of tensors of the model's dtype and device."""
    if not _is_pair(outputs):
        raise HpcoptError(f"the module's forward returns {type(outputs).__name__} on {batch}, not "
                          "(scores, state): a module that carries its state returns that pair")
    state = detached(outputs[1])  # HpcoptError unless tensors nested in tuples and lists
    kinds = {(t.dtype, t.device) for t in tensors(state)}
    wanted = (torch_dtype(model.dtype), device_of(model.backend))
    if not tensors(state) or kinds != {wanted}:
        raise HpcoptError(f"the module's state {describe(state)} on {batch} must be tensors of the model's "
                          f"dtype {model.dtype} on its device {wanted[1]} (a checkpoint holds them exactly)")
    return state


def _describe(tensor: torch.Tensor) -> str:
    """A tensor's shape and dtype, e.g. ``(8, 1, 28, 28) float32``."""
    return f"{tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"


@contextmanager
def _state_kept(model: TorchModel, device: torch.device) -> Iterator[None]:
    """Put back the floating-point buffers (batch-norm statistics) and integer buffers a
    training forward updates, and torch's random generators, on leaving."""
    bound = model.buffers
    buffers = None if bound is None else bound.copy()
    counters = model.counters() if model.has_counters else None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            yield
        finally:
            if bound is not None:
                bound[...] = buffers
            if counters is not None:
                model.load_counters(counters)


def _tensor_hint(outputs: Any) -> str:
    """How to make a forward that returns ``outputs`` return a tensor."""
    if hasattr(outputs, "logits"):  # a Hugging Face ModelOutput, or the like
        return "return a tensor, e.g. `.logits` (forward(x) returning model(x).logits)"
    if isinstance(outputs, (tuple, list)):
        return ("return a tensor, e.g. the scores alone (forward(x) returning model(x)[0]); a "
                "language model may return (scores, state) to carry its state (docs/torch.md)")
    return "return a tensor of scores"


def _value_kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor {_describe(value)}"
    return type(value).__name__


def _quote(exc: BaseException) -> str:
    """``exc``'s type and message on one line, at most QUOTED characters of the message."""
    text = " ".join(str(exc).split())
    if len(text) > QUOTED:
        text = text[:QUOTED - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
