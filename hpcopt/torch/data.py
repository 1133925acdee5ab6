"""Where one rank's training batches come from, and where its sampler state lives.

Two sources, one interface (``next_batch() -> (inputs, targets)`` on the model's device, and
``sampler`` with ``state()``/``restore()`` for checkpoints):

* ``ShardBatches``: this rank's shard of a ``TensorData`` set, drawn by hpcopt's
  ``MinibatchSampler`` (reshuffled per epoch from the seed). A resumed run draws exactly the
  batches the uninterrupted run would have: bitwise resume.
* ``IteratorSampler``: the user's ``BatchFactory``, called once per epoch. A resumed run calls
  it again for the saved epoch and skips the batches already served, so resume is bitwise only
  when the factory is a pure function of its arguments (e.g. a DataLoader with a generator
  seeded from ``seed`` and ``epoch``) and cheap to skip through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from ..data.sampler import MinibatchSampler
from ..errors import HpcoptError

Batch = tuple[Any, Any]
#: ``factory(rank=, size=, seed=, epoch=)``: this rank's (inputs, targets) batches of one epoch.
BatchFactory = Callable[..., Iterable[Batch]]


class Batches(Protocol):
    """Where a ``TorchProblem``'s batches come from: ``ShardBatches``, ``IteratorSampler``,
    ``hpcopt.torch.streams.StreamWindows``."""

    @property
    def sampler(self) -> Any: ...

    def next_batch(self) -> Batch: ...


@dataclass
class TensorData:
    """A training set every rank holds in full (tensors or arrays, samples along the first
    axis); ``build_torch_run`` gives each rank its shard of it."""

    inputs: Any
    targets: Any


def as_tensor(value: Any) -> torch.Tensor:
    """``value`` as a tensor, sharing its memory; a read-only NumPy array (hpcopt's data sets
    are locked) is copied, since torch has no read-only tensors."""
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        value = value.copy()
    return torch.as_tensor(value)


def to_device(value: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as a tensor on ``device``; floating-point values in ``dtype``, others as they are."""
    tensor = as_tensor(value)
    return tensor.to(device, dtype if tensor.is_floating_point() else None)


class ShardBatches:
    """Minibatches of this rank's shard (tensors on the model's device) in the sampler's order."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, sampler: MinibatchSampler) -> None:
        if inputs.shape[0] != targets.shape[0]:
            raise HpcoptError(f"{inputs.shape[0]} inputs but {targets.shape[0]} targets")
        self.inputs, self.targets, self.sampler = inputs, targets, sampler
        device = inputs.device
        self._place: Callable[[np.ndarray], torch.Tensor] = lambda order: torch.from_numpy(order).to(device)

    def next_batch(self) -> Batch:
        index = self.sampler.next_batch_placed(self._place)
        return self.inputs[index], self.targets[index]


class IteratorSampler:
    """Batches from ``factory``, one epoch after another; ``position`` counts the batches of
    the current epoch already served. Its state has the keys of ``MinibatchSampler``'s (so a
    checkpoint stores it alike), with ``shard_size`` 0: unknown."""

    def __init__(self, factory: BatchFactory, batch_size: int, seed: int, rank: int, size: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.factory, self.batch_size, self.seed, self.rank, self.size = factory, batch_size, seed, rank, size
        self.device, self.dtype = device, dtype
        self.epoch = 0
        self.position = 0
        self._batches: Iterator[Batch] | None = None

    @property
    def sampler(self) -> IteratorSampler:
        return self

    def next_batch(self) -> Batch:
        batch = next(self._current(), None)
        if batch is None:  # the epoch is over
            if self.position == 0:
                raise HpcoptError(f"the batch factory gave rank {self.rank} no batch in epoch {self.epoch}")
            self.epoch, self.position, self._batches = self.epoch + 1, 0, None
            batch = next(self._current(), None)
            if batch is None:
                raise HpcoptError(f"the batch factory gave rank {self.rank} no batch in epoch {self.epoch}")
        self.position += 1
        inputs, targets = batch
        return to_device(inputs, self.device, self.dtype), to_device(targets, self.device, self.dtype)

    def _current(self) -> Iterator[Batch]:
        """The epoch's iterator, made (and moved past ``position`` batches) on first use."""
        if self._batches is None:
            batches = iter(self.factory(rank=self.rank, size=self.size, seed=self.seed, epoch=self.epoch))
            for served in range(self.position):
                if next(batches, None) is None:
                    raise HpcoptError(f"cannot resume at batch {self.position} of epoch {self.epoch}: "
                                      f"the batch factory gives rank {self.rank} only {served}")
            self._batches = batches
        return self._batches

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "batch_size": self.batch_size,
                "shard_size": 0, "seed": self.seed, "rank": self.rank}

    def restore(self, state: dict) -> None:
        """Continue from ``state`` (from ``state()``); HpcoptError if it was saved by a sampler
        with another batch size, seed or rank, or is out of range."""
        expected = self.state()
        if set(state) != set(expected):
            raise HpcoptError(f"sampler state has keys {sorted(state)}, expected {sorted(expected)}")
        for key in ("batch_size", "shard_size", "seed", "rank"):
            if state[key] != expected[key]:
                raise HpcoptError(f"sampler state was saved with {key} {state[key]}, "
                                  f"but this run has {key} {expected[key]}")
        if state["epoch"] < 0 or state["position"] < 0:
            raise HpcoptError(f"sampler state epoch and position must be non-negative, got {state}")
        self.epoch, self.position, self._batches = int(state["epoch"]), int(state["position"]), None
