"""Where the time of a step goes: hpcopt's step (benchmarks/speed/torch_step.py) taken apart next to
PyTorch's, for the models of the step-speed targets, one rank, one thread, float32.

Per model, in interleaved rounds (benchmarks/common/versus.py): the whole PyTorch step and the whole
hpcopt step; ``torch.optim.SGD.step`` alone (momentum, on the module's gradients); hpcopt's
oracle (minibatch, forward, loss, backward, the gradient's copy into the flat vector), the copy
alone (the module's fresh gradient tensors into the flat gradient) and the update alone
(``inner_step``, PR-SGD's local step); the copy alone reads gradients out of cache, where the
oracle's copies (``TorchModel.backward``'s hook) read them just made. hpcopt's step minus
PyTorch's is what is left to find.

    python benchmarks/speed/torch_step_parts.py [--models resnet18 gpt] [--rounds 7] [--calls 5]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.versus import add_timing_options, interleaved_medians  # noqa: E402
from benchmarks.speed.torch_step import MODELS, NO_AVERAGE, SUITE, torch_step  # noqa: E402
from hpcopt.algorithms.local_sgd import LocalSGD
from hpcopt.comm import Comm
from hpcopt.torch import torch_workload
from hpcopt.torch.allocator import keep_freed_memory
from hpcopt.torch.arrays import as_tensor

PARTS = ("torch step", "hpcopt step", "SGD.step", "oracle", "copy", "update")


def parts(name: str, args: argparse.Namespace, comm: Comm) -> dict[str, float]:
    """Median seconds of each of PARTS for model ``name``."""
    model = MODELS[name]
    run = torch_workload(model.factory, model.loss, model.data(), comm, batch_size=model.batch,
                         dtype="float32")
    algorithm = LocalSGD(lr=args.lr, momentum=args.momentum, interval=NO_AVERAGE)
    state = algorithm.init(run.x0, comm, buffers=run.buffers)
    oracle = run.problem.oracle
    module = model.factory()
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=args.momentum)
    for p in module.parameters():
        p.grad = torch.randn_like(p)
    trained = run.problem.model.layout.views(state.grad).values()
    views = [as_tensor(v) for v in trained]
    fresh = [v.clone() for v in views]

    def copy() -> None:
        for view, gradient in zip(views, fresh):
            view.copy_(gradient)

    steps: dict[str, Callable[[], Any]] = {
        "torch step": torch_step(model, model.batch, args),
        "hpcopt step": lambda: algorithm.step(state, oracle, comm),
        "SGD.step": optimizer.step,
        "oracle": lambda: oracle(state.x, state.grad),
        "copy": copy,
        "update": lambda: algorithm.inner_step(state, args.lr),
    }
    return interleaved_medians(steps, args.rounds, args.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=[m for m in SUITE if not MODELS[m].numpy],
                        default=[m for m in SUITE if not MODELS[m].numpy])
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    add_timing_options(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # both loops under the same malloc settings (benchmarks/torch_step.py)
    comm = Comm()
    print(f"torch {torch.__version__}, 1 thread, float32, momentum {args.momentum:g}; median of "
          f"{args.rounds} interleaved rounds of {args.calls} calls; ms\n")
    print("| model | " + " | ".join(PARTS) + " | hpcopt - torch | copy + update - SGD.step |")
    print("|---|" + "---:|" * (len(PARTS) + 2))
    with threadpool_limits(1):
        for name in args.models:
            ms = {key: 1e3 * value for key, value in parts(name, args, comm).items()}
            cells = " | ".join(f"{ms[key]:.2f}" for key in PARTS)
            print(f"| {name} | {cells} | {ms['hpcopt step'] - ms['torch step']:+.2f} | "
                  f"{ms['copy'] + ms['update'] - ms['SGD.step']:+.2f} |", flush=True)
    comm.free()


if __name__ == "__main__":
    sys.exit(main())
