"""The registry: algorithm name -> class, from three places.

- built in: every module of ``hpcopt.algorithms``, each dataclass in it with a ``name``;
- entry points: each entry point of the group ``hpcopt.algorithms`` of an installed package
  (``[project.entry-points."hpcopt.algorithms"] myalg = "mypkg.mod:MyAlgorithm"``), loaded the
  first time the registry is asked for; the entry point's name is the algorithm's;
- by call: ``register(cls)`` (also a class decorator) in a user's own code, from then on in
  that process.

Every process that reads a config finds the built-in and the entry-point algorithms by itself:
``mpiexec`` ranks, ``hpcopt resume``, the child process that reads a resumed run's files first
(``hpcopt.io.vet``), ``hpcopt sweep`` tasks. An algorithm registered by call is known in the
processes that made the call, and in the processes hpcopt starts from them (``hpcopt.child``),
which import the module the class is defined in, named in ``MODULES_VARIABLE``; a class defined
in the script itself (``__main__``) cannot be imported there, so a resumed run of it is refused
with a message saying how to make it findable. A name is one algorithm's: a clash with a
built-in, or between two of the others, is refused.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import sys
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..errors import HpcoptError
from .base import DATA_PARALLEL, PIPELINE, context_fields, merge_options, option_fields

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .base import AlgorithmClass

ENTRY_POINT_GROUP = "hpcopt.algorithms"
#: The variable a process hpcopt starts is told by: the modules of the algorithms its parent
#: registered by call (comma-separated; ``__main__:NAME`` for one it cannot import).
MODULES_VARIABLE = "HPCOPT_ALGORITHM_MODULES"
#: How to make an algorithm findable: the durable way, and both.
AS_ENTRY_POINT = f"declare it as an entry point of the group {ENTRY_POINT_GROUP!r} of an installed package"
HOW_TO = (f"{AS_ENTRY_POINT}, or call hpcopt.algorithms.register(cls) in this process (docs/python.md, "
          "'Registering an algorithm of your own')")

#: The order names are listed in (help, error messages); other built-ins follow, then the
#: entry points, then the algorithms registered by call.
_ORDER = {name: i for i, name in enumerate(
    ("prsgd", "celgc", "naive_clip", "pprs", "pipelined_gd", "pipelined_agd"))}

_by_call: dict[str, type[AlgorithmClass]] = {}

C = TypeVar("C", bound=type)


def is_algorithm_class(value: Any) -> bool:
    """A dataclass that declares its own ``name`` (a string): what the registry collects."""
    return (isinstance(value, type) and dataclasses.is_dataclass(value)
            and "name" in vars(value) and isinstance(vars(value)["name"], str))


@cache
def builtin() -> dict[str, type[AlgorithmClass]]:
    """The algorithms of the package's own modules, by name, in ``_ORDER``."""
    from .. import algorithms

    found: dict[str, type[AlgorithmClass]] = {}
    for module_info in sorted(pkgutil.iter_modules(algorithms.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{algorithms.__name__}.{module_info.name}")
        for value in vars(module).values():
            if is_algorithm_class(value):
                if value.name in found and found[value.name] is not value:
                    raise TypeError(f"two algorithms are called {value.name!r}: "
                                    f"{found[value.name].__qualname__} and {value.__qualname__}")
                # a dataclass with a ``name``: by convention (ScheduledSGD, _Pipelined) it also
                # declares AlgorithmClass's other class attributes, which no check here can see
                # (tests/unit/test_config_types.py checks every registered class)
                found[value.name] = cast("type[AlgorithmClass]", value)
    return dict(sorted(found.items(), key=lambda item: _ORDER.get(item[0], len(_ORDER))))


@cache
def from_entry_points() -> dict[str, type[AlgorithmClass]]:
    """The algorithms the installed packages declare in ``ENTRY_POINT_GROUP``, by name; an
    entry point that fails to load (whatever its module raises, ``sys.exit`` and
    KeyboardInterrupt included), or that names no algorithm class, is a HpcoptError naming it
    and its package."""
    found: dict[str, tuple[type[AlgorithmClass], EntryPoint]] = {}
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        where = _described(point)
        try:
            value = point.load()
        except BaseException as exc:  # noqa: BLE001 - whatever the user's module raised, in one line:
            # sys.exit(0) at its import once made every train exit 0, training nothing
            raise HpcoptError(f"{where} could not be loaded: {_raised(exc)} "
                              "(fix that package or uninstall it)") from None
        _check_class(value, where)
        if value.name != point.name:
            raise HpcoptError(f"{where} names {value.__qualname__}, whose name is {value.name!r}: "
                              f"the entry point's name must be the algorithm's ({value.name} = ...)")
        if point.name in builtin():
            raise HpcoptError(f"{where}: {point.name!r} is a built-in algorithm; rename yours")
        if point.name in found and found[point.name][0] is not value:
            raise HpcoptError(f"{where} and {_described(found[point.name][1])} both declare the "
                              f"algorithm {point.name!r}: uninstall one of them")
        found[point.name] = (value, point)
    classes = {name: cls for name, (cls, _) in found.items()}
    _check_options({**builtin(), **classes}, "the entry points of group " + repr(ENTRY_POINT_GROUP))
    return classes


def _raised(exc: BaseException) -> str:
    """What a user's module raised at its import, for one line: ``SystemExit(0)`` (its
    ``sys.exit``), a KeyboardInterrupt or any exception, by type and text."""
    text = str(exc)
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _described(point: EntryPoint) -> str:
    package = f" of package {point.dist.name!r}" if point.dist is not None else ""
    return f"entry point {point.name} = {point.value!r} (group {ENTRY_POINT_GROUP!r}{package})"


def register(cls: C) -> C:
    """Register the algorithm class ``cls`` under its ``name`` for this process; returns it, so
    it decorates a class definition (``@register``). Registering the same class again, or a
    class of the same module and qualified name (a module reloaded, a notebook cell run again),
    replaces it; a name of a built-in or an entry-point algorithm, or of another registered
    class, is refused (HpcoptError)."""
    where = f"register({getattr(cls, '__qualname__', cls)!r})"
    _check_class(cls, where)
    name: str = vars(cls)["name"]
    if name in builtin():
        raise HpcoptError(f"{where}: {name!r} is a built-in algorithm "
                          f"({_origin(builtin()[name])}); choose another name")
    if name in from_entry_points() and from_entry_points()[name] is not cls:
        raise HpcoptError(f"{where}: {name!r} is already the algorithm of an entry point "
                          f"({_origin(from_entry_points()[name])}); choose another name")
    earlier = _by_call.get(name)
    if earlier is not None and _origin(earlier) != _origin(cls):
        raise HpcoptError(f"{where}: {name!r} is already registered as {_origin(earlier)}; "
                          "choose another name")
    _check_options({**builtin(), **from_entry_points(), **{**_by_call, name: cls}}, where)
    _by_call[name] = cast("type[AlgorithmClass]", cls)
    registry.cache_clear()
    return cls


def _origin(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_class(value: Any, where: str) -> None:
    """HpcoptError unless ``value`` is an algorithm class the runners can train."""
    if not is_algorithm_class(value):
        raise HpcoptError(f"{where}: {value!r} is not an algorithm class (a dataclass that declares "
                          "its own name: name: ClassVar[str] = 'myalg')")
    if not value.name.isidentifier():
        raise HpcoptError(f"{where}: the name {value.name!r} is not an identifier (letters, digits, _)")
    if getattr(value, "parallelism", None) not in (DATA_PARALLEL, PIPELINE):
        raise HpcoptError(f"{where}: {value.__qualname__}.parallelism must be {DATA_PARALLEL!r} or "
                          f"{PIPELINE!r} (subclass ScheduledSGD, Rounds or LocalSGD for a "
                          "data-parallel one)")


def _check_options(classes: Mapping[str, type], where: str) -> None:
    """HpcoptError when two of ``classes`` declare one option with two types."""
    try:
        merge_options(classes)
    except TypeError as exc:
        raise HpcoptError(f"{where}: {exc}") from None


@cache
def _parent_modules() -> tuple[str, ...]:
    """Import the modules the parent process named in ``MODULES_VARIABLE`` (they register their
    algorithms as they are imported); the names it registered in a script it cannot import."""
    unimportable = []
    for entry in filter(None, os.environ.get(MODULES_VARIABLE, "").split(",")):
        module, _, name = entry.partition(":")
        if module == "__main__":
            unimportable.append(name)
            continue
        try:
            importlib.import_module(module)
        except BaseException as exc:  # noqa: BLE001 - whatever the user's module raised, in one line
            raise HpcoptError(f"module {module!r}, where the parent process registered an algorithm, "
                              f"could not be imported here: {_raised(exc)}") from None
    return tuple(unimportable)


def child_variables() -> dict[str, str]:
    """For a process hpcopt starts: ``MODULES_VARIABLE`` naming the modules of the algorithms
    registered by call here, and of the pieces (``hpcopt.algorithms.pieces``: a run's config
    names them too), and ``PYTHONPATH`` entries that import them; {} when there are none."""
    defined = {**{name: cls.__module__ for name, cls in _by_call.items()}, **_piece_modules()}
    if not defined:
        return {}
    entries, roots = [], []
    for name, module_name in defined.items():
        module = sys.modules.get(module_name)
        if module_name == "__main__" or module is None:
            entries.append(f"__main__:{name}")
            continue
        entries.append(module_name)
        file = getattr(module, "__file__", None)
        if file:  # the folder its top-level package is in: a.b from /x/a/b.py -> /x
            depth = module_name.count(".") + (Path(file).stem == "__init__")
            roots.append(str(Path(file).resolve().parents[depth]))
    return {MODULES_VARIABLE: ",".join(dict.fromkeys(entries)),
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(roots))}


def _piece_modules() -> dict[str, str]:
    """The modules of the pieces registered by call, by name, those of a script left out (a
    process hpcopt starts then finds no such piece, and says so)."""
    from .kinds import inner_optimizers, outer_optimizers, reducers

    found = {}
    for pieces in (inner_optimizers, outer_optimizers, reducers):
        found.update({f"{pieces.option}:{name}": module for name, module in pieces.modules_by_call().items()
                      if module != "__main__"})
    return found


class NotRegistered(HpcoptError):
    """An algorithm name (``name``) the registry does not hold."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


def not_registered(name: str) -> NotRegistered:
    """The error for an algorithm name the registry does not hold, saying how to make it found."""
    if name in _parent_modules():
        return NotRegistered(f"algorithm {name!r} was registered in the script itself (__main__), which "
                             "a process hpcopt starts (the reader that checks a resumed run's files "
                             "first) cannot import: move the class into a module the script imports, "
                             f"or {AS_ENTRY_POINT}", name)
    return NotRegistered(f"unknown algorithm {name!r} (choose from {', '.join(registry())}); for an "
                         f"algorithm of your own, {HOW_TO}", name)


def written_by_unknown(error: NotRegistered, path: Path) -> HpcoptError:
    """``error`` for the file ``path`` (a checkpoint or trace) whose stored config names it: what
    happened (the file's algorithm is not in this installation) and what to do."""
    if error.name in _parent_modules():
        return HpcoptError(f"{path}: {error}")
    return HpcoptError(f"{path} was written by algorithm {error.name!r}, which this installation of "
                       f"hpcopt does not have (it has {', '.join(registry())}): install the package "
                       f"that registers it (an entry point of the group {ENTRY_POINT_GROUP!r}), or "
                       "from Python call hpcopt.algorithms.register(cls) before reading it")


@cache
def registry() -> dict[str, type[AlgorithmClass]]:
    """Algorithm name -> class: the built-ins (in ``_ORDER``), then the entry points' (by name),
    then those registered by call (in the order of the calls)."""
    _parent_modules()
    return {**builtin(), **from_entry_points(), **_by_call}


def names(parallelism: str | None = None) -> tuple[str, ...]:
    """Registered algorithm names (of one parallelism, when given)."""
    return tuple(n for n, cls in registry().items()
                 if parallelism is None or getattr(cls, "parallelism", DATA_PARALLEL) == parallelism)


def create(name: str, options: Mapping[str, Any], run_context: Mapping[str, Any]) -> Any:
    """The algorithm ``name`` with its options taken from ``options`` (a mapping holding at
    least every option of the class) and its context fields from ``run_context``."""
    cls = registry()[name]
    values = {f.name: options[f.name] for f in option_fields(cls)}
    values.update({key: run_context[key] for key in context_fields(cls) if key in run_context})
    return cls(**values)
