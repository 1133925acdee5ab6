"""Pieces of one's own (docs/python.md, "A piece of your own"): an outer optimizer and a reducer,
registered by call, then chosen by their flags as the built-in ones are.

    mpiexec -n 2 python docs/examples/own_pieces.py

``lion`` (``--outer-optimizer lion``) is Lion on the round's pseudo-gradient, with its own
defaults; ``float64_sum`` (``--wire float64_sum``) takes the ranks' mean with its sum in
float64. Both reach every round there is: whole-model rounds, Streaming DiLoCo's fragments, a
wire, the group rounds between (tests/mpi/test_own_pieces.py checks them against serial
references, and a resume of each bit for bit).
"""

from dataclasses import dataclass
from typing import ClassVar

from mpi4py import MPI

from hpcopt.algorithms import Piece, array_module, fraction, outer_optimizers, positive, reducers


@dataclass(frozen=True)
class Lion:
    """Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023) on Delta =
    x_0 - mean: x_0 <- x_0 - lr sign(b1 m + (1 - b1) Delta), m <- b2 m + (1 - b2) Delta."""

    lr: float
    beta1: float
    beta2: float
    fields: ClassVar[tuple[str, ...]] = ("anchor", "lion_m")  # shared: the same on every rank

    def new_state(self, x):
        return {"anchor": x.copy(), "lion_m": array_module(x).zeros_like(x)}

    def step(self, mean, state, scratch, eta):
        anchor, m, xp = state["anchor"], state["lion_m"], array_module(mean)
        delta = xp.subtract(anchor, mean, out=scratch)
        direction = xp.sign(self.beta1 * m + (1 - self.beta1) * delta)
        m[...] = self.beta2 * m + (1 - self.beta2) * delta
        anchor -= self.lr * direction
        mean[...] = anchor

    def describe(self):
        return f"outer lion (lr {self.lr:g}, betas {self.beta1:g}, {self.beta2:g})"


outer_optimizers.register("lion", Piece(  # its own defaults where the flags are left unset
    lambda o: Lion(positive("outer_lr", o.get("outer_lr", 1e-3)),
                   fraction("outer_momentum", o.get("outer_momentum", 0.9)),
                   fraction("outer_beta2", o.get("outer_beta2", 0.99))),
    options=("outer_lr", "outer_momentum", "outer_beta2")))


@dataclass(frozen=True)
class Float64Sum:
    """x <- the ranks' mean, summed in float64 whatever x's dtype (rounded once); no state."""

    declared: ClassVar[tuple] = ()
    in_flight: ClassVar[bool] = False  # a fragment's round waits for it

    def new_state(self, x):
        return {}

    def mean_(self, x, state, part, comm, label):
        wide = x.astype("float64")
        comm.allreduce_(wide, MPI.SUM, label=label)
        wide /= comm.size
        x[...] = wide


reducers.register("float64_sum", Piece(lambda options: Float64Sum()))


if __name__ == "__main__":
    import hpcopt

    show = print if MPI.COMM_WORLD.Get_rank() == 0 else (lambda *_: None)
    run = {"dataset": "digits", "hidden": "16", "steps": "24", "interval": "4", "progress": "false"}
    for options in ({"outer_optimizer": "lion"},
                    {"outer_optimizer": "lion", "outer_lr": "0.002", "fragments": "2"},
                    {"outer_optimizer": "lion", "wire": "int8", "group_size": "1", "group_interval": "2"},
                    {"wire": "float64_sum", "fragments": "2", "outer_optimizer": "nesterov"}):
        summary, _ = hpcopt.train(hpcopt.build_config(None, {**run, **options}), verbose=False)
        show(f"{options}: train loss {summary.train_loss:.4f}")
