"""From a Config to the parts of a run: backend, data shard, model, problem (a ``Workload``),
algorithm."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import rng
from .algorithms.base import DataParallelAlgorithm
from .algorithms.registration import create
from .backend import Backend, get_backend
from .comm import Comm
from .config import CONV_MODELS, Config
from .data.augment import Augmentation
from .data.bptt import BpttSampler, corpus_shard, rank_streams, streams_of
from .data.datasets import Dataset, as_images, load_dataset
from .data.partition import partition_indices
from .data.sampler import MinibatchSampler
from .data.text import load_corpus
from .errors import HpcoptError
from .flat import ParamLayout
from .nn import Sequential, mlp
from .nn.language_model import LSTMLanguageModel
from .nn.models import plain_cnn, resnet
from .problems.classification import ClassificationProblem, Evaluation
from .problems.language_model import LanguageModelProblem
from .workload import Workload

Array = Any


@dataclass
class RunParts:
    """A workload with the algorithm that trains it and the run's length."""

    config: Config
    backend: Backend
    workload: Workload
    algorithm: DataParallelAlgorithm
    total_steps: int         # T, the nominal number of local steps
    local_steps: int         # steps this rank runs (differs from T only with local_steps)


def build_run(config: Config, comm: Comm, workload: Workload | None = None) -> RunParts:
    """The algorithm for ``workload`` (default: the one the config describes) and the run's
    length (``steps``, else ``epochs`` passes over a rank's data); raises HpcoptError for
    anything the user must fix (on any rank)."""
    backend = get_backend(config.run.device)
    if workload is None:
        workload = build_workload(config, comm, backend)
    elif not isinstance(workload.x0, backend.xp.ndarray):
        raise HpcoptError(f"the workload's parameters are {type(workload.x0).__name__}, but device "
                          f"{config.run.device} needs {backend.xp.__name__} arrays")
    if not config.run.steps and workload.steps_per_epoch < 1:
        raise HpcoptError(f"{workload.description}: its epoch length is unknown "
                          "(steps_per_epoch 0): give the number of steps (--steps)")
    total_steps = config.run.steps or max(1, math.ceil(config.run.epochs * workload.steps_per_epoch))
    algorithm = build_algorithm(config, comm.size, total_steps, workload.layout)
    local_steps = algorithm.steps_for(total_steps, comm.rank, comm.size)
    return RunParts(config, backend, workload, algorithm, total_steps, local_steps)


def build_workload(config: Config, comm: Comm, backend: Backend) -> Workload:
    """The data set (this rank's shard) and the model the config describes."""
    if config.model.torch:  # imports torch: only for --model torch:...
        try:
            from .torch import config_workload
        except ImportError as exc:
            raise HpcoptError(f"--model {config.model.model}: {exc}") from None
        return config_workload(config, comm, backend)
    if config.language_model:
        return _language_model_workload(config, comm, backend)
    return _classification_workload(config, comm, backend)


def _classification_workload(config: Config, comm: Comm, backend: Backend) -> Workload:
    """An image data set, sharded by ``partition``, and a classifier."""
    dtype = np.dtype(config.run.dtype)
    dataset = load_dataset(config.data.dataset, config.data.path or None,
                           config.data.test_fraction, config.run.seed)
    shard = _shard(config, dataset, comm)
    n_train = dataset.x_train.shape[0]
    batch = config.data.batch_size
    per_epoch = _steps_per_epoch(config, n_train, comm.size)
    conv = config.model.model in CONV_MODELS
    n_test = dataset.x_test.shape[0]
    if conv:  # NCHW images
        features = as_images(dataset.x_train[shard], dataset.image_shape)
        test_features = as_images(dataset.x_test, dataset.image_shape)
        model = build_model(config, features.shape[1], dataset.num_classes,
                            (features.shape[2], features.shape[3]))
    else:
        features = dataset.x_train[shard].reshape(shard.size, -1)
        test_features = dataset.x_test.reshape(n_test, -1)
        model = build_model(config, features.shape[1], dataset.num_classes)
    buffers = None
    if model.buffer_layout.size:
        buffers = model.buffer_layout.zeros(backend, dtype)
        model.init_buffers(buffers)
        model.bind_buffers(buffers)
    sampler = MinibatchSampler(np.arange(shard.size), batch, config.run.seed, comm.rank)
    augment = Augmentation(config.run.seed, comm.rank) if config.data.augment else None
    problem = ClassificationProblem(model, backend.asarray(features, dtype),
                                    backend.asarray(dataset.y_train[shard]), sampler, backend,
                                    augment=augment)
    test_x = backend.asarray(test_features, dtype)
    test_y = backend.asarray(dataset.y_test)
    chunk = batch if conv else 1024  # conv nets: reuse the training batch's scratch arrays

    def evaluate(params: Array, scratch: Array, c: Comm, buffers: Array | None = None) -> Evaluation:
        return problem.evaluate(params, scratch, test_x, test_y, c, chunk=chunk, buffers=buffers)

    partition = "" if config.data.partition == "iid" else f", partition {config.data.partition}"
    description = (f"{config.data.dataset} ({n_train} train / {n_test} test{partition}), "
                   f"{_describe_model(config, features.shape[1:], dataset.num_classes)}"
                   f"{', augmented' if augment else ''}, batch {batch}/rank")
    return Workload(model.layout, problem, _initial(config, model, backend), evaluate, per_epoch,
                    description, "samples", lambda steps: steps * batch, buffers=buffers)


def _describe_model(config: Config, sample_shape: tuple[int, ...], classes: int) -> str:
    """The network in a few words, for the run's header."""
    cfg = config.model
    if cfg.model == "resnet":
        return f"resnet-{cfg.depth} width {cfg.width} on {'x'.join(map(str, sample_shape))}"
    if cfg.model == "plain_cnn":
        return (f"plain_cnn {'-'.join(map(str, cfg.channels))}{' batch-norm' if cfg.batch_norm else ''}"
                f" on {'x'.join(map(str, sample_shape))}")
    return "mlp " + "-".join(str(s) for s in (sample_shape[0], *cfg.hidden, classes))


def _language_model_workload(config: Config, comm: Comm, backend: Backend) -> Workload:
    """A text corpus: rank r trains on its share of the training tokens under ``partition``
    (``corpus_shard``), in ``batch_size`` parallel streams and windows of ``bptt`` tokens; the
    test split is evaluated in contiguous blocks (each rank its block, from a zero state)."""
    dtype = np.dtype(config.run.dtype)
    data, cfg = config.data, config.model
    corpus = load_corpus(data.dataset, data.path or None, train_fraction=data.corpus_fraction)

    def shard(rank: int) -> np.ndarray:
        return corpus_shard(corpus.train, np.asarray(corpus.documents), data.partition, rank,
                            comm.size, config.run.seed, alpha=data.alpha, similarity=data.similarity)

    # T from the shortest shard (every rank computes all shards: partitions are deterministic),
    # so every rank runs the same T and a too-small corpus fails on every rank alike
    shortest = min(range(comm.size), key=lambda r: shard(r).size)
    length = streams_of(shard(shortest), data.batch_size, shortest, comm.size).shape[0]
    windows = -(-(length - 1) // data.bptt)
    streams = streams_of(shard(comm.rank), data.batch_size, comm.rank, comm.size)
    sampler = BpttSampler(backend.asarray(streams), data.bptt, comm.rank)
    hidden = cfg.hidden[0]
    model = LSTMLanguageModel(corpus.vocab_size, cfg.embed or hidden, hidden, len(cfg.hidden), cfg.tie)
    problem = LanguageModelProblem(model, sampler, backend, dtype)
    test_streams = backend.asarray(rank_streams(corpus.test, min(data.batch_size, 10), comm.rank,
                                                comm.size))
    description = (f"{data.dataset} ({corpus.train.size:,} train / {corpus.test.size:,} test "
                   f"tokens, vocabulary {corpus.vocab_size}), lstm {cfg.embed or hidden}-"
                   f"{'x'.join(str(h) for h in cfg.hidden)}{' tied' if cfg.tie else ''}, bptt {data.bptt}, "
                   f"batch {data.batch_size}/rank")

    def tokens(steps: int) -> int:  # the last window of a pass over the streams is shorter
        per_pass = sampler.streams.shape[0] - 1
        passes, rest = divmod(steps, sampler.windows_per_epoch)
        return data.batch_size * (passes * per_pass + min(rest * data.bptt, per_pass))

    return Workload(model.layout, problem, _initial(config, model, backend),
                    lambda params, scratch, c: problem.evaluate(params, scratch, test_streams,
                                                                data.bptt, c),
                    windows, description, "tokens", tokens,
                    carried=(lambda: _hidden_vector(problem), lambda v: _load_hidden(problem, v)),
                    language_model=True)


def _hidden_vector(problem: LanguageModelProblem) -> Array:
    """The LSTM hidden state (h, c of every layer) as one flat vector."""
    xp = problem.backend.xp
    return xp.concatenate([a.reshape(-1) for state in problem.hidden for a in state])


def _load_hidden(problem: LanguageModelProblem, vector: Array) -> None:
    """Put ``_hidden_vector``'s result back (HpcoptError if its size does not fit)."""
    shapes = [a.shape for state in problem.hidden for a in state]
    if vector.size != sum(math.prod(s) for s in shapes):
        raise HpcoptError(f"the checkpoint's LSTM hidden state has {vector.size} values, "
                          f"this model needs {sum(math.prod(s) for s in shapes)}")
    arrays, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        arrays.append(problem.backend.asarray(vector[start:start + size].reshape(shape), problem.dtype))
        start += size
    problem.hidden = [(arrays[i], arrays[i + 1]) for i in range(0, len(arrays), 2)]


def _initial(config: Config, model: Sequential | LSTMLanguageModel, backend: Backend) -> Array:
    """The initial parameters: the model's initialization drawn from the run's seed."""
    x0_host = np.zeros(model.layout.size)
    model.init(x0_host, rng.stream(config.run.seed, "init"))
    return backend.asarray(x0_host, np.dtype(config.run.dtype))


def _shard(config: Config, dataset: Dataset, comm: Comm) -> np.ndarray:
    """This rank's training-sample indices under the configured partition."""
    data = config.data
    return partition_indices(data.partition, dataset.x_train.shape[0], comm.rank, comm.size,
                             config.run.seed, labels=dataset.y_train, alpha=data.alpha,
                             similarity=data.similarity)


def build_model(config: Config, inputs: int, classes: int,
                image_size: tuple[int, int] | None = None) -> Sequential:
    """The network ``config.model.model`` names: the MLP (``inputs`` features), or a conv net
    (``inputs`` channels of ``image_size`` images)."""
    cfg = config.model
    try:
        if cfg.model == "resnet":
            return resnet(cfg.depth, inputs, classes, cfg.width)
        if cfg.model == "plain_cnn":
            assert image_size is not None
            return plain_cnn(inputs, image_size, classes, cfg.channels,
                             batch_norm=cfg.batch_norm)
    except ValueError as exc:  # e.g. images too small for the poolings
        raise HpcoptError(f"{cfg.model} on {config.data.dataset}: {exc}") from None
    return mlp(inputs, cfg.hidden, classes, cfg.activation)


def build_algorithm(config: Config, size: int, total_steps: int,
                    layout: ParamLayout | None = None) -> DataParallelAlgorithm:
    """The algorithm ``config.algorithm.algorithm`` names, with its options and the run's
    context (world size and length for the step-size schedule, the seed, the sizes of the
    ``layout``'s parameters for streaming fragments and their shapes for Muon)."""
    algo = config.algorithm
    shapes = tuple(shape for _, shape in layout.entries) if layout is not None else ()
    return create(algo.algorithm, dataclasses.asdict(algo),
                  {"workers": size, "total_steps": total_steps, "seed": config.run.seed,
                   "parameter_sizes": tuple(map(math.prod, shapes)), "parameter_shapes": shapes})


def _steps_per_epoch(config: Config, n_train: int, workers: int) -> int:
    """Local steps of one pass of the N ranks together over the training set."""
    batch_size = config.data.batch_size
    per_epoch = (n_train // workers) // batch_size
    if per_epoch < 1 and not config.run.steps:
        raise HpcoptError(f"batch size {batch_size} is larger than a shard "
                          f"({n_train // workers} samples per rank with {workers} ranks)")
    return per_epoch
