"""Where a sequential model is cut into pipeline stages, and what each stage owns.

Stage s holds the consecutive layers ``layers[bounds[s]:bounds[s+1]]`` and the slice of the
model's flat parameter vector that those layers occupy (Sequential packs parameters in layer
order, so a stage's parameters are one contiguous block). Within a block, the trainable
parameters (layers not named in ``frozen``) must also be contiguous: the optimizer state of a
stage is then one flat vector, a view ``block[trainable]``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from math import prod

from ..errors import HpcoptError
from ..nn import Layer, Sequential


def _param_count(layer: Layer) -> int:
    return sum(prod(shape) for _, shape in layer.param_shapes())


@dataclass(frozen=True)
class StagePlan:
    """Stage boundaries over a model's layer list: stage s is ``layers[bounds[s]:bounds[s+1]]``."""

    bounds: tuple[int, ...]

    def __post_init__(self) -> None:
        b = self.bounds
        if len(b) < 2 or b[0] != 0 or any(lo >= hi for lo, hi in zip(b[:-1], b[1:])):
            raise HpcoptError(f"stage bounds must rise strictly from 0 (every stage needs a "
                              f"layer), got {list(b)}")

    @property
    def num_stages(self) -> int:
        return len(self.bounds) - 1

    def check_world_size(self, size: int) -> None:
        """HpcoptError unless the job has exactly one rank per stage (call it before any work)."""
        if size != self.num_stages:
            raise HpcoptError(f"the pipeline has {self.num_stages} stage(s) but runs on {size} "
                              f"rank(s): launch with mpiexec -n {self.num_stages}")

    @classmethod
    def explicit(cls, model: Sequential, boundaries: Sequence[int]) -> StagePlan:
        """Cut before each layer index in ``boundaries`` (Delta - 1 increasing indices)."""
        n = len(model.layers)
        if any(not 0 < b < n for b in boundaries):
            raise HpcoptError(f"stage boundaries must be layer indices in 1..{n - 1}, "
                              f"got {list(boundaries)}")
        return cls((0, *boundaries, n))

    @classmethod
    def balanced(cls, model: Sequential, num_stages: int) -> StagePlan:
        """Contiguous cut minimising the largest stage's parameter count.

        Cuts fall just before a layer with parameters, so parameter-free layers (activations)
        stay with the layer before them. Exact (dynamic programming over the cut points).
        """
        layers = model.layers
        cuts = [i for i, layer in enumerate(layers) if i > 0 and _param_count(layer) > 0]
        if num_stages < 1 or num_stages - 1 > len(cuts):
            raise HpcoptError(f"cannot cut a model with {len(cuts) + 1} parameter block(s) into "
                              f"{num_stages} stages: give explicit stage boundaries")
        points = [0, *cuts, len(layers)]
        counts = [_param_count(layer) for layer in layers]
        prefix = [0]
        for c in counts:
            prefix.append(prefix[-1] + c)

        def load(i: int, j: int) -> int:
            return prefix[points[j]] - prefix[points[i]]

        m = len(points) - 1
        inf = float("inf")
        # best[s][j]: smallest max load cutting points[0..j] into s stages; arg for the cut
        best = [[inf] * (m + 1) for _ in range(num_stages + 1)]
        arg = [[0] * (m + 1) for _ in range(num_stages + 1)]
        best[0][0] = 0
        for s in range(1, num_stages + 1):
            for j in range(s, m + 1):
                for i in range(s - 1, j):
                    value = max(best[s - 1][i], load(i, j))
                    if value < best[s][j]:
                        best[s][j], arg[s][j] = value, i
        ends, j = [], m
        for s in range(num_stages, 0, -1):
            ends.append(points[j])
            j = arg[s][j]
        return cls((0, *reversed(ends)))

    def layers(self, model: Sequential, stage: int) -> list[Layer]:
        return model.layers[self.bounds[stage]:self.bounds[stage + 1]]

    def param_slice(self, model: Sequential, stage: int) -> slice:
        """The slice of the model's flat parameter vector that stage ``stage`` owns."""
        sizes = [_param_count(layer) for layer in model.layers]
        lo = sum(sizes[:self.bounds[stage]])
        return slice(lo, lo + sum(sizes[self.bounds[stage]:self.bounds[stage + 1]]))

    def trainable_slices(self, model: Sequential, frozen: Collection[str]) -> list[slice]:
        """``trainable_slice`` of every stage (so that every rank can check every stage)."""
        return [self.trainable_slice(model, s, frozen) for s in range(self.num_stages)]

    def trainable_slice(self, model: Sequential, stage: int, frozen: Collection[str]) -> slice:
        """The trainable part of stage ``stage``'s block, relative to the block's start.

        Empty (``slice(0, 0)``) for a frozen stage. HpcoptError when the stage's trainable layers
        are not contiguous (a frozen layer with parameters between two trainable ones).
        """
        unknown = set(frozen) - {layer.name for layer in model.layers}
        if unknown:
            raise HpcoptError(f"frozen names no layer of the model: {sorted(unknown)}")
        offset, spans = 0, []
        for layer in self.layers(model, stage):
            n = _param_count(layer)
            if n and layer.name not in frozen:
                spans.append((offset, offset + n, layer.name))
            offset += n
        if not spans:
            return slice(0, 0)
        if any(a[1] != b[0] for a, b in zip(spans[:-1], spans[1:])):
            raise HpcoptError(f"stage {stage}: trainable layers {[s[2] for s in spans]} are not "
                              "contiguous; freeze fewer layers or cut the stages differently")
        return slice(spans[0][0], spans[-1][1])
