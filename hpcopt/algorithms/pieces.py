"""Piece registries: the inner optimizers, the outer optimizers and the reducers, each by name.

A data-parallel round is made of pieces: the local step (``inner.Inner``), what a round does
with the ranks' mean (``outer.Outer``) and how it takes that mean (``reducers.Reducer``). Each
kind has its own registry, filled as the algorithms' is (``hpcopt.algorithms.registration``):

- built in: hpcopt's own pieces (``inner``, ``muon``, ``outer``, ``fedopt``, ``reducers``;
  the registries themselves are in ``hpcopt.algorithms.kinds``, which imports them all);
- entry points: each entry point of the kind's group (``hpcopt.inner_optimizers``,
  ``hpcopt.outer_optimizers``, ``hpcopt.reducers``) of an installed package, a ``Piece``,
  loaded the first time the registry is asked for a name; the entry point's name is the
  piece's;
- by call: ``outer_optimizers.register("lion", piece)`` in a user's own code.

A name is one piece's: a clash with a built-in, or between two of the others, is refused.

A ``Piece`` is a maker from the run's options of its kind (``PieceOptions``) and the names of
those it reads. The options stay the algorithm's, one flag each (``--outer-lr``, ``--momentum``,
...): the kind's options, each with the value that means "left to the piece" (``unset``: the
flag's default). A piece reads its own, with its own default where the run leaves one
(``PieceOptions.get``: fedadam's lr 0.01, nesterov's DiLoCo 0.7 and 0.9), and checks them
itself; an option of the kind that the chosen piece does not read must stay unset, else one
line names the pieces it applies to. So no default of one piece reaches another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from ..errors import HpcoptError

P = TypeVar("P")
P_co = TypeVar("P_co", covariant=True)


@dataclass(frozen=True)
class PieceOptions:
    """The run's options of one kind of piece (``values``), each one's unset value (``unset``)
    and the facts of the run a piece may need (``context``: ``parameter_shapes``, ...)."""

    values: Mapping[str, Any]
    unset: Mapping[str, Any]
    context: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def is_unset(self, key: str) -> bool:
        """Whether the run leaves ``key`` at the kind's default."""
        return bool(self.values[key] == self.unset[key])

    def get(self, key: str, default: Any) -> Any:
        """``key``'s value, or the piece's own ``default`` where the run leaves it unset."""
        return default if self.is_unset(key) else self.values[key]


@dataclass(frozen=True)
class Piece(Generic[P_co]):
    """A registered piece: ``make`` builds it from the run's options of its kind (checking
    those it reads), ``options`` names them."""

    make: Callable[[PieceOptions], P_co]
    options: tuple[str, ...] = ()


def positive(key: str, value: float) -> float:
    """``value``, or a HpcoptError unless 0 < value < inf."""
    if not (value > 0 and math.isfinite(value)):
        raise HpcoptError(f"{key} must be > 0, got {value}")
    return value


def fraction(key: str, value: float) -> float:
    """``value``, or a HpcoptError unless 0 <= value < 1 (a decay, a momentum)."""
    if not 0 <= value < 1:
        raise HpcoptError(f"{key} must be in [0, 1), got {value}")
    return value


class Pieces(Generic[P]):
    """One kind's registry: the option that names a piece (``option``, e.g. "outer_optimizer"),
    the entry-point group, the kind's options with their unset values, and the built-ins."""

    def __init__(self, option: str, group: str, unset: Mapping[str, Any],
                 builtin: Mapping[str, Piece[P]]) -> None:
        self.option, self.group, self.unset = option, group, dict(unset)
        self._builtin = dict(builtin)
        self._entry_points: dict[str, Piece[P]] | None = None
        self._by_call: dict[str, Piece[P]] = {}

    def builtin(self) -> dict[str, Piece[P]]:
        return self._builtin

    def from_entry_points(self) -> dict[str, Piece[P]]:
        """The pieces installed packages declare in ``group``; one that fails to load, is no
        ``Piece``, or takes a built-in's name, is a HpcoptError naming it."""
        if self._entry_points is None:
            found: dict[str, Piece[P]] = {}
            for point in sorted(entry_points(group=self.group), key=lambda p: p.name):
                found[point.name] = self._loaded(point)
            self._entry_points = found
        return self._entry_points

    def _loaded(self, point: EntryPoint) -> Piece[P]:
        package = f" of package {point.dist.name!r}" if point.dist is not None else ""
        where = f"entry point {point.name} = {point.value!r} (group {self.group!r}{package})"
        try:
            value = point.load()
        except BaseException as exc:  # noqa: BLE001 - whatever the user's module raised, in one line
            raise HpcoptError(f"{where} could not be loaded: {type(exc).__name__}: {exc} "
                              "(fix that package or uninstall it)") from None
        return self._checked(point.name, value, where)

    def _checked(self, name: str, piece: Any, where: str) -> Piece[P]:
        if not isinstance(piece, Piece):
            raise HpcoptError(f"{where}: {piece!r} is not a hpcopt.algorithms.Piece")
        if not name.isidentifier():
            raise HpcoptError(f"{where}: the name {name!r} is not an identifier (letters, digits, _)")
        if name in self.builtin():
            raise HpcoptError(f"{where}: {name!r} is a built-in {self.option}; choose another name")
        strange = [key for key in piece.options if key not in self.unset]
        if strange:
            raise HpcoptError(f"{where}: {', '.join(strange)} is not an option of {self.option} "
                              f"(those are {', '.join(self.unset)})")
        return piece

    def register(self, name: str, piece: Piece[P]) -> Piece[P]:
        """Register ``piece`` as ``name`` in this process (again: replaced); a built-in's or an
        entry point's name is refused."""
        where = f"{self.option} {name!r}"
        self._checked(name, piece, f"register({where})")
        if name in self.from_entry_points():
            raise HpcoptError(f"register({where}): {name!r} is already an entry point's; "
                              "choose another name")
        self._by_call[name] = piece
        return piece

    def unregister(self, name: str) -> None:
        """Forget a piece registered by call (a test's, a notebook's)."""
        self._by_call.pop(name, None)

    def modules_by_call(self) -> dict[str, str]:
        """The modules that define the pieces registered by call (their ``make``), by name."""
        return {name: getattr(getattr(piece.make, "func", piece.make), "__module__", "__main__")
                for name, piece in self._by_call.items()}

    def pieces(self) -> dict[str, Piece[P]]:
        """Name -> piece: the built-ins, the entry points' (by name), those registered by call."""
        return {**self.builtin(), **self.from_entry_points(), **self._by_call}

    def names(self) -> tuple[str, ...]:
        return tuple(self.pieces())

    def users(self, key: str) -> tuple[str, ...]:
        """The pieces that read the option ``key``."""
        return tuple(name for name, piece in self.pieces().items() if key in piece.options)

    def make(self, name: str, values: Mapping[str, Any], context: Mapping[str, Any] | None = None) -> P:
        """The piece ``name`` made from the run's ``values`` of this kind's options (a
        HpcoptError for an unknown name, or for an option it does not read that is set)."""
        pieces = self.pieces()
        if name not in pieces:
            raise HpcoptError(f"unknown {self.option} {name!r} (choose from {', '.join(pieces)})")
        piece = pieces[name]
        for key, value in values.items():
            if key not in piece.options and value != self.unset[key]:
                raise HpcoptError(f"{key} applies only to {self.option} {', '.join(self.users(key))}, "
                                  f"not {name}")
        return piece.make(PieceOptions(values, self.unset, context or {}))
