"""SlowMo: local SGD with a slow momentum step on the averaged model at every round.

Wang, Tantia, Ballas, Rabbat, "SlowMo: Improving Communication-Efficient Distributed SGD with
Slow Momentum", ICLR 2020 (Algorithm 1, local SGD as the base optimizer). Every round t starts
from the common x_{t,0}; each rank runs PR-SGD's I local steps (with its own momentum buffer,
under ``momentum_policy``), then::

    x_{t,I} = (1/N) sum_i x_{t,I}^i                       (one allreduce, label "average")
    u_{t+1} = beta u_t + (x_{t,0} - x_{t,I}) / eta_t      (the slow momentum, on every rank)
    x_{t+1,0} = x_{t,0} - alpha eta_t u_{t+1}

eta_t is the base step size at the round's last nominal step. beta = ``slow_momentum``,
alpha = ``slow_lr``; with beta = 0 and alpha = 1 it is PR-SGD (up to rounding: the round's
average is taken apart and put back together). No extra communication: u and x_{t,0} are the
same on every rank. A run that ends mid-round ends with the plain average (no slow step).

It is PR-SGD with the outer optimizer ``slowmo`` of ``hpcopt.algorithms.outer`` (``--algorithm
prsgd --outer-optimizer slowmo --outer-lr alpha --outer-momentum beta`` computes the same), under
its own option names, with u saved as ``slow_buffer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from .base import option
from .data_parallel import DataParallelState
from .local_sgd import RestartedSGD
from .outer import Outer, OuterOptimizer
from .pieces import fraction, positive
from .state import shared

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any


@dataclass
class SlowMoState(DataParallelState):
    """PR-SGD's state (with the round's starting point x_{t,0} as ``anchor``) and the slow
    momentum u_t."""

    slow_buffer: Array = shared()


@dataclass(frozen=True, kw_only=True)
class SlowMo(RestartedSGD):
    """SlowMo hyper-parameters: PR-SGD's, and the slow momentum beta and step alpha."""

    name: ClassVar[str] = "slowmo"

    slow_momentum: float = option(0.5, "slow momentum beta on the averaged model (0 = none)")
    slow_lr: float = option(1.0, "slow learning rate alpha (1, with slow_momentum 0: prsgd)")

    @cached_property
    def outer(self) -> Outer:
        """The outer optimizer slowmo, under SlowMo's option names, its u in ``slow_buffer``."""
        return OuterOptimizer("slowmo", positive("slow_lr", self.slow_lr),
                              fraction("slow_momentum", self.slow_momentum), "slow_buffer")

    def init(self, x0: Array, comm: Comm, buffers: Array | None = None) -> SlowMoState:
        return self.new_state(x0, comm, buffers, SlowMoState)

    def describe(self) -> str:
        return (f"I={self.interval}{self.describe_groups()}{self.describe_inner()}, "
                f"beta={self.slow_momentum:g}, alpha={self.slow_lr:g}{self.describe_fragments()}")
