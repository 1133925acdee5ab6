"""From the command line's ``--model torch:package.module:factory`` on the config's data set to
a ``hpcopt.Workload`` (``config_workload``): an image data set through ``torch_workload``
(``hpcopt.torch.build``), a text corpus through ``language_workload`` (``hpcopt.torch.text``)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..backend import Backend
from ..config import TEXT_CORPORA, Config
from ..data.datasets import as_images, load_dataset
from ..data.text import load_corpus
from ..errors import HpcoptError
from ..workload import Workload
from .build import model_description, torch_workload
from .data import TensorData
from .text import language_workload


def config_workload(config: Config, comm: Any, backend: Backend) -> Workload:
    """``--model torch:package.module:factory`` on the config's data set. An image data set:
    ``factory()``, NCHW float images in [0, 1] and integer labels, cross-entropy loss, sharded
    by ``partition``. A text corpus: ``factory(vocab_size)``, a language model mapping (batch,
    time) token ids to (batch, time, vocab) scores, on windows of ``bptt`` training tokens
    (``language_workload``), evaluated on the test split in perplexity. A module that cannot
    train on it (``torch_workload``) is an HpcoptError naming the spec and the data set."""
    data, spec = config.data, config.model.model
    factory = load_factory(spec)
    if data.dataset in TEXT_CORPORA:
        return _language_config_workload(config, comm, backend, factory)
    dataset = load_dataset(data.dataset, data.path or None, data.test_fraction, config.run.seed)
    images = as_images(dataset.x_train, dataset.image_shape)
    try:
        workload = torch_workload(factory, torch.nn.CrossEntropyLoss(), TensorData(images, dataset.y_train),
                              comm, batch_size=data.batch_size, seed=config.run.seed,
                              dtype=config.run.dtype, backend=backend, partition=data.partition,
                              alpha=data.alpha, similarity=data.similarity,
                              test=(as_images(dataset.x_test, dataset.image_shape), dataset.y_test),
                              classes=dataset.num_classes)
    except HpcoptError as exc:
        shape = "x".join(map(str, images.shape[1:]))
        raise HpcoptError(f"--model {spec} on {data.dataset} ({shape} images, {dataset.num_classes} "
                          f"classes): {exc}") from None
    # the header names the data set as it does for the built-in models (hpcopt.build)
    partition = "" if data.partition == "iid" else f", partition {data.partition}"
    description = (f"{data.dataset} ({len(dataset.y_train)} train / {len(dataset.y_test)} test{partition}), "
                   f"{model_description(workload.problem.model)}, batch {data.batch_size}/rank")
    return dataclasses.replace(workload, description=description)


def _language_config_workload(config: Config, comm: Any, backend: Backend,
                              factory: Callable[..., torch.nn.Module]) -> Workload:
    """``factory(vocab_size)`` on the config's text corpus (see ``config_workload``)."""
    data, spec = config.data, config.model.model
    if data.partition not in ("iid", "block"):
        raise HpcoptError(f"--model {spec} on {data.dataset}: a torch language model's windows are "
                          f"sharded iid or block, not {data.partition}")
    corpus = load_corpus(data.dataset, data.path or None, train_fraction=data.corpus_fraction)
    try:
        inspect.signature(factory).bind(corpus.vocab_size)
    except TypeError as exc:
        raise HpcoptError(f"--model {spec} on {data.dataset}: on a text corpus the factory takes the "
                          f"vocabulary size as its one argument ({exc})") from None
    except ValueError:  # no signature to read (a builtin): the call itself says what is wrong
        pass
    try:
        workload = language_workload(lambda: factory(corpus.vocab_size), corpus.train, corpus.test, comm,
                                     bptt=data.bptt, batch_size=data.batch_size, seed=config.run.seed,
                                     dtype=config.run.dtype, backend=backend, partition=data.partition)
    except HpcoptError as exc:
        raise HpcoptError(f"--model {spec} on {data.dataset} ({corpus.vocab_size:,}-token vocabulary, "
                          f"windows of {data.bptt}): {exc}") from None
    return dataclasses.replace(workload, description=f"{data.dataset} (vocabulary {corpus.vocab_size:,}), "
                                                     f"{workload.description}")


def load_factory(spec: str) -> Callable[[], torch.nn.Module]:
    """The function ``torch:package.module:function`` names, imported (HpcoptError if not)."""
    _, module_name, function = spec.split(":")
    try:
        found = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as exc:
        raise HpcoptError(f"--model {spec}: cannot import {function} from {module_name}: {exc}") from None
    if not callable(found):
        raise HpcoptError(f"--model {spec}: {module_name}.{function} is not callable")
    return found
