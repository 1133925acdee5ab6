"""Before the first step: whether a module can train on the data at all.

One forward and backward pass on one batch shows it, so a module that cannot train (nothing to
train, a first layer that does not take the data, outputs that do not fit the classes or the
loss, a forward that returns no tensor) is refused while the workload is built, with one line
that names the batch's shape, rather than with a traceback from every rank at the first step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..errors import HpcoptError
from .adapter import TorchModel
from .problem import Loss

#: How much of an exception's message a refusal quotes.
QUOTED = 300


def check_trainable(model: TorchModel, loss: Loss, inputs: torch.Tensor, targets: torch.Tensor,
                    classes: int | None = None) -> None:
    """HpcoptError unless ``model`` has trained parameters, its module maps the batch
    ``inputs`` (on the model's device) to a tensor (with ``classes``: of (batch, classes)
    scores), and ``loss`` of that against ``targets`` is one number whose gradient reaches the
    trained parameters. The module runs once in train mode; its persistent buffers and torch's
    random generators are as they were on return, and no ``.grad`` is touched."""
    if not model.layout.size:
        frozen = model.frozen_layout.size
        raise HpcoptError("the module has no parameters to train" +
                          (f": all {frozen:,} are frozen (requires_grad=False)" if frozen else ""))
    batch = f"a batch of inputs {_describe(inputs)}"
    with _state_kept(model, inputs.device), torch.enable_grad():
        try:
            outputs = model.module(inputs)
        except Exception as exc:  # noqa: BLE001 - whatever the user's forward raises
            raise HpcoptError(f"the module cannot take {batch}: {_quote(exc)}") from None
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
        return "return a tensor, e.g. the scores alone (forward(x) returning model(x)[0])"
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
