"""Flat parameter buffers: one allocation per model, named zero-copy views into it.

An averaging round is then a single in-place allreduce of one contiguous buffer. Updates must
be in place (``x -= lr * g`` through ``out=``), never ``x = x - ...``, so the views stay valid.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import prod
from typing import Any

from .backend import Backend

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and offsets of the tensors packed into one flat vector."""

    entries: tuple[tuple[str, Shape], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.entries]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate parameter names in layout: {names}")
        for name, shape in self.entries:
            if any(int(n) < 0 for n in shape):
                raise ValueError(f"negative dimension in shape of {name!r}: {shape}")

    @classmethod
    def of(cls, **shapes: Shape) -> ParamLayout:
        """``ParamLayout.of(w=(3, 4), b=(4,))``."""
        return cls.from_items(shapes.items())

    @classmethod
    def from_items(cls, items: Iterable[tuple[str, Shape]]) -> ParamLayout:
        return cls(tuple((name, tuple(int(n) for n in shape)) for name, shape in items))

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.entries]

    @property
    def size(self) -> int:
        """Total number of scalars, d."""
        return sum(prod(shape) for _, shape in self.entries)

    def slices(self) -> dict[str, slice]:
        """Name -> the slice of the flat vector that holds it."""
        out, offset = {}, 0
        for name, shape in self.entries:
            n = prod(shape)
            out[name] = slice(offset, offset + n)
            offset += n
        return out

    def zeros(self, backend: Backend, dtype: Any) -> Any:
        """One new zero-filled flat buffer of length d on the backend's device."""
        return backend.xp.zeros(self.size, dtype=dtype)

    def views(self, flat: Any) -> dict[str, Any]:
        """Name -> reshaped view of ``flat`` (no copy; writes go to the flat buffer)."""
        if flat.ndim != 1 or flat.shape[0] != self.size:
            raise ValueError(f"flat buffer has shape {flat.shape}, layout needs ({self.size},)")
        shapes = dict(self.entries)
        return {name: flat[s].reshape(shapes[name]) for name, s in self.slices().items()}
