"""Synthetic data for the step-speed benchmarks: ``SAMPLES`` random images or word windows, the
same for every run (seed 0), made only when a benchmark calls the maker (torch is imported then,
so a script can write its page from saved numbers without torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcopt.torch import TensorData

#: Rows of every synthetic data set.
SAMPLES = 1024


def images(shape: tuple[int, ...]) -> Callable[[], TensorData]:
    """A maker of ``SAMPLES`` Gaussian images of ``shape`` with labels of 10 classes."""
    def make() -> TensorData:
        import torch

        from hpcopt.torch import TensorData

        g = torch.Generator().manual_seed(0)
        return TensorData(torch.randn(SAMPLES, *shape, generator=g),
                          torch.randint(0, 10, (SAMPLES,), generator=g))
    return make


def token_windows(vocab: int, length: int) -> Callable[[], TensorData]:
    """A maker of ``SAMPLES`` windows of ``length`` random word ids of a ``vocab``-word vocabulary,
    with random next-word targets."""
    def make() -> TensorData:
        import torch

        from hpcopt.torch import TensorData

        g = torch.Generator().manual_seed(0)
        return TensorData(torch.randint(0, vocab, (SAMPLES, length), generator=g),
                          torch.randint(0, vocab, (SAMPLES, length), generator=g))
    return make
