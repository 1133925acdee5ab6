"""DiLoCo: PR-SGD with AdamW as the inner optimizer and Nesterov momentum as the outer one.

Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen, "DiLoCo: Distributed
Low-Communication Training of Language Models", arXiv 2311.08105, 2023 (Algorithm 1; OpenDiLoCo,
Jaghouar, Ong, Hagemann, arXiv 2407.07852, 2024, runs the same). Every rank runs I (the paper's
H) AdamW steps from the common x_0, then, with the round's one allreduce::

    Delta = x_0 - (1/N) sum_i x_i                (the outer gradient, the same on every rank)
    b <- mu b + Delta;  x_0 <- x_0 - lr_outer (Delta + mu b)

A preset of ``--algorithm prsgd``: its options, with the paper's outer step (Nesterov, lr 0.7,
momentum 0.9) and AdamW at PyTorch's defaults (lr 1e-3, betas 0.9 and 0.999, eps 1e-8, weight
decay 0.01) as defaults; ``--algorithm prsgd --outer-optimizer nesterov --outer-lr 0.7
--outer-momentum 0.9 --inner-optimizer adamw --lr 0.001 --weight-decay 0.01`` computes the
same. H is the run's choice (``interval`` keeps PR-SGD's default; the paper's is 500); AdamW's
state stays on each rank (``keep``, as in the paper) unless the momentum policies say otherwise.
``--preset diloco-paper`` (``hpcopt.presets``) sets the paper's lr 4e-4, weight decay 0.1,
H = 500 and its warmup and cosine schedule (docs/algorithms.md compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import option
from .local_sgd import LocalSGD
from .outer import DILOCO_LR, DILOCO_MOMENTUM


@dataclass(frozen=True, kw_only=True)
class DiLoCo(LocalSGD):
    """PR-SGD with DiLoCo's optimizers as its defaults (the help texts are PR-SGD's)."""

    name: ClassVar[str] = "diloco"
    #: Its outer lr and mu are its Nesterov's: with another outer_optimizer, those left unset
    #: take that optimizer's own (hpcopt.config; FedAdam with lr 0.7 diverged without a word).
    defaults_with: ClassVar[dict[str, str]] = {"outer_lr": "outer_optimizer",
                                               "outer_momentum": "outer_optimizer"}

    lr: float = option(1e-3, "learning rate eta")
    weight_decay: float = option(0.01, "weight decay wd")
    inner_optimizer: str = option("adamw", "the local step")
    outer_optimizer: str = option("nesterov", "what a round does with the ranks' mean")
    outer_lr: float = option(DILOCO_LR, "the outer optimizer's learning rate")
    outer_momentum: float = option(DILOCO_MOMENTUM, "the outer optimizer's momentum")
