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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import HpcoptError
from .base import option
from .data_parallel import DataParallelState
from .local_sgd import LocalSGD
from .state import shared

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any


@dataclass
class SlowMoState(DataParallelState):
    """PR-SGD's state, the round's starting point x_{t,0} and the slow momentum u_t."""

    anchor: Array = shared()
    slow_buffer: Array = shared()


@dataclass(frozen=True, kw_only=True)
class SlowMo(LocalSGD):
    """SlowMo hyper-parameters: PR-SGD's, and the slow momentum beta and step alpha."""

    name: ClassVar[str] = "slowmo"

    slow_momentum: float = option(0.5, "slow momentum beta on the averaged model (0 = none)")
    slow_lr: float = option(1.0, "slow learning rate alpha (1, with slow_momentum 0: prsgd)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.slow_momentum < 1:
            raise HpcoptError(f"slow_momentum must be in [0, 1), got {self.slow_momentum}")
        if not (self.slow_lr > 0 and math.isfinite(self.slow_lr)):
            raise HpcoptError(f"slow_lr must be > 0, got {self.slow_lr}")

    def init(self, x0: Array, comm: Comm, buffers: Array | None = None) -> SlowMoState:
        state = self.new_state(x0, comm, buffers, SlowMoState)
        state.anchor = state.x.copy()
        state.slow_buffer = comm.backend.xp.zeros_like(state.x)
        return state

    def average(self, state: DataParallelState, comm: Comm) -> None:
        """PR-SGD's round, then the slow step from the round's start to the new average."""
        assert isinstance(state, SlowMoState)
        super().average(state, comm)
        eta = self.lr_at(state.rounds * self.interval - 1)
        delta = state.grad  # free between steps: (x_{t,0} - x_{t,I}) / eta
        delta[...] = state.anchor
        delta -= state.x
        delta /= eta
        state.slow_buffer *= self.slow_momentum
        state.slow_buffer += delta
        delta[...] = state.slow_buffer
        delta *= self.slow_lr * eta
        state.anchor -= delta
        state.x[...] = state.anchor

    def describe(self) -> str:
        return f"{super().describe()}, beta={self.slow_momentum:g}, alpha={self.slow_lr:g}"
