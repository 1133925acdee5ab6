"""A ``torch.nn.Module`` whose state lives in hpcopt's flat vectors, shared without copies.

Rules (docs/torch.md):

* Trained parameters (``requires_grad=True``) are views of the flat vector ``bind`` gets (the
  algorithm's ``state.x``): the algorithm's update writes the module, an averaging round is one
  in-place allreduce of the module. ``layout`` names them with the module's parameter names
  (state_dict keys; a tied parameter once, by its first name).
* Gradients: ``backward`` lets autograd make fresh gradient tensors and copies each into the
  flat gradient vector (``state.grad``) as soon as autograd has made it (a post-accumulate-grad
  hook), while it is still in cache, then frees it, so that the next one reuses its memory;
  every ``.grad`` is left a view of the flat vector. (Accumulating into the flat vector in
  place instead needs a zeroing and an add per step: measured slower.)
* Frozen parameters (``requires_grad=False``) are not in that vector: no step, weight decay or
  average ever touches them. They are views of a flat vector of their own, ``frozen``, which
  ``build_torch_run`` broadcasts once from rank 0; a checkpoint does not hold them (building
  the module again, with the same seed, gives them back).
* Persistent floating-point buffers (batch-norm running statistics) are views of the flat
  vector ``bind_buffers`` gets (``state.buffers``), which follows ``buffer_policy``.
* Persistent integer and bool buffers (``num_batches_tracked``) stay in the module, per rank,
  never averaged; ``counters``/``load_counters`` carry them through a checkpoint exactly.
* Non-persistent buffers stay in the module, untouched.
* On the CPU, glibc's malloc keeps freed memory for the next step (``keep_freed_memory``).

Every parameter must have one dtype, float32 or float64, and be initialized (a lazy layer's
after a first forward); anything else is a ValueError.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from ..backend import CPU, Backend
from ..errors import HpcoptError
from ..flat import ParamLayout
from .allocator import keep_freed_memory
from .arrays import DTYPES, as_tensor, device_of, numpy_dtype, torch_dtype

Array = Any
Named = list[tuple[str, torch.Tensor]]

#: An integer value n travels in a float vector as (n // SPLIT, n % SPLIT): both parts are
#: exact in float32 for |n| < 2**48.
SPLIT = 1 << 24


class TorchModel:
    """``module`` (moved to ``backend``'s device and, if given, converted to ``dtype``) with
    its trained parameters, gradients and floating-point buffers bound to flat vectors."""

    def __init__(self, module: torch.nn.Module, dtype: Any = None, backend: Backend = CPU) -> None:
        params: Named = list(module.named_parameters())
        own = _parameter_dtype(params)
        target = torch_dtype(dtype) if dtype is not None else own or torch.float32
        module.to(device=device_of(backend), dtype=target)  # casts floating tensors only
        if not backend.is_gpu:
            keep_freed_memory()
        self.module, self.backend, self.dtype = module, backend, numpy_dtype(target)
        self._trained: Named = [(n, p) for n, p in params if p.requires_grad]
        frozen: Named = [(n, p) for n, p in params if not p.requires_grad]
        buffers = _persistent_buffers(module)
        self._float_buffers: Named = [(n, b) for n, b in buffers if b.is_floating_point()]
        self._counters: Named = [(n, b) for n, b in buffers if not b.is_floating_point()]
        self.layout = _layout(self._trained)
        self.buffer_layout = _layout(self._float_buffers)
        self.frozen_layout = _layout(frozen)
        #: The frozen parameters' own flat vector (their values, bound).
        self.frozen: Array = self._gather(frozen, self.frozen_layout)
        _point(frozen, self.frozen)
        self.buffers: Array | None = None
        # the arrays last bound, held so that their ids cannot be reused meanwhile
        self._params: Array | None = None
        self._grads: Array | None = None
        self._grad_views: list[torch.Tensor] = []
        # while ``backward`` runs: which trained parameters' gradients were taken (else None)
        self._taken: list[bool] | None = None
        for index, (_, p) in enumerate(self._trained):
            p.register_post_accumulate_grad_hook(self._take_gradient(index))

    def parameters_vector(self) -> Array:
        """A new flat vector of ``layout`` holding the trained parameters' current values."""
        return self._gather(self._trained, self.layout)

    def buffers_vector(self) -> Array | None:
        """A new flat vector of the floating-point buffers' current values; None without any."""
        return self._gather(self._float_buffers, self.buffer_layout) if self._float_buffers else None

    def bind(self, params: Array, grads: Array | None = None) -> None:
        """Make the trained parameters views of ``params`` and their gradients views of
        ``grads`` (when given). Arrays already bound (the same objects) cost nothing."""
        if params is not self._params:
            _point(self._trained, _checked(params, self.dtype))
            self._params = params
        if grads is not None and grads is not self._grads:
            self._grad_views = _views(_checked(grads, self.dtype), self.layout)
            for (_, p), view in zip(self._trained, self._grad_views):
                p.grad = view
            self._grads = grads

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, its gradient written into the bound gradient vector (zero for
        parameters the loss does not depend on)."""
        for _, p in self._trained:
            p.grad = None
        self._taken = [False] * len(self._grad_views)
        try:
            loss.backward()
        finally:
            taken, self._taken = self._taken, None
        for (_, p), view, done in zip(self._trained, self._grad_views, taken):
            if not done:
                view.zero_()
                p.grad = view

    def _take_gradient(self, index: int) -> Any:
        """The hook of trained parameter ``index``: inside ``backward``, its fresh gradient
        copied into its view of the flat gradient, which becomes its ``.grad``."""
        owner = weakref.ref(self)  # the module's hooks do not keep this model alive

        def hook(parameter: torch.Tensor) -> None:
            model = owner()
            taken = None if model is None else model._taken
            if model is None or taken is None or index >= len(taken):
                return  # a backward outside ``backward``, or no gradient vector bound
            view, fresh = model._grad_views[index], parameter.grad
            if fresh is not None and fresh is not view:
                view.copy_(fresh)
                parameter.grad = view
            taken[index] = True
        return hook

    def bound(self) -> tuple[Array | None, Array | None]:
        """The (params, grads) arrays last bound."""
        return self._params, self._grads

    def bind_buffers(self, buffers: Array) -> None:
        """Make the floating-point buffers views of ``buffers``; training forwards (batch-norm
        running statistics) update it in place."""
        if buffers is not self.buffers:
            _point(self._float_buffers, _checked(buffers, self.dtype))
            self.buffers = buffers

    @property
    def has_counters(self) -> bool:
        """Whether the module has persistent integer or bool buffers."""
        return bool(self._counters)

    def counters(self) -> Array:
        """The integer buffers as one flat vector of the model's dtype, each value n as
        (n // SPLIT, n % SPLIT) so that it is exact (for |n| < 2**48)."""
        values = np.concatenate([b.detach().cpu().reshape(-1).to(torch.int64).numpy()
                                 for _, b in self._counters] or [np.zeros(0, np.int64)])
        high, low = np.divmod(values, SPLIT)
        return self.backend.asarray(np.stack([high, low], axis=1).reshape(-1), self.dtype)

    def load_counters(self, vector: Array) -> None:
        """Put a vector from ``counters`` back (HpcoptError if its size does not fit)."""
        pairs = np.asarray(self.backend.to_host(vector)).reshape(-1)
        sizes = [b.numel() for _, b in self._counters]
        if pairs.size != 2 * sum(sizes):
            raise HpcoptError(f"the checkpoint holds {pairs.size // 2} integer buffer values, "
                              f"this module has {sum(sizes)}")
        values = pairs[0::2].astype(np.int64) * SPLIT + pairs[1::2].astype(np.int64)
        for (_, b), part in zip(self._counters, np.split(values, np.cumsum(sizes)[:-1])):
            b.copy_(torch.from_numpy(part).view(b.shape))

    def _gather(self, named: Named, layout: ParamLayout) -> Array:
        """A new flat vector of ``layout`` on the backend holding the tensors' values."""
        flat = layout.zeros(self.backend, self.dtype)
        with torch.no_grad():
            for (_, t), view in zip(named, _views(flat, layout)):
                view.copy_(t)
        return flat


def _parameter_dtype(params: Named) -> torch.dtype | None:
    """The one dtype of all parameters (None without parameters); ValueError naming the
    offending parameters when they are not all float32 or all float64, or not yet initialized
    (a lazy module's)."""
    lazy = [n for n, p in params if torch.nn.parameter.is_lazy(p)]
    if lazy:
        raise ValueError(f"this module's {', '.join(lazy)} are not initialized yet (a lazy layer): "
                         "run the module once on a batch in its factory")
    odd = [f"{n} ({p.dtype})" for n, p in params if p.dtype not in DTYPES.values()]
    if odd:
        raise ValueError("hpcopt.torch trains float32 or float64 parameters only; this module "
                         f"has {', '.join(odd)}")
    kinds = {p.dtype for _, p in params}
    if len(kinds) > 1:
        listing = ", ".join(f"{n} ({p.dtype})" for n, p in params)
        raise ValueError("every parameter must have the same dtype (one flat vector holds them "
                         f"all); this module mixes {listing}")
    return kinds.pop() if kinds else None


def _persistent_buffers(module: torch.nn.Module) -> Named:
    """The buffers that belong in the module's state_dict, by their state_dict names."""
    found = []
    for name, buffer in module.named_buffers():
        owner, _, leaf = name.rpartition(".")
        if leaf not in module.get_submodule(owner)._non_persistent_buffers_set:
            found.append((name, buffer))
    return found


def _layout(named: Named) -> ParamLayout:
    return ParamLayout.from_items((n, tuple(t.shape)) for n, t in named)


def _checked(flat: Array, dtype: np.dtype) -> Array:
    if flat.dtype != dtype:
        raise ValueError(f"a flat vector of {flat.dtype} for a module of {dtype}")
    return flat


def _views(flat: Array, layout: ParamLayout) -> list[torch.Tensor]:
    """Tensors viewing ``flat``'s slices in layout order (``layout.views`` checks the size)."""
    return [as_tensor(view) for view in layout.views(flat).values()]


def _point(named: Named, flat: Array) -> None:
    """Make each tensor's data a view of its slice of ``flat`` (the tensor objects stay, so
    whatever holds them, e.g. an optimizer or an LSTM's weight list, sees the new memory)."""
    layout = _layout(named)
    for (_, t), view in zip(named, _views(flat, layout)):
        t.data = view
