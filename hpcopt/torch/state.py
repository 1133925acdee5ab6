"""A recurrent module's state between windows: tensors nested in tuples and lists (``(h, c)``
for ``nn.LSTM``), detached after each window and carried through a checkpoint as one flat
vector of the model's dtype (exact: the tensors are of that dtype)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import HpcoptError

#: A tensor, or a tuple or list of states.
State = Any


def tensors(state: State) -> list[torch.Tensor]:
    """The tensors of ``state`` in order (depth first); HpcoptError for anything but tensors
    nested in tuples and lists."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, (tuple, list)):
        return [t for part in state for t in tensors(part)]
    raise HpcoptError(f"the state holds {type(state).__name__}: a state is tensors nested in "
                      "tuples and lists, e.g. (h, c)")


def rebuilt(template: State, values: list[torch.Tensor]) -> State:
    """``template``'s nesting with its tensors replaced, in order, by ``values``."""
    found = iter(values)

    def build(part: State) -> State:
        if isinstance(part, torch.Tensor):
            return next(found)
        return type(part)(build(p) for p in part)

    return build(template)


def detached(state: State) -> State:
    """``state`` cut from the graph of the window that made it (truncated BPTT)."""
    return rebuilt(state, [t.detach() for t in tensors(state)])


def describe(state: State) -> str:
    """The nesting, shapes and dtypes, e.g. ``((1, 20, 200) float32, (1, 20, 200) float32)``."""
    if isinstance(state, torch.Tensor):
        return f"{tuple(state.shape)} {str(state.dtype).removeprefix('torch.')}"
    inner = ", ".join(describe(p) for p in state)
    return f"({inner})" if isinstance(state, tuple) else f"[{inner}]"


def as_vector(state: State) -> torch.Tensor:
    """The state's values as one flat tensor (a copy)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors(state)])


def from_vector(template: State, vector: torch.Tensor) -> State:
    """A state of ``template``'s nesting, shapes and dtypes holding ``vector``'s values (as
    ``as_vector`` gave them); HpcoptError if the size does not fit."""
    shapes = [t.shape for t in tensors(template)]
    sizes = [t.numel() for t in tensors(template)]
    if vector.numel() != sum(sizes):
        raise HpcoptError(f"the checkpoint's module state has {vector.numel()} values, this module's "
                          f"state {describe(template)} has {sum(sizes)}")
    parts = torch.split(vector.reshape(-1), sizes)
    like = tensors(template)
    return rebuilt(template, [p.reshape(s).to(t.device, t.dtype).clone()
                              for p, s, t in zip(parts, shapes, like)])
