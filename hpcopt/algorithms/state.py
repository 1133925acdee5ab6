"""State fields that declare what a checkpoint holds.

An algorithm's state is a dataclass whose fields say, through these constructors, how each one
is saved; checkpoints (``hpcopt.io.data_parallel_checkpoint``, ``hpcopt.io.pipeline_checkpoint``)
write and read exactly the declared fields, so a new algorithm resumes bit for bit by construction::

    @dataclass
    class MyState:
        x: Array = model()          # the parameters: per rank only while the ranks' models differ
        grad: Array = scratch()     # recomputed every step: not saved
        velocity: Array = vector(AVERAGE)  # one row per rank (None: this run has none)
        anchor: Array = shared()    # the same on every rank: rank 0's copy
        step: int = counter(SAME)   # per-rank integers, floats and flags
        norm: float = scalar(RESET, math.nan)

Counters, scalars and flags may be 0-d device arrays on the GPU (read with ``int``, ``float``,
``bool`` only when a checkpoint is written).

Every per-rank field (``vector``, ``counter``, ``scalar``, ``flag``) declares its rescale policy:
what it becomes when a run resumes on another number of ranks (``resume --ranks-changed``,
``hpcopt.run.rescale``): ``SAME`` (equal on every rank at a checkpoint: every new rank takes it),
``AVERAGE`` (the mean over the old ranks), ``RESET`` (the value a new run starts with) or ``REFUSE``
(meaningless on another count: such a resume is refused). The model and ``shared`` fields are
the same on every rank once averaged, so they carry over as they are.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import field
from typing import Any

Array = Any

KIND = "hpcopt_saved"
MODEL, VECTOR, SHARED, COUNTER, SCALAR, FLAG, SCRATCH = (
    "model", "vector", "shared", "counter", "scalar", "flag", "scratch")
#: Kinds held as one number per rank, and the Python type each is restored as.
NUMBER_TYPES: dict[str, type] = {COUNTER: int, SCALAR: float, FLAG: bool}
#: The kinds held once per rank, each with a rescale policy.
PER_RANK = (VECTOR, COUNTER, SCALAR, FLAG)
RESCALE = "hpcopt_rescale"
SAME, AVERAGE, RESET, REFUSE = "same", "average", "reset", "refuse"
RESCALE_POLICIES = (SAME, AVERAGE, RESET, REFUSE)


def model() -> Any:
    """The model x: saved as the averaged model, and per rank while the models differ."""
    return field(default=None, metadata={KIND: MODEL})


def vector(rescale: str) -> Any:
    """A per-rank array (any length, the same on every rank), saved as one row per rank;
    ``rescale``: its policy on another number of ranks (``RESCALE_POLICIES``)."""
    return field(default=None, metadata={KIND: VECTOR, RESCALE: _policy(rescale)})


def shared() -> Any:
    """An array the algorithm keeps identical on every rank: rank 0's copy is saved."""
    return field(default=None, metadata={KIND: SHARED})


def counter(rescale: str, default: int = 0) -> Any:
    """A per-rank integer (restored as ``int``; an average is rounded)."""
    return field(default=default, metadata={KIND: COUNTER, RESCALE: _policy(rescale)})


def scalar(rescale: str, default: float = 0.0) -> Any:
    """A per-rank float (restored as ``float``)."""
    return field(default=default, metadata={KIND: SCALAR, RESCALE: _policy(rescale)})


def flag(rescale: str, default: bool = False) -> Any:
    """A per-rank boolean (restored as ``bool``)."""
    return field(default=default, metadata={KIND: FLAG, RESCALE: _policy(rescale)})


def _policy(rescale: str) -> str:
    if rescale not in RESCALE_POLICIES:
        raise TypeError(f"unknown rescale policy {rescale!r} (choose from {', '.join(RESCALE_POLICIES)})")
    return rescale


def scratch(default: Any = None) -> Any:
    """Working memory or run-time objects rebuilt at every start: never saved."""
    return field(default=default, metadata={KIND: SCRATCH})


#: A field a piece of an algorithm declares: (name, kind, rescale policy: a vector's; else None).
Declared = tuple[str, str, "str | None"]


@functools.cache
def declaring(state_type: type, declared: tuple[Declared, ...]) -> type:
    """``state_type``, or where it lacks some of the ``declared`` fields (kinds ``shared``,
    ``vector``, ``scratch``) a subclass that declares them: a piece's own state (an outer
    optimizer's moments, the wire's error feedback, the fragments in flight), one class per
    combination, so a checkpoint holds what the pieces declare."""
    have = {f.name for f in dataclasses.fields(state_type)}
    missing = []
    for name, kind, rescale in dict.fromkeys(declared):
        if name not in have:
            have.add(name)
            made = vector(rescale or "") if kind == VECTOR else {SHARED: shared, SCRATCH: scratch}[kind]()
            missing.append((name, Any, made))
    if not missing:
        return state_type
    return dataclasses.make_dataclass(state_type.__name__, missing, bases=(state_type,))


def fields_of(state: Any, *kinds: str) -> tuple[str, ...]:
    """The names of ``state``'s (an instance or a class) fields of these kinds, in order."""
    found = []
    for f in dataclasses.fields(state):
        kind = f.metadata.get(KIND)
        if kind is None:
            raise TypeError(f"{type(state).__name__}.{f.name} declares no checkpoint kind "
                            "(use model(), vector(), shared(), counter(), scalar(), flag() or scratch())")
        if kind in kinds:
            found.append(f.name)
    return tuple(found)


def rescale_policies(state: Any) -> dict[str, str]:
    """Per-rank field name -> its rescale policy, for ``state`` (an instance or a class);
    TypeError for a per-rank field without one (declared without these constructors)."""
    per_rank = set(fields_of(state, *PER_RANK))
    policies: dict[str, str] = {}
    for f in dataclasses.fields(state):
        if f.name not in per_rank:
            continue
        policy = f.metadata.get(RESCALE)
        if not isinstance(policy, str) or policy not in RESCALE_POLICIES:
            owner = state if isinstance(state, type) else type(state)
            raise TypeError(f"{owner.__name__}.{f.name} is per rank but declares no rescale "
                            f"policy (pass one of {', '.join(RESCALE_POLICIES)} to its constructor)")
        policies[f.name] = policy
    return policies


def present(state: Any, *kinds: str) -> tuple[str, ...]:
    """The array fields of these kinds that this run holds (not None)."""
    return tuple(name for name in fields_of(state, *kinds) if getattr(state, name) is not None)


def numbers(state: Any, kind: str) -> dict[str, float]:
    """The per-rank numbers of one kind, read to the host (``int``, ``float`` or ``bool``)."""
    cast = NUMBER_TYPES[kind]
    return {name: cast(getattr(state, name)) for name in fields_of(state, kind)}


def load_numbers(state: Any, kind: str, values: dict[str, Any]) -> None:
    """Put per-rank numbers back, each as its kind's Python type."""
    cast = NUMBER_TYPES[kind]
    for name in fields_of(state, kind):
        setattr(state, name, cast(values[name]))
