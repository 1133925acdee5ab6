"""From a torch module, a loss and data to a ``hpcopt.Workload`` (``torch_workload``); from the
command line's ``--model torch:package.module:factory``: ``hpcopt.torch.from_config``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..backend import CPU, Backend
from ..data.partition import partition_indices
from ..data.sampler import MinibatchSampler
from ..errors import HpcoptError
from ..problems.classification import Evaluation
from ..workload import Workload
from .adapter import TorchModel
from .arrays import device_of, torch_dtype
from .check import check_trainable
from .data import BatchFactory, IteratorSampler, ShardBatches, TensorData, as_tensor, to_device
from .problem import Loss, TorchProblem

Array = Any
ModuleOrFactory = torch.nn.Module | Callable[[], torch.nn.Module]


def torch_workload(module: ModuleOrFactory | TorchModel, loss: Loss, data: TensorData | BatchFactory,
                   comm: Any, *, batch_size: int, seed: int = 0, dtype: Any = None, backend: Backend = CPU,
                   partition: str = "iid", alpha: float | None = None,
                   similarity: float | None = None, test: tuple[Any, Any] | None = None,
                   eval_chunk: int = 1024, classes: int | None = None) -> Workload:
    """This rank's workload for ``hpcopt.train``: the module's trained parameters are ``x0``
    (its parameters are views of it), its gradient oracle, sampler and evaluation. The torch
    module is ``workload.problem.model.module``.

    ``module`` is a module or a factory of one, called with torch's generator seeded from
    ``seed`` (the caller's generator state is kept), or a ``TorchModel`` from
    ``prepared_model``, used as it is. ``dtype`` (float32 or float64) converts
    the module; None keeps its own. ``data`` is a ``TensorData`` (sharded by ``partition``,
    drawn by ``MinibatchSampler``: bitwise resume) or a ``BatchFactory`` (see
    ``hpcopt.torch.data``). ``test`` (inputs, targets) is the evaluation set; without it a
    ``TensorData`` run evaluates on its whole training set, a factory run must give one.

    Before it returns, the module runs once (forward and backward, ``check_trainable``) on the
    first ``batch_size`` training samples (a factory run: test samples); HpcoptError if it
    cannot train on them: no trained parameter, a batch it cannot take, an output that is no
    tensor or (``classes`` given) not (batch, classes) scores, or a loss without a gradient.
    HpcoptError too for parameters ``TorchModel`` refuses.

    A factory builds the same module on every rank. A module built by the caller may differ
    between ranks, so then (collective, when ``comm.size > 1``) its frozen parameters and
    floating-point buffers are broadcast from rank 0 (label "init"), as the algorithm's
    ``init`` does with x0.
    """
    model = module if isinstance(module, TorchModel) else prepared_model(module, comm, seed, dtype, backend)
    device, tdtype = device_of(backend), torch_dtype(model.dtype)
    x0, buffers = model.bound()[0], model.buffers
    batches: ShardBatches | IteratorSampler
    if isinstance(data, TensorData):
        inputs, targets = as_tensor(data.inputs), as_tensor(data.targets)
        labels = targets.cpu().numpy() if targets.ndim == 1 and not targets.is_floating_point() else None
        shard = torch.from_numpy(partition_indices(partition, int(targets.shape[0]), comm.rank, comm.size,
                                                   seed, labels=labels, alpha=alpha,
                                                   similarity=similarity))
        sampler = MinibatchSampler(np.arange(shard.numel()), batch_size, seed, comm.rank)
        batches = ShardBatches(to_device(inputs[shard], device, tdtype),
                               to_device(targets[shard], device, tdtype), sampler)
        train_samples = int(targets.shape[0])
        source = f"{train_samples} samples, partition {partition}"
        first = (inputs, targets)
        if test is None:
            test = first
    else:
        if test is None:
            raise HpcoptError("a run on a batch factory needs a test set to evaluate on (test=...)")
        batches = IteratorSampler(data, batch_size, seed, comm.rank, comm.size, device, tdtype)
        train_samples, source = 0, f"batches of {getattr(data, '__name__', type(data).__name__)}"
        first = test
    test_x, test_y = (to_device(t, device, tdtype) for t in test)
    problem = TorchProblem(model, loss, batches)
    first_x, first_y = (to_device(t[:batch_size], device, tdtype) for t in first)
    check_trainable(model, loss, first_x, first_y, classes)

    def evaluate(params: Array, scratch: Array, c: Any, buffers: Array | None = None) -> Evaluation:
        return problem.evaluate(params, scratch, test_x, test_y, c, chunk=eval_chunk, buffers=buffers)

    # the run's header adds the trained parameters' count and dtype
    description = f"{model_description(model)}, {source}"
    carried = (model.counters, model.load_counters) if model.has_counters else None
    per_epoch = (train_samples // comm.size) // batch_size if train_samples else 0
    return Workload(model.layout, problem, x0, evaluate, per_epoch, description, "samples",
                    lambda steps: steps * batch_size, carried=carried, buffers=buffers)


def model_description(model: TorchModel) -> str:
    """The module's class, and its frozen parameters' count if any, for the run's header."""
    frozen = f" ({model.frozen_layout.size:,} frozen parameters)" if model.frozen_layout.size else ""
    return f"torch {type(model.module).__name__}{frozen}"


def prepared_model(module: ModuleOrFactory, comm: Any, seed: int = 0, dtype: Any = None,
                   backend: Backend = CPU) -> TorchModel:
    """The module (built by the factory with torch's generator seeded from ``seed``) as a
    ``TorchModel`` bound to its initial parameters and floating-point buffers, the same on every
    rank (see ``torch_workload``); HpcoptError for parameters ``TorchModel`` refuses."""
    built = _instantiate(module, seed)
    try:
        model = TorchModel(built, dtype, backend)
    except ValueError as exc:  # parameters or a dtype it cannot train
        raise HpcoptError(str(exc)) from None
    model.bind(model.parameters_vector())
    buffers = model.buffers_vector()
    if buffers is not None:
        model.bind_buffers(buffers)
    if comm.size > 1 and isinstance(module, torch.nn.Module):
        for constants in (model.frozen, buffers):
            if constants is not None and constants.size:
                comm.bcast_(constants, root=0, label="init")
    return model


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
