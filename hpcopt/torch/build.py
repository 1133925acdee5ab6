"""From a torch module, a loss and data to the problem side of a run (the fields of
``hpcopt.build.RunParts`` that describe the model and its data)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..backend import CPU, Backend
from ..data.partition import partition_indices
from ..data.sampler import MinibatchSampler
from ..errors import HpcoptError
from ..problems.classification import Evaluation
from .adapter import TorchModel
from .arrays import device_of, torch_dtype
from .data import BatchFactory, IteratorSampler, ShardBatches, TensorData, to_device
from .problem import Loss, TorchProblem

Array = Any
ModuleOrFactory = torch.nn.Module | Callable[[], torch.nn.Module]


@dataclass
class TorchRun:
    """The problem side of a run; each field has the name and meaning of its
    ``hpcopt.build.RunParts`` field (``model.layout`` names the checkpoint's model)."""

    model: TorchModel
    problem: TorchProblem
    x0: Array                 # the trained parameters; the module's parameters are views of it
    evaluate: Callable[..., Evaluation]  # (params, scratch, comm, buffers=None), collective
    description: str
    unit: str
    processed: Callable[[int], int]
    #: The integer buffers (num_batches_tracked): (a flat vector of them, put one back).
    carried: tuple[Callable[[], Array], Callable[[Array], None]] | None
    #: The floating-point buffers (batch-norm statistics), bound, the same on every rank.
    buffers: Array | None
    #: Training samples of the whole set (``TensorData``), for steps-per-epoch; None for a factory.
    train_samples: int | None


def build_torch_run(module: ModuleOrFactory, loss: Loss, data: TensorData | BatchFactory, comm: Any,
                    *, batch_size: int, seed: int = 0, dtype: Any = None, backend: Backend = CPU,
                    partition: str = "iid", alpha: float | None = None,
                    similarity: float | None = None, test: tuple[Any, Any] | None = None,
                    eval_chunk: int = 1024) -> TorchRun:
    """Everything about the model and the data a data-parallel run needs, on this rank.

    ``module`` is a module or a factory of one, called with torch's generator seeded from
    ``seed`` (the caller's generator state is kept). ``dtype`` (float32 or float64) converts
    the module; None keeps its own. ``data`` is a ``TensorData`` (sharded by ``partition``,
    drawn by ``MinibatchSampler``: bitwise resume) or a ``BatchFactory`` (see
    ``hpcopt.torch.data``). ``test`` (inputs, targets) is the evaluation set; without it a
    ``TensorData`` run evaluates on its whole training set, a factory run must give one.

    Collective when ``comm.size > 1``: the frozen parameters and the floating-point buffers
    are broadcast from rank 0 (label "init"), as the algorithm's ``init`` does with x0.
    """
    model = TorchModel(_instantiate(module, seed), dtype, backend)
    device, tdtype = device_of(backend), torch_dtype(model.dtype)
    x0 = model.parameters_vector()
    model.bind(x0)
    buffers = model.buffers_vector()
    if buffers is not None:
        model.bind_buffers(buffers)
    if comm.size > 1:
        for constants in (model.frozen, buffers):
            if constants is not None and constants.size:
                comm.bcast_(constants, root=0, label="init")
    batches: ShardBatches | IteratorSampler
    if isinstance(data, TensorData):
        inputs, targets = torch.as_tensor(data.inputs), torch.as_tensor(data.targets)
        labels = targets.cpu().numpy() if targets.ndim == 1 and not targets.is_floating_point() else None
        shard = torch.from_numpy(partition_indices(partition, int(targets.shape[0]), comm.rank, comm.size,
                                                   seed, labels=labels, alpha=alpha,
                                                   similarity=similarity))
        sampler = MinibatchSampler(np.arange(shard.numel()), batch_size, seed, comm.rank)
        batches = ShardBatches(to_device(inputs[shard], device, tdtype),
                               to_device(targets[shard], device, tdtype), sampler)
        train_samples: int | None = int(targets.shape[0])
        source = f"{train_samples} samples, partition {partition}"
        if test is None:
            test = (inputs, targets)
    else:
        if test is None:
            raise HpcoptError("a run on a batch factory needs a test set to evaluate on (test=...)")
        batches = IteratorSampler(data, batch_size, seed, comm.rank, comm.size, device, tdtype)
        train_samples, source = None, f"batches of {getattr(data, '__name__', type(data).__name__)}"
    test_x, test_y = (to_device(t, device, tdtype) for t in test)
    problem = TorchProblem(model, loss, batches)

    def evaluate(params: Array, scratch: Array, c: Any, buffers: Array | None = None) -> Evaluation:
        return problem.evaluate(params, scratch, test_x, test_y, c, chunk=eval_chunk, buffers=buffers)

    frozen = f", {model.frozen_layout.size:,} frozen" if model.frozen_layout.size else ""
    description = (f"torch {type(model.module).__name__} ({model.layout.size:,} trained parameters"
                   f"{frozen}, {model.dtype}), {source}")
    carried = (model.counters, model.load_counters) if model.has_counters else None
    return TorchRun(model, problem, x0, evaluate, description, "samples",
                    lambda steps: steps * batch_size, carried, buffers, train_samples)


def _instantiate(module: ModuleOrFactory, seed: int) -> torch.nn.Module:
    """``module`` itself, or what the factory returns with torch's generator seeded."""
    if isinstance(module, torch.nn.Module):
        return module
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        built = module()
    if not isinstance(built, torch.nn.Module):
        raise HpcoptError(f"the model factory returned {type(built).__name__}, not a torch.nn.Module")
    return built
