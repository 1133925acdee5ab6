"""Your own problem on hpcopt's algorithms: least squares, local SGD on every rank.

    mpiexec -n 4 python docs/examples/least_squares.py

A ``Workload`` is the model's flat parameter vector (with the names and shapes of its parts),
an oracle that draws this rank's next minibatch and writes the gradient, a sampler whose
state a checkpoint keeps, and an evaluation. hpcopt supplies the rest: the algorithm, the
averaging, the trace, checkpoints and resume.
"""

import math

import numpy as np
from mpi4py import MPI

import hpcopt
from hpcopt.data.sampler import MinibatchSampler
from hpcopt.flat import ParamLayout
from hpcopt.problems.classification import Evaluation

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
rng = np.random.default_rng(0)  # the same data on every rank; each trains on its own rows
a = rng.standard_normal((4096, 20))
b = a @ rng.standard_normal(20) + 0.1 * rng.standard_normal(4096)
mine_a, mine_b = a[rank::size], b[rank::size]


class LeastSquares:
    """0.5 mean (a_i . w - b_i)^2 over a minibatch of this rank's rows."""

    def __init__(self) -> None:
        self.sampler = MinibatchSampler(np.arange(mine_b.size), 32, seed=0, rank=rank)

    def oracle(self, w: np.ndarray, grad: np.ndarray) -> float:
        rows = self.sampler.next_batch()
        residual = mine_a[rows] @ w - mine_b[rows]
        grad[...] = mine_a[rows].T @ residual / rows.size
        return 0.5 * float(residual @ residual) / rows.size


def evaluate(w, scratch, comm, buffers=None) -> Evaluation:
    residual = a @ w - b
    return Evaluation(0.5 * float(residual @ residual) / b.size, math.nan, b.size)


problem = LeastSquares()
workload = hpcopt.Workload(ParamLayout.of(w=(20,)), problem, np.zeros(20), evaluate,
                           steps_per_epoch=problem.sampler.batches_per_epoch,
                           description="least squares, 4096 x 20")
config = hpcopt.build_config(None, {"algorithm": "prsgd", "interval": "8", "lr": "0.05",
                                    "epochs": "5", "dtype": "float64"})
summary, state = hpcopt.train(config, workload=workload)
if rank == 0:
    print(f"test loss {summary.final.loss:.5f} after {summary.steps} steps, "
          f"{summary.rounds} averaging rounds")
