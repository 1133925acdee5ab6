"""Run configuration: frozen dataclasses, merged from a TOML file and command-line flags.

A TOML file has one table per section (``[data]``, ``[model]``, ``[algorithm]``, ``[run]``);
every field is also a flag (``batch_size`` -> ``--batch-size``). Flags win over the file, the
file over the defaults. Unknown sections or keys and values of the wrong type are errors.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import typing
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

from .algorithms.base import PIPELINE, MergedOption, merge_options, option, option_fields
from .algorithms.registration import NotRegistered, not_registered, registry, written_by_unknown
from .algorithms.registration import names as algorithm_names
from .algorithms.schedules import BY_RUN_LENGTH
from .algorithms.streaming import streamed
from .backend import DEVICES
from .comm import AVERAGING_MODES
from .comm.progress import PROGRESS_MODES
from .errors import HpcoptError, did_you_mean
from .presets import apply_preset, describe_presets, preset_values

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PIPELINE_PROBLEMS = ("attack", "few_shot", "l1_chain")
TEXT_CORPORA = ("shakespeare", "ptb", "wikitext2")  # data sets for language models
MODELS = ("mlp", "lstm", "resnet", "plain_cnn")
CONV_MODELS = ("resnet", "plain_cnn")  # image models (NCHW input)
DTYPES = ("float32", "float64")
#: hpcopt.run.nonfinite: a NaN/Inf loss or model stops the run, or drops the step
NONFINITE_MODES = ("stop", "skip")
RANK_LOSS_MODES = ("abort", "continue")
#: ``[model]`` keys of one kind of model -> the models they apply to.
MODEL_KEYS = {"hidden": ("mlp", "lstm"), "activation": ("mlp",), "depth": ("resnet",),
              "width": ("resnet",), "channels": ("plain_cnn",), "batch_norm": ("plain_cnn",)}
#: ``[model]`` keys whose default differs by model: key -> {model: its default}; the field's
#: default is the other models' (a value that model refuses, so filling it changes no valid run)
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {"hidden": {"lstm": (200,)}}
#: ``[data]`` keys of one partition -> the partition they apply to.
PARTITION_KEYS = {"alpha": "dirichlet", "similarity": "similarity"}


def applies(config: Config, key: str) -> bool:
    """Whether option ``key`` means something in a run of ``config`` (an algorithm's own option,
    a model's own key, a partition's own parameter); every other option applies everywhere."""
    if key in algorithm_options():
        return config.algorithm.algorithm in algorithm_options()[key].users
    if key in MODEL_KEYS:
        return config.model.model in MODEL_KEYS[key]
    if key in PARTITION_KEYS:
        return config.data.partition == PARTITION_KEYS[key]
    return True


def _refuse_changed(section: Any, key: str, value: str, only: dict[str, tuple[str, ...]]) -> None:
    """HpcoptError for the first option of ``only`` (in its order) changed from its default while
    ``key`` is ``value``, which is not among the values the option applies to."""
    defaults = type(section).__dataclass_fields__
    for name, allowed in only.items():
        if getattr(section, name) != defaults[name].default and value not in allowed:
            raise HpcoptError(f"{name} applies only to --{key} {' or '.join(allowed)}, not {value}")


#: Unicode categories a text option may not hold: control characters, surrogates (undecodable
#: bytes from argv), line and paragraph separators.
REFUSED_CATEGORIES = ("Cc", "Cs", "Zl", "Zp")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = option("mnist5k", "mnist5k | digits | shakespeare | ptb (shipped) | mnist_idx | "
                                     "cifar10 | wikitext2 (read from path)")
    path: str = option("",
                       "mnist_idx, cifar10, wikitext2 (ptb: optional): the directory holding the "
                       "data set's files (mnist_idx: train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                       "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte; docs/formats.md)")
    partition: str = option("iid",
                            "how samples are dealt to ranks: iid | block | dirichlet (alpha) | "
                            "similarity (similarity)")
    alpha: float = option(0.0, "Dirichlet concentration (partition = 'dirichlet'); 0 = unset")
    similarity: float = option(-1.0, "share of i.i.d. samples (partition = 'similarity'); -1 = unset")
    batch_size: int = option(32, "samples per rank and step; token streams per rank for a corpus")
    test_fraction: float = option(0.2, "image data sets: share of the samples held out for testing")
    bptt: int = option(35, "language models: tokens per truncated-BPTT window")
    augment: bool = option(False, "conv models: random crop (zero-pad 4) and horizontal flip")
    corpus_fraction: float = option(1.0, "corpora: train on the first fraction of every document")
    problem: str = option("attack", "pipeline algorithms: attack | few_shot | l1_chain")
    images: int = option(10, "attack: test images perturbed at once")
    eps: float = option(0.1, "attack: l_inf radius of the perturbation")
    shots: int = option(5, "few_shot: training samples per class")

    def __post_init__(self) -> None:
        if self.problem not in PIPELINE_PROBLEMS:
            raise HpcoptError(f"unknown problem {self.problem!r} "
                              f"(choose from {', '.join(PIPELINE_PROBLEMS)})")
        for name in ("images", "shots"):
            if getattr(self, name) < 1:
                raise HpcoptError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise HpcoptError(f"eps must be > 0, got {self.eps}")
        if self.partition == "dirichlet":
            if not (self.alpha > 0 and math.isfinite(self.alpha)):
                raise HpcoptError(f"partition dirichlet needs alpha > 0, got {self.alpha}")
        elif self.alpha != 0.0:
            raise HpcoptError("alpha applies only to --partition dirichlet")
        if self.partition == "similarity":
            if not 0 <= self.similarity <= 1:
                raise HpcoptError(f"partition similarity needs similarity in [0, 1], got {self.similarity}")
        elif self.similarity != -1.0:
            raise HpcoptError("similarity applies only to --partition similarity")
        if self.batch_size < 1:
            raise HpcoptError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 < self.test_fraction < 1:
            raise HpcoptError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.bptt < 1:
            raise HpcoptError(f"bptt must be >= 1, got {self.bptt}")
        if self.dataset in TEXT_CORPORA:
            if not 0 < self.corpus_fraction <= 1:
                raise HpcoptError(f"corpus_fraction must be in (0, 1], got {self.corpus_fraction}")
            if self.test_fraction != 0.2:
                raise HpcoptError(f"test_fraction applies only to image data sets; a corpus "
                                  f"({self.dataset}) has its own test split")
        elif self.corpus_fraction != 1.0:
            raise HpcoptError(f"corpus_fraction applies only to the text corpora ({', '.join(TEXT_CORPORA)})")
        elif self.bptt != 35:
            raise HpcoptError(f"bptt applies only to the text corpora ({', '.join(TEXT_CORPORA)})")


@dataclass(frozen=True)
class ModelConfig:
    model: str = option("mlp", "mlp | resnet | plain_cnn | lstm | torch:MODULE:FUNCTION (your "
                               "torch.nn.Module, from an importable function: called with no argument "
                               "on an image data set, with the vocabulary size on a text corpus; "
                               "docs/torch.md)")
    hidden: tuple[int, ...] = option((512, 256), "mlp: hidden layer sizes; lstm: one equal size per layer")
    activation: str = option("relu", "mlp: relu | tanh")
    embed: int = option(0, "lstm: embedding size; 0 = the hidden size")
    tie: bool = option(False, "lstm: decoder weight = embedding weight")
    depth: int = option(20, "resnet: 6n + 2 layers (8, 14, 20, 32, ...)")
    width: int = option(16, "resnet: channels of the first stage (then 2x, 4x)")
    channels: tuple[int, ...] = option((32, 64), "plain_cnn: channels of each conv -> pool stage")
    batch_norm: bool = option(False, "plain_cnn: batch norm after every convolution")
    stages: tuple[int, ...] = option((),
                                     "pipeline algorithms: cut before these layer indices; () = "
                                     "balanced")

    def __post_init__(self) -> None:
        for key, defaults in MODEL_DEFAULTS.items():
            if self.model in defaults and getattr(self, key) == type(self).__dataclass_fields__[key].default:
                object.__setattr__(self, key, defaults[self.model])
        if any(b < 1 for b in self.stages) or list(self.stages) != sorted(set(self.stages)):
            raise HpcoptError(f"stages must be increasing layer indices >= 1, got {self.stages}")
        if self.torch:
            if len(self.model.split(":")) != 3 or not all(self.model.split(":")[1:]):
                raise HpcoptError(f"--model {self.model}: write torch:package.module:function")
        elif self.model not in MODELS:
            raise HpcoptError(f"unknown model {self.model!r} (choose from {', '.join(MODELS)}, "
                              "or torch:package.module:function)")
        self._check_model_keys()
        if self.depth < 8 or (self.depth - 2) % 6:
            raise HpcoptError(f"resnet depth must be 6n + 2 with n >= 1 (8, 14, 20, ...), got {self.depth}")
        if self.width < 1:
            raise HpcoptError(f"width must be >= 1, got {self.width}")
        if not self.channels or any(c < 1 for c in self.channels):
            raise HpcoptError(f"channels must be one or more sizes >= 1, got {self.channels}")
        if any(h < 1 for h in self.hidden):
            raise HpcoptError(f"hidden sizes must be >= 1, got {self.hidden}")
        if self.embed < 0:
            raise HpcoptError(f"embed must be >= 1, got {self.embed}")
        if self.model == "lstm":
            if not self.hidden or len(set(self.hidden)) != 1:
                raise HpcoptError(f"lstm needs equal hidden sizes, one per layer (e.g. --hidden 256,256), "
                                  f"got {self.hidden}")
        elif self.embed or self.tie:
            raise HpcoptError(f"{'embed' if self.embed else 'tie'} applies only to --model lstm")

    def _check_model_keys(self) -> None:
        """Keys of one kind of model are refused (when changed from the default) for the others."""
        _refuse_changed(self, "model", self.model, MODEL_KEYS)

    @property
    def torch(self) -> bool:
        """Whether the model is the user's torch.nn.Module (``torch:package.module:function``)."""
        return self.model.startswith("torch:")

    @property
    def keeps_buffers(self) -> bool:
        """Whether the model has batch-norm running statistics (a buffer beside the parameters)."""
        return self.model == "resnet" or (self.model == "plain_cnn" and self.batch_norm)


class AlgorithmSection(Protocol):
    """The ``[algorithm]`` section as a type checker sees it. ``algorithm_config()`` is a
    frozen dataclass made from the registry as it is (``algorithm_section``): its fields are the
    registered algorithms' options, declared once, in their classes. A checker knows
    ``algorithm`` and reads any other option as ``Any``; the algorithm object built from the
    section (``hpcopt.algorithms.registration.create``) is the typed view of its options."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    options: ClassVar[dict[str, MergedOption]]  # key -> the option as its algorithms declare it

    algorithm: str

    def __getattr__(self, name: str) -> Any: ...


class _AlgorithmDefault:
    """The default of an ``[algorithm]`` field: resolved, when the section is made, to the
    chosen algorithm's own default of that option."""

    def __repr__(self) -> str:
        return "<the algorithm's default>"


ALGORITHM_DEFAULT: Any = _AlgorithmDefault()


def algorithm_section(classes: Mapping[str, type]) -> type[AlgorithmSection]:
    """The ``[algorithm]`` section over the algorithms ``classes`` (name -> class; the first is
    the default algorithm): the algorithm's name and every option of every class
    (``merge_options``: one type per name). An option not given takes the chosen algorithm's
    own default, or, when that algorithm has no such option, the first declaration's; another
    algorithm's option changed from that default (to another value than the one the chosen
    class ``implied``) is an error naming the algorithms it applies to. Then the chosen class
    checks its own options."""
    options = merge_options(classes)
    first = next(iter(classes))
    entries: list[tuple[str, Any, Any]] = [("algorithm", str, option(first, " | ".join(classes)))]
    entries += [(o.key, o.type, field(default=ALGORITHM_DEFAULT, metadata={"help": o.help}))
                for o in options.values()]

    def check(section: Any) -> None:
        chosen = classes.get(section.algorithm)
        if chosen is None:
            raise not_registered(section.algorithm)
        unset = {o.key for o in options.values() if getattr(section, o.key) is ALGORITHM_DEFAULT}
        for o in options.values():
            value = getattr(section, o.key)
            if value is ALGORITHM_DEFAULT:
                value = o.defaults.get(section.algorithm, o.default)
                if _default_left_behind(chosen, o.key, section, unset):
                    value = o.default
                object.__setattr__(section, o.key, value)
            if (section.algorithm not in o.defaults and value != o.default
                    and getattr(chosen, "implied", {}).get(o.key, o.default) != value):
                raise HpcoptError(f"{o.key} applies only to --algorithm {' or '.join(o.users)}, "
                                  f"not {section.algorithm}")
        chosen(**{f.name: getattr(section, f.name) for f in option_fields(chosen)})

    made = dataclasses.make_dataclass("AlgorithmConfig", entries, frozen=True,
                                      namespace={"__post_init__": check, "__module__": __name__,
                                                 "options": options})
    # make_dataclass returns a plain ``type``; AlgorithmSection is how a checker reads it
    return cast("type[AlgorithmSection]", made)


def _default_left_behind(chosen: type, key: str, section: Any, unset: set[str]) -> bool:
    """Whether ``chosen``'s own default of ``key`` belongs with its default of another option
    (``defaults_with``: DiLoCo's outer lr 0.7 and mu 0.9 are its Nesterov's) that this section
    sets to something else: then ``key``, left unset, takes the general default (outer_lr 1,
    outer_momentum 0), which each outer optimizer reads as its own (fedadam: lr 0.01)."""
    other = getattr(chosen, "defaults_with", {}).get(key)
    if other is None or other in unset:
        return False
    return getattr(section, other) != getattr(chosen, other)


def algorithm_config() -> type[AlgorithmSection]:
    """The ``[algorithm]`` section over the registry as it is now (an algorithm registered later
    gets a new section that has its options)."""
    return _section_of(tuple(registry().items()))


@functools.cache
def _section_of(classes: tuple[tuple[str, type], ...]) -> type[AlgorithmSection]:
    return algorithm_section(dict(classes))


def algorithm_options() -> dict[str, MergedOption]:
    """Every ``[algorithm]`` option of the registered algorithms, merged (``merge_options``)."""
    return algorithm_config().options


def pipeline_algorithms() -> tuple[str, ...]:
    """Algorithms whose ranks are pipeline stages (hpcopt.run.pipeline)."""
    return algorithm_names(PIPELINE)


@dataclass(frozen=True)
class RunConfig:
    seed: int = option(0, "seed of every random stream (data order, initial model, noise)")
    epochs: float = option(40.0, "run length in epochs of a rank's shard (used when steps = 0)")
    steps: int = option(0, "run length in local steps per rank; 0 = from epochs")
    device: str = option("cpu", "cpu | gpu (CuPy), see hpcopt.backend and hpcopt.comm.staging")
    dtype: str = option("float32", "float32 | float64")
    eval_every: int = option(0,
                             "clock ticks between evaluations of the averaged model; 0 = only at the "
                             "end")
    progress: bool = option(True, "print progress lines (rank 0; the end-of-run summary is printed "
                                  "either way)")
    out: str = option("", "run directory ({time}: the start time); '' = no files")
    checkpoint_every: int = option(0, "clock ticks between checkpoints; 0 = only the final one")
    checkpoint_minutes: float = option(0.0, "also a checkpoint once this many minutes of wall time have "
                                       "passed since the start or the last checkpoint, at a trace row "
                                       "every rank agrees on; 0 = off (needs a run directory)")
    keep_checkpoints: int = option(3, "the newest K checkpoints are kept, older ones deleted")
    trace: bool = option(True, "write OUT/trace.h5")
    trace_every: int = option(8, "clock ticks per trace row (SIGTERM or Ctrl-C stops a run within two)")
    timeline: bool = option(False, "also record each rank's spans (compute, communication, waits, "
                            "evaluations, checkpoints) in the trace's /timeline; hpcopt export "
                            "--format chrome shows them")
    timeline_max_spans: int = option(200_000, "spans the timeline keeps per rank; later ones are "
                                     "counted as dropped")
    averaging: str = option("auto", "auto | mpi | shm (node-local shared memory), see hpcopt.comm")
    comm_progress: str = option("calls", "how a reduction in flight moves on while the rank "
                                         "computes: calls (MPI's own, inside MPI calls) | "
                                         "mpich-thread (MPICH's progress thread; on the command "
                                         "line, which sets it before MPI starts) | comm-thread "
                                         "(hpcopt's communication thread, polling while one is "
                                         "in flight), see hpcopt.comm.progress")
    network: str = option("",
                          "cost-model profile for modelled comm seconds in the trace, see "
                          "hpcopt.comm.costmodel")
    network_delay: bool = option(False, "also sleep the modelled seconds after every counted call")
    stall_timeout: float = option(0.0,
                                  "seconds a collective may take before the job is aborted; 0 = off "
                                  "(hpcopt.run.watchdog)")
    on_nonfinite: str = option("stop", "stop | skip: NaN/Inf in the loss or model (hpcopt.run.nonfinite)")
    preset: str = option("", f"a named bundle of option defaults that the config file and flags "
                             f"override (hpcopt.presets): {describe_presets()}; '' = none")
    straggler: str = option("", "RANK:FACTOR[,...]: rank RANK runs at FACTOR (0.01 <= FACTOR < 1) of "
                            "its speed, sleeping (1/FACTOR - 1) x each gradient's measured time (a "
                            "stop signal ends the sleep); '' = none (hpcopt.run.fault_schedule)")
    fault: str = option("", "RANK:STEP: kill -9 of rank RANK at its local step STEP, once per run "
                        "(resume goes on past it); needs checkpoint_every below STEP (unless "
                        "on_rank_loss continue); '' = none "
                        "(hpcopt.run.fault_schedule)")
    on_rank_loss: str = option("abort", "abort | continue: a lost rank ends the job, or the survivors "
                                        "go on from the last round (exit 5) or, where they cannot (rank 0, "
                                        "set-up, after the summary), end in one line (exit 6); pair it "
                                        "with stall_timeout, which catches a rank MPI does not report lost "
                                        "(Open MPI's ULFM: mpirun --with-ft ulfm; hpcopt.run.rank_loss)")

    def __post_init__(self) -> None:
        preset_values(self.preset)  # HpcoptError for an unknown name
        if self.network:
            from .comm.costmodel import get_profile

            get_profile(self.network)  # HpcoptError for an unknown name or bad values
        elif self.network_delay:
            raise HpcoptError("network_delay needs a profile: --network NAME or alpha=...,bandwidth=...")
        if self.comm_progress not in PROGRESS_MODES:
            raise HpcoptError(f"comm_progress must be one of {', '.join(PROGRESS_MODES)}, "
                              f"got {self.comm_progress!r}")
        if self.averaging not in AVERAGING_MODES:
            raise HpcoptError(f"averaging must be one of {', '.join(AVERAGING_MODES)}, "
                            f"got {self.averaging!r}")
        if self.seed < 0:
            raise HpcoptError(f"seed must be >= 0, got {self.seed}")
        if self.steps < 0 or self.epochs < 0 or (self.steps == 0 and self.epochs == 0):
            raise HpcoptError("give a positive number of steps or epochs")
        if self.dtype not in DTYPES:
            raise HpcoptError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise HpcoptError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        for name in ("eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise HpcoptError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.timeline and not self.trace:
            raise HpcoptError("timeline is recorded in the trace: it needs trace = true "
                              "(or timeline = false)")
        for name in ("keep_checkpoints", "trace_every", "timeline_max_spans"):
            if getattr(self, name) < 1:
                raise HpcoptError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (0 <= self.checkpoint_minutes < math.inf):
            raise HpcoptError(f"checkpoint_minutes must be >= 0 minutes (0 = off), "
                              f"got {self.checkpoint_minutes}")
        if not (0 <= self.stall_timeout < math.inf):
            raise HpcoptError(f"stall_timeout must be >= 0 seconds (0 = off), got {self.stall_timeout}")
        if self.on_nonfinite not in NONFINITE_MODES:
            raise HpcoptError(f"on_nonfinite must be one of {', '.join(NONFINITE_MODES)}, "
                            f"got {self.on_nonfinite!r}")
        if self.on_rank_loss not in RANK_LOSS_MODES:
            raise HpcoptError(f"on_rank_loss must be one of {', '.join(RANK_LOSS_MODES)}, "
                            f"got {self.on_rank_loss!r}")


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmSection = field(default_factory=lambda: algorithm_config()())
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        self._check_text()
        if self.run.network and self.algorithm.algorithm in pipeline_algorithms():
            raise HpcoptError("network applies only to the data-parallel algorithms "
                              "(prsgd, celgc, naive_clip)")
        if self.run.comm_progress == "comm-thread" and self.algorithm.algorithm in pipeline_algorithms():
            raise HpcoptError("comm_progress comm-thread moves the data-parallel algorithms' reductions in "
                              "flight on; a pipeline's messages are point-to-point (use calls or "
                              "mpich-thread)")
        if self.run.device != "cpu" and streamed(self.algorithm):
            raise HpcoptError("fragments, overlap and fragment_mix are built for device cpu only")
        text, lstm = self.data.dataset in TEXT_CORPORA, self.model.model == "lstm"
        if text and not (lstm or self.model.torch):
            raise HpcoptError(f"{self.data.dataset} is a text corpus: train it with --model lstm, or with "
                              "your own --model torch:package.module:function (called with the "
                              "vocabulary size)")
        if lstm and not text:
            raise HpcoptError(f"--model lstm needs a text corpus ({', '.join(TEXT_CORPORA)}), "
                            f"not {self.data.dataset}")
        conv = self.model.model in CONV_MODELS
        if self.data.augment and not conv:
            raise HpcoptError(f"augment applies only to --model {' or '.join(CONV_MODELS)}, "
                            f"not {self.model.model}")
        if self.model.keeps_buffers and self.algorithm.algorithm in pipeline_algorithms():
            raise HpcoptError(f"batch norm (--model {self.model.model}) trains only with the "
                            f"data-parallel algorithms, not {self.algorithm.algorithm}")
        self._check_pipeline()
        from .run.fault_schedule import check_schedule

        check_schedule(self.run, self.algorithm.algorithm in pipeline_algorithms())
        if self.algorithm.wire and self.run.device != "cpu":
            raise HpcoptError("wire applies only to --device cpu (its casts and float32 sum run on the host)")
        if self.algorithm.algorithm in pipeline_algorithms() and self.run.on_nonfinite == "skip":
            raise HpcoptError("on_nonfinite skip applies only to the data-parallel algorithms (a "
                            "pipeline iteration is full-batch: no minibatch to drop), "
                            f"not {self.algorithm.algorithm}")
        if self.algorithm.algorithm in pipeline_algorithms() and self.run.on_rank_loss == "continue":
            raise HpcoptError("on_rank_loss continue applies only to the data-parallel algorithms "
                              f"(a pipeline's stages are its ranks), not {self.algorithm.algorithm}")
        if (self.algorithm.buffer_policy != algorithm_options()["buffer_policy"].default
                and not self.model.keeps_buffers and not self.model.torch):
            raise HpcoptError("buffer_policy applies only to models with batch norm "
                              "(--model resnet, plain_cnn with --batch-norm true, or torch:...)")

    def _check_text(self) -> None:
        """Every text option is plain text: a control character or a line separator (a newline
        in ``--out``, U+2028) would break error lines, the run's header and a study's manifest,
        an undecodable byte could not be stored."""
        for section in fields(self):
            for f in fields(getattr(self, section.name)):
                value = getattr(getattr(self, section.name), f.name)
                if isinstance(value, str) and any(unicodedata.category(c) in REFUSED_CATEGORIES
                                                  for c in value):
                    raise HpcoptError(f"{f.name} must be text without control characters, line "
                                      f"separators or undecodable bytes, got {value!r}")

    def _check_pipeline(self) -> None:
        """Pipeline runs: an MLP (or none, for l1_chain) on an image data set; their options
        (problem, images, eps, shots, stages) are refused elsewhere when changed."""
        pipeline = self.algorithm.algorithm in pipeline_algorithms()
        if not pipeline:
            for section, name in (("data", "problem"), ("data", "images"), ("data", "eps"),
                                  ("data", "shots"), ("model", "stages")):
                if getattr(getattr(self, section), name) != _default(sections()[section], name):
                    raise HpcoptError(f"{name} applies only to --algorithm "
                                    f"{' or '.join(pipeline_algorithms())}")
            return
        if self.model.model != "mlp":
            raise HpcoptError(f"pipeline algorithms train an mlp, not --model {self.model.model}")
        if self.data.partition != "iid":
            raise HpcoptError("partition does not apply to pipeline algorithms (every stage sees "
                            "the whole batch)")

    @property
    def language_model(self) -> bool:
        return self.model.model == "lstm"

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {section.name: dataclasses.asdict(getattr(self, section.name)) for section in fields(self)}


def _default(cls: type, name: str) -> Any:
    """The default of the field ``name`` of the dataclass ``cls``."""
    return next(f.default for f in fields(cls) if f.name == name)


def sections() -> dict[str, type]:
    """Section name -> its dataclass (the ``[algorithm]`` one over the registry as it is now)."""
    return {"data": DataConfig, "model": ModelConfig, "algorithm": algorithm_config(), "run": RunConfig}


#: The names that depend on the registry, made when asked for (``from hpcopt.config import
#: AlgorithmConfig``): an algorithm registered later, or an entry point that fails to load,
#: must not make importing this module fail or go stale.
_FROM_REGISTRY = {"AlgorithmConfig": algorithm_config, "ALGORITHM_OPTIONS": algorithm_options,
                  "PIPELINE_ALGORITHMS": pipeline_algorithms, "SECTIONS": sections}


def __getattr__(name: str) -> Any:
    if name in _FROM_REGISTRY:
        return _FROM_REGISTRY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def option_index() -> dict[str, tuple[str, dataclasses.Field]]:
    """Field name -> (section, field) over all sections; names are unique across sections."""
    index: dict[str, tuple[str, dataclasses.Field]] = {}
    for section, cls in sections().items():
        for f in fields(cls):
            assert f.name not in index, f"option {f.name} defined twice"
            index[f.name] = (section, f)
    return index


def _field_type(cls: type, name: str) -> Any:
    return _type_hints(cls)[name]


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """The fields' types of a section (evaluated once: it costs more than the rest of a build)."""
    return typing.get_type_hints(cls)


def coerce(name: str, value: Any, annotation: Any) -> Any:
    """Check (TOML values) or parse (flag strings) ``value`` against a field's type."""
    origin = typing.get_origin(annotation)
    if origin is tuple:
        item_type = typing.get_args(annotation)[0]
        if isinstance(value, str):
            items = [v for v in (s.strip() for s in value.split(",")) if v]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise HpcoptError(f"{name} must be a list, got {value!r}")
        return tuple(coerce(name, item, item_type) for item in items)
    if annotation == int | str:  # a number or a word (group_size: G or "node")
        if isinstance(value, str) and not value.strip().lstrip("+-").isdigit():
            return value
        return coerce(name, value, int)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise HpcoptError(f"{name} must be true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool):
            raise HpcoptError(f"{name} must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise HpcoptError(f"{name} must be an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise HpcoptError(f"{name} must be a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise HpcoptError(f"{name} must be a string, got {value!r}")
    raise TypeError(f"unsupported option type {annotation} for {name}")  # pragma: no cover


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML config file; a missing or malformed file is a HpcoptError."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise HpcoptError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise HpcoptError(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise HpcoptError(f"cannot read config file {path}: {exc.strerror}") from None


def build_config(file_values: dict[str, Any] | None = None,
                 overrides: dict[str, Any] | None = None) -> Config:
    """Defaults <- the preset's values (``[run] preset``, hpcopt.presets) <- TOML tables <- flag
    overrides (field name -> raw value), all validated."""
    index = option_index()
    classes = sections()
    chosen: dict[str, dict[str, Any]] = {section: {} for section in classes}
    for section, table in (file_values or {}).items():
        if section not in classes:
            raise HpcoptError(f"unknown config section [{section}] (sections: {', '.join(classes)})")
        if not isinstance(table, dict):
            raise HpcoptError(f"config section [{section}] must be a table")
        for key, value in table.items():
            if key not in index or index[key][0] != section:
                hint = _unknown_key_hint(key, section, index)
                raise HpcoptError(f"unknown key {key!r} in [{section}]{hint}")
            chosen[section][key] = value
    for key, value in (overrides or {}).items():
        if key not in index:
            raise HpcoptError(f"unknown option {key!r}{did_you_mean(key, index)}")
        chosen[index[key][0]][key] = value
    if "preset" in chosen["run"]:
        chosen["run"]["preset"] = coerce("preset", chosen["run"]["preset"], str)
        apply_preset(chosen, {key: section for key, (section, _) in index.items()})
    parts = {}
    for section, cls in classes.items():
        values = {k: coerce(k, v, _field_type(cls, k)) for k, v in chosen[section].items()}
        parts[section] = cls(**values)
    return Config(**parts)


def _unknown_key_hint(key: str, section: str, index: Mapping[str, tuple[str, Any]]) -> str:
    """For a key a config file's ``[section]`` does not have: the section it belongs in, or the
    section's key closest to it."""
    if key in index:
        return f" (it belongs in [{index[key][0]}])"
    return did_you_mean(key, (name for name, (where, _) in index.items() if where == section))


def config_from_stored(values: dict[str, Any]) -> Config:
    """A config a run stored (in a checkpoint or trace) as TOML tables. Its ``[algorithm]``
    table lists every algorithm's options, at the defaults of the hpcopt that wrote it: only
    those of the run's own algorithm are taken, so a later change of another algorithm's
    default does not make old files invalid."""
    table = values.get("algorithm")
    if isinstance(table, dict) and isinstance(table.get("algorithm"), str):
        if table["algorithm"] not in registry():
            raise not_registered(table["algorithm"])
        own = {f.name for f in option_fields(registry()[table["algorithm"]])}
        values = {**values, "algorithm": {k: v for k, v in table.items() if k == "algorithm" or k in own}}
    return build_config(values)


def clips(config: Config) -> bool:
    """Whether ``config``'s algorithm clips (its trace window and checkpoints count clipped steps)."""
    return registry()[config.algorithm.algorithm].clips


def config_from_toml(text: str, path: Path) -> Config:
    """The config stored as TOML text in the file ``path`` (a checkpoint or trace), parsed and
    validated (``config_from_stored``); HpcoptError naming the file, and for an algorithm this
    installation lacks what to do (``written_by_unknown``)."""
    try:
        return config_from_stored(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise HpcoptError(f"{path}: the stored config is not valid TOML ({exc})") from None
    except NotRegistered as exc:  # a plugin's algorithm, not installed here: not an invalid file
        raise written_by_unknown(exc, path) from None
    except HpcoptError as exc:
        raise HpcoptError(f"{path}: the stored config is invalid: {exc}") from None


#: Options a resumed run may change: where files go and how often, what is printed, evaluation,
#: and the length of the run (not with the sqrt_nt and cosine schedules, whose step size depends on it),
#: and the device (a GPU run's checkpoint resumes on CPU and vice versa: to float tolerance),
#: and the failure handling (stall_timeout, on_nonfinite, on_rank_loss: docs/failures.md).
RESUME_SAFE = ("out", "checkpoint_every", "checkpoint_minutes", "keep_checkpoints", "trace", "trace_every",
               "timeline", "timeline_max_spans", "progress", "eval_every", "steps", "epochs", "device",
               "stall_timeout", "on_nonfinite", "straggler", "fault", "on_rank_loss")


def check_resume(stored: Config, config: Config) -> None:
    """HpcoptError if ``config`` differs from a checkpoint's ``stored`` config in an option that
    would change the computation (anything outside RESUME_SAFE)."""
    old, new = stored.to_dict(), config.to_dict()
    for section, values in new.items():
        for key, value in values.items():
            before = old[section][key]
            if value == before:
                continue
            if key in ("steps", "epochs") and config.algorithm.schedule in BY_RUN_LENGTH:
                why = f" (the {config.algorithm.schedule} step size depends on the number of steps)"
            elif key in RESUME_SAFE:
                continue
            else:
                why = f"; a resumed run may change only {', '.join(RESUME_SAFE)}"
            raise HpcoptError(f"cannot change {key} when resuming: the checkpoint has "
                            f"{_toml_value(before)}, asked for {_toml_value(value)}{why}")


def require_named_model(stored: Config, named: bool) -> None:
    """HpcoptError unless the user names (``named``: ``--model`` as a flag or in their own
    ``--config``) the torch model of a checkpoint's ``stored`` config: hpcopt imports a module
    only when the user names it, never because a file does. Imports nothing."""
    if stored.model.torch and not named:
        raise HpcoptError(f"--model: the checkpoint's model is a torch module "
                          f"({_toml_value(stored.model.model)}), and hpcopt never imports what a file "
                          "names: resume with --model torch:MODULE:FUNCTION, the model you trained")


def to_toml(config: Config) -> str:
    """The resolved config as TOML text (stored in traces and checkpoints)."""
    lines = []
    for section, values in config.to_dict().items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


#: TOML's short escapes in a basic string; any other control character is written \uXXXX.
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
                 "\r": "\\r"}


def _toml_value(value: Any) -> str:
    """``value`` as TOML; a string as a basic string that ``tomllib`` reads back as it was."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + "".join(_TOML_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c)
                             for c in value) + '"'
    return repr(value)


# AlgorithmConfig: made when asked for (``__getattr__``)
__all__ = ["Config", "DataConfig", "ModelConfig", "AlgorithmConfig", "RunConfig", "build_config",  # noqa: F822
           "read_toml", "to_toml", "option_index", "coerce", "check_resume", "require_named_model",
           "RESUME_SAFE"]
