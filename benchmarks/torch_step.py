"""Per-step time of a torch module trained through hpcopt against a plain PyTorch loop.

hpcopt: ``torch_workload`` and PR-SGD (``LocalSGD``, one rank, averaging every ``--interval``
steps), each step the oracle (next minibatch, forward, loss, backward into the flat gradient)
and the update of the flat vector. PyTorch: the same module, minibatch drawn the same way
(indexing a tensor with a shuffled order), ``zero_grad``, forward, loss, backward and
``torch.optim.SGD.step`` with the same learning rate and momentum. One thread each (torch and
BLAS), float32, batch 32 by default; rounds interleaved (benchmarks/versus.py). The table gives
the median milliseconds per step and hpcopt's speed relative to PyTorch (torch time / hpcopt
time; above 1 is faster).

    python benchmarks/torch_step.py [--batch 32] [--models mlp resnet] [--rounds 7] [--calls 10]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from threadpoolctl import threadpool_limits
from versus import add_timing_options, interleaved_medians  # benchmarks/versus.py

from hpcopt.algorithms.local_sgd import LocalSGD
from hpcopt.comm import Comm
from hpcopt.torch import TensorData, torch_workload

nn = torch.nn
SAMPLES = 1024


class Block(nn.Module):
    """A basic residual block: two 3x3 convolutions with batch norm, 1x1 projection on a change."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                  nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cout))
        self.skip = (nn.Identity() if stride == 1 and cin == cout else
                     nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet() -> nn.Module:
    """ResNet-8 for 3x32x32 images: 16-32-64 channels, one block per stage."""
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10))


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (mlp, (784,)), "resnet": (resnet, (3, 32, 32))}


def dataset(shape: tuple[int, ...]) -> TensorData:
    g = torch.Generator().manual_seed(0)
    return TensorData(torch.randn(SAMPLES, *shape, generator=g),
                      torch.randint(0, 10, (SAMPLES,), generator=g))


def hpcopt_step(name: str, args: argparse.Namespace, comm: Comm) -> tuple[Callable[[], None], int]:
    factory, shape = MODELS[name]
    run = torch_workload(factory, nn.CrossEntropyLoss(), dataset(shape), comm, batch_size=args.batch,
                          dtype="float32")
    algorithm = LocalSGD(lr=args.lr, momentum=args.momentum, interval=args.interval)
    state = algorithm.init(run.x0, comm, buffers=run.buffers)
    return (lambda: algorithm.step(state, run.problem.oracle, comm)), run.problem.model.layout.size


def torch_step(name: str, args: argparse.Namespace) -> Callable[[], None]:
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    module, data, loss = factory(), dataset(shape), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=args.momentum)
    order, position = torch.randperm(SAMPLES), [0]

    def step() -> None:
        start = position[0]
        position[0] = (start + args.batch) % (SAMPLES - SAMPLES % args.batch)
        index = order[start:start + args.batch]
        optimizer.zero_grad(set_to_none=True)
        loss(module(data.inputs[index]), data.targets[index]).backward()
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--interval", type=int, default=8, help="PR-SGD's I (one rank: a no-op average)")
    add_timing_options(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = Comm()
    print(f"torch {torch.__version__}, 1 thread, float32, batch {args.batch}, momentum {args.momentum}, "
          f"median of {args.rounds} rounds of {args.calls} steps")
    print(f"{'model':<8} {'parameters':>11} {'hpcopt ms':>10} {'torch ms':>9} {'speed vs torch':>15}")
    with threadpool_limits(1):
        for name in args.models:
            step, size = hpcopt_step(name, args, comm)
            medians = interleaved_medians({"hpcopt": step, "torch": torch_step(name, args)},
                                          args.rounds, args.calls)
            ms = {k: 1e3 * v for k, v in medians.items()}
            print(f"{name:<8} {size:>11,} {ms['hpcopt']:>10.3f} {ms['torch']:>9.3f} "
                  f"{ms['torch'] / ms['hpcopt']:>14.3f}x")
    comm.free()


if __name__ == "__main__":
    main()
