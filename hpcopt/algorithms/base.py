"""The Algorithm protocol: what an algorithm class declares, and its fields' kinds.

An algorithm is a frozen dataclass with a class attribute ``name``. Its fields are of two kinds:

- options (``option(default, help)``): the hyper-parameters. The class is its own config
  section: these fields are the ``[algorithm]`` keys and command-line flags a run of ``name``
  accepts (``hpcopt.config``), validated once, by the class's ``__post_init__``;
- context (``context(default)``): facts of the run the runner supplies (world size, run length,
  seed, a problem's constants), never set by the user.

Its state is a dataclass whose fields declare what a checkpoint holds
(``hpcopt.algorithms.state``), so a new algorithm resumes bit for bit by construction. A
data-parallel algorithm (``parallelism = "data_parallel"``) implements ``DataParallelAlgorithm``;
a pipeline one (``parallelism = "pipeline"``) is stepped by the pipeline runner with a staged
oracle. The registry (``hpcopt.algorithms.registration``) finds the classes with a ``name``:
those of this package's modules, of installed packages' entry points, and those registered by
``register(cls)``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..errors import HpcoptError

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any
Oracle = Callable[[Array, Array], Any]

DATA_PARALLEL, PIPELINE = "data_parallel", "pipeline"
_HELP, _CONTEXT = "help", "context"


def option(default: Any, help: str) -> Any:
    """A hyper-parameter with its one-line help (shown by ``hpcopt train --help``)."""
    return field(default=default, metadata={_HELP: help})


def context(default: Any) -> Any:
    """A fact of the run that the runner passes in (not a user option)."""
    return field(default=default, metadata={_CONTEXT: True})


def positive_finite(name: str, value: float) -> None:
    """HpcoptError unless 0 < value < inf."""
    if not value > 0:
        raise HpcoptError(f"{name} must be > 0, got {value}")
    if not math.isfinite(value):
        raise HpcoptError(f"{name} must be finite, got {value}")


def check_momentum(momentum: float, nesterov: bool) -> None:
    if not 0 <= momentum < 1:
        raise HpcoptError(f"momentum must be in [0, 1), got {momentum}")
    if nesterov and momentum == 0:
        raise HpcoptError("nesterov needs momentum > 0")


def option_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The option fields of an algorithm class, in declaration order."""
    return tuple(f for f in dataclasses.fields(cls) if _HELP in f.metadata)


@dataclass(frozen=True)
class MergedOption:
    """One ``[algorithm]`` key as the algorithms that have it declare it: one type and help,
    and each algorithm's own default (``defaults``: algorithm name -> default, in order)."""

    key: str
    type: Any
    help: str
    defaults: Mapping[str, Any]

    @property
    def users(self) -> tuple[str, ...]:
        """The algorithms that have this option."""
        return tuple(self.defaults)

    @property
    def default(self) -> Any:
        """The first algorithm's default: the value the option keeps in runs of an algorithm
        without it (changing it there is an error)."""
        return next(iter(self.defaults.values()))


def merge_options(classes: Mapping[str, type]) -> dict[str, MergedOption]:
    """Option key -> its declarations merged over ``classes`` (algorithm name -> class). The
    ``[algorithm]`` section and the flags are one namespace, so a key declared with two different
    types is a TypeError naming both classes; a key's defaults may differ (each algorithm keeps
    its own), and its help is the first declaration's."""
    found: dict[str, tuple[Any, str, dict[str, Any], type]] = {}
    for name, cls in classes.items():
        hints = typing.get_type_hints(cls)
        for f in option_fields(cls):
            if f.name not in found:
                found[f.name] = (hints[f.name], f.metadata[_HELP], {}, cls)
            kind, _, defaults, first = found[f.name]
            if hints[f.name] != kind:
                raise TypeError(f"option {f.name!r} is declared as {_type_name(kind)} by "
                                f"{first.__qualname__} and as {_type_name(hints[f.name])} by "
                                f"{cls.__qualname__}: one name, one type (rename one of them)")
            defaults[name] = f.default
    return {key: MergedOption(key, kind, text, defaults) for key, (kind, text, defaults, _) in found.items()}


def _type_name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def context_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if _CONTEXT in f.metadata)


class AlgorithmClass(Protocol):
    """What every registered algorithm class declares (the registry's values are these
    classes, constructed by ``create`` from their option and context fields)."""

    name: ClassVar[str]
    parallelism: ClassVar[str]  # DATA_PARALLEL or PIPELINE: which session trains it
    clips: ClassVar[bool]      # whether its state counts clipped steps (trace column clip_fraction)
    #: Options of other algorithms it accepts at the value it embodies (naive_clip: interval 1).
    implied: ClassVar[dict[str, Any]]


class DataParallelAlgorithm(Protocol):
    """What the data-parallel runner (``hpcopt.train``) calls.

    ``clock`` is the "when": the ticks at which every rank is at the same point, so that
    collectives outside the algorithm (trace rows, evaluation, checkpoints) may run; the
    "how" of each round is the algorithm's own ``step``."""

    name: ClassVar[str]
    parallelism: ClassVar[str]  # DATA_PARALLEL or PIPELINE: which session trains it
    clips: ClassVar[bool]      # whether its state counts clipped steps (trace column clip_fraction)
    buffer_policy: str
    #: Options of other algorithms it accepts at the value it embodies (naive_clip: interval 1).
    implied: ClassVar[dict[str, Any]]

    def init(self, x0: Array, comm: Comm, buffers: Array | None = None) -> Any: ...
    def step(self, state: Any, oracle: Oracle, comm: Comm) -> Any: ...
    def lr_at(self, t: int) -> float: ...
    def steps_for(self, total_steps: int, rank: int, size: int) -> int: ...
    def clock(self, state: Any) -> int | None: ...
    def clock_ticks(self, total_steps: int) -> int: ...
    def synchronized(self, state: Any) -> bool: ...
    def round_ends(self, state: Any, tick: int) -> bool: ...  # tick ends a round
    def finish(self, state: Any, comm: Comm, label: str) -> None: ...
    def describe(self) -> str: ...
    def describe_schedule(self) -> str: ...  # the lr schedule beyond a constant lr ("" for none)
    def warnings(self) -> tuple[str, ...]: ...  # options it runs but users rarely mean (rank 0 prints)
    def in_flight(self, state: Any) -> bool: ...  # a reduction is in flight after the last step
    def state_vectors(self) -> tuple[int, int]: ...  # (per-rank, shared) d-vectors besides x
    # what it reports besides the loss: the session asks, and names no algorithm
    averaged_labels: ClassVar[tuple[str, ...]]  # its averaging's labels (the summary's bytes)
    round_labels: ClassVar[tuple[str, ...]]  # a round's labels (modelled seconds a round: their main op's)
    def trace_columns(self) -> tuple[str, ...]: ...  # columns it adds to every trace row
    def trace_row(self, state: Any) -> dict[str, Any]: ...  # those of them it fills at a row
    def step_clipped(self, state: Any) -> Any: ...  # the last step was clipped (when ``clips``)
    def summary_tallies(self, state: Any) -> tuple[float, ...]: ...  # summed over the ranks
    def summary_report(self, sums: Sequence[float]) -> tuple[dict[str, Any], list[str]]: ...
