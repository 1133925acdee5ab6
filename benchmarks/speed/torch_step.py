"""Per-step time of a torch module trained through hpcopt against a plain PyTorch loop, and the
cost of one averaging round through hpcopt's Comm.

hpcopt: ``torch_workload`` and PR-SGD (``LocalSGD`` with no average inside the timed steps),
each step the oracle (next minibatch, forward, loss, backward into the flat gradient) and the
update of the flat vector; for ``mlp_numpy`` hpcopt's own NumPy MLP of the same shape
(``ClassificationProblem``) in the module's place. PyTorch: the same module, minibatch drawn
the same way (indexing a tensor with a shuffled order), ``zero_grad``, forward, loss, backward and
``torch.optim.SGD.step`` with the same learning rate and momentum, no DDP, no communication.
One thread each (torch and BLAS), float32; rounds interleaved (benchmarks/common/versus.py). Both
under the same malloc settings: those hpcopt sets for a torch module on the CPU
(``hpcopt.torch.allocator.keep_freed_memory``, process-wide), applied before either is built, so
that the PyTorch loop reuses freed memory as hpcopt's step does (with glibc's defaults both
fault in thousands of fresh pages per step on ResNet-18, hpcopt's more: docs/torch.md, Speed).

Under ``mpiexec -n N`` every rank times its own steps at the same time as the others (a barrier
starts each timed block), and the slowest rank's median is reported, since a synchronous round
waits for it. "average" is ``comm.average_`` of a vector of the model's size, label "average"
(the call PR-SGD and CELGC make once per round), timed by the Comm's own counters, after a
barrier: the cost of a round, not the wait for a slower rank. "round of 8" compares I = 8
hpcopt steps plus one average with 8 PyTorch steps.

    python benchmarks/speed/torch_step.py [--models mlp resnet] [--rounds 7] [--calls 10]
    python benchmarks/speed/torch_step.py --ranks 1 2 [--write docs/torch.md docs/results/torch.md]

The models are, by default, those of the step-speed targets (docs/torch.md, Speed): ResNet-20,
the word LSTM, ResNet-18, the GPT LM and the MLP, the MLP also as hpcopt's own NumPy model
(its step against the same PyTorch loop). With ``--ranks``, the script runs itself under
``mpiexec -n R`` for each R, prints one table with each speed's target and the load average,
and with ``--write PAGE ...`` puts it in the section ``torch-speed`` of each PAGE.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.synthetic import SAMPLES, images, token_windows  # noqa: E402
from benchmarks.common.versus import add_timing_options, seconds_per_call  # noqa: E402
from hpcopt.algorithms.local_sgd import LocalSGD
from hpcopt.backend import CPU
from hpcopt.comm import Comm
from hpcopt.data.sampler import MinibatchSampler
from hpcopt.nn.models import mlp as numpy_mlp
from hpcopt.problems.classification import ClassificationProblem
from hpcopt.torch import TensorData, torch_workload
from hpcopt.torch.allocator import keep_freed_memory
from hpcopt.torch.models import gpt, resnet18, resnet20, word_lstm
from hpcopt.torch.text import sequence_loss

nn = torch.nn
ROUND = 8  # the I of the "round" column
GPT_VOCAB = 2560
#: The models of the step-speed targets (docs/torch.md, Speed), in the table's order.
SUITE = ("resnet20", "wordlstm", "resnet18", "gpt", "mlp", "mlp_numpy")
NO_AVERAGE = 10**9  # PR-SGD's interval while steps are timed: no average among them


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


@dataclass(frozen=True)
class Model:
    factory: Callable[[], nn.Module]
    data: Callable[[], TensorData]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch: int
    what: str
    numpy: bool = False  # hpcopt's own NumPy model of the same shape (``numpy_problem``)
    target: float = 0.97  # the speed vs torch per step it should reach (docs/torch.md, Speed)


MODELS = {
    "mlp": Model(mlp, images((784,)), nn.CrossEntropyLoss(), 32, "MLP 784-512-256-10, batch 32",
                 target=0.95),
    "mlp_numpy": Model(mlp, images((784,)), nn.CrossEntropyLoss(), 32,
                       "MLP 784-512-256-10, hpcopt's NumPy model (`hpcopt.nn.models.mlp`), batch 32",
                       numpy=True, target=0.95),
    "resnet": Model(resnet, images((3, 32, 32)), nn.CrossEntropyLoss(), 32,
                    "ResNet-8 (16-32-64) on 3x32x32, batch 32"),
    "resnet20": Model(resnet20, images((1, 28, 28)), nn.CrossEntropyLoss(), 32,
                      "ResNet-20 (`models.resnet20`) on 1x28x28, batch 32"),
    "wordlstm": Model(lambda: word_lstm(10000, 200, 200), token_windows(10000, 35), sequence_loss, 20,
                      "word LSTM (`models.word_lstm`, 10,000 words, 200 tied) on 20 windows of 35"),
    "resnet18": Model(resnet18, images((3, 32, 32)), nn.CrossEntropyLoss(), 32,
                      "ResNet-18 (`models.resnet18`, torchvision's layout) on 3x32x32, batch 32"),
    "gpt": Model(lambda: gpt(GPT_VOCAB), token_windows(GPT_VOCAB, 64), sequence_loss, 16,
                 "GPT (`models.gpt`, 2 layers of 128, 4 heads, 2,560 words) on 16 windows of 64"),
}


def numpy_problem(data: TensorData, batch: int, rank: int) -> tuple[ClassificationProblem, np.ndarray]:
    """hpcopt's NumPy MLP 784-512-256-10 (float32) on ``data`` and its initial parameters."""
    model = numpy_mlp(784, [512, 256], 10)
    x0 = model.layout.zeros(CPU, np.float32)
    model.init(x0, np.random.default_rng(0))
    sampler = MinibatchSampler(np.arange(SAMPLES), batch, 0, rank)
    return ClassificationProblem(model, data.inputs.numpy(), data.targets.numpy(), sampler, CPU), x0


def hpcopt_step(model: Model, batch: int, args: argparse.Namespace,
                comm: Comm) -> tuple[Callable[[], None], np.ndarray]:
    algorithm = LocalSGD(lr=args.lr, momentum=args.momentum, interval=NO_AVERAGE)
    if model.numpy:
        problem, x0 = numpy_problem(model.data(), batch, comm.rank)
        state = algorithm.init(x0, comm)
        return (lambda: algorithm.step(state, problem.oracle, comm)), state.x
    run = torch_workload(model.factory, model.loss, model.data(), comm, batch_size=batch, dtype="float32")
    state = algorithm.init(run.x0, comm, buffers=run.buffers)
    return (lambda: algorithm.step(state, run.problem.oracle, comm)), state.x


def torch_step(model: Model, batch: int, args: argparse.Namespace) -> Callable[[], None]:
    torch.manual_seed(0)
    module, data, loss = model.factory(), model.data(), model.loss
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=args.momentum)
    order, position = torch.randperm(SAMPLES), [0]

    def step() -> None:
        start = position[0]
        position[0] = (start + batch) % (SAMPLES - SAMPLES % batch)
        index = order[start:start + batch]
        optimizer.zero_grad(set_to_none=True)
        loss(module(data.inputs[index]), data.targets[index]).backward()
        optimizer.step()

    return step


def average_step(x: np.ndarray, comm: Comm) -> Callable[[], None]:
    """One counted average of a copy of the model vector, after a barrier (outside the count)."""
    scratch = x.copy()

    def step() -> None:
        comm.mpi.Barrier()
        comm.average_(scratch, label="average")

    return step


def measure(name: str, args: argparse.Namespace, comm: Comm) -> dict[str, float]:
    """This rank's median seconds per hpcopt step, PyTorch step and average (rounds interleaved)."""
    model = MODELS[name]
    batch = args.batch or model.batch
    step, x = hpcopt_step(model, batch, args, comm)
    steps = {"hpcopt": step, "torch": torch_step(model, batch, args)}
    average = average_step(x, comm)
    for warm in (*steps.values(), average):
        warm()
    times: dict[str, list[float]] = {key: [] for key in (*steps, "average")}
    for _ in range(args.rounds):
        for key, call in steps.items():
            comm.mpi.Barrier()
            times[key].append(seconds_per_call(call, args.calls))
        before = comm.stats.totals("average")
        calls, seconds = before.calls, before.seconds
        for _ in range(args.calls):
            average()
        after = comm.stats.totals("average")
        times["average"].append((after.seconds - seconds) / (after.calls - calls))
    medians = {key: statistics.median(t) for key, t in times.items()}
    return {**medians, "parameters": int(x.size), "mb": x.nbytes / 1e6}


def slowest(local: dict[str, float], comm: Comm) -> dict[str, float]:
    """Each timing's maximum over the ranks."""
    gathered = comm.mpi.allgather(local)
    return {key: max(g[key] for g in gathered) for key in local}


def row(name: str, ranks: int, m: dict[str, float]) -> dict[str, object]:
    return {"model": name, "ranks": ranks, "parameters": m["parameters"], "mb": m["mb"],
            "hpcopt_ms": 1e3 * m["hpcopt"], "torch_ms": 1e3 * m["torch"],
            "average_ms": 1e3 * m["average"], "speed": m["torch"] / m["hpcopt"],
            "round_speed": ROUND * m["torch"] / (ROUND * m["hpcopt"] + m["average"])}


def table(rows: list[dict], args: argparse.Namespace, load: str = "") -> str:
    lines = [f"torch {torch.__version__}, 1 thread per rank, float32, momentum {args.momentum:g}; "
             f"median of {args.rounds} interleaved rounds of {args.calls} calls, slowest rank"
             f"{load}", "",
             "| model | ranks | parameters | hpcopt ms/step | torch ms/step | speed vs torch | target | "
             f"average ms/round (MB) | round of {ROUND} steps + average vs {ROUND} torch steps |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        model = MODELS[r["model"]]
        average = f"{r['average_ms']:.2f} ({r['mb']:.1f})" if r["ranks"] > 1 else "-"
        verdict = "met" if r["speed"] >= model.target else "short"
        lines.append(f"| {model.what} | {r['ranks']} | {r['parameters']:,} | "
                     f"{r['hpcopt_ms']:.1f} | {r['torch_ms']:.1f} | {r['speed']:.3f}x | "
                     f"{model.target:.2f}x {verdict} | {average} | {r['round_speed']:.3f}x |")
    return "\n".join(lines)


def load_average() -> str:
    """The machine's 1-minute load average (other jobs share its cores)."""
    return f"{os.getloadavg()[0]:.1f}"


def launch(args: argparse.Namespace) -> None:
    """Run this script under mpiexec -n R for every R of --ranks; print (and write) the table."""
    from benchmarks.common.launch import run_script
    from benchmarks.common.sections import replace_section

    rows, before = [], load_average()
    for ranks in args.ranks:
        output = run_script(ranks, __file__, "--json", "--models", *args.models,
                            "--rounds", str(args.rounds), "--calls", str(args.calls),
                            "--lr", str(args.lr), "--momentum", str(args.momentum),
                            "--averaging", args.averaging,
                            *(["--batch", str(args.batch)] if args.batch else []))
        rows += [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    text = table(rows, args, f"; load average {before} at the start, {load_average()} at the end")
    print(text)
    command = (f"python benchmarks/speed/torch_step.py --ranks {' '.join(map(str, args.ranks))} "
               f"--models {' '.join(args.models)} --rounds {args.rounds} --calls {args.calls}"
               + (f" --averaging {args.averaging}" if args.averaging != "auto" else ""))
    for page in args.write or ():
        replace_section(page, "torch-speed", f"`{command} --write PAGE`:\n\n{text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(SUITE))
    parser.add_argument("--batch", type=int, default=0,
                        help="batch per rank (0: the model's: 32, 20 windows)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--ranks", type=int, nargs="+", help="run under mpiexec -n R for each R")
    parser.add_argument("--write", type=Path, nargs="+",
                        help="with --ranks: the pages whose torch-speed section to write")
    parser.add_argument("--averaging", choices=["auto", "mpi", "shm"], default="auto",
                        help="the Comm's averaging path (auto, shm: the flat vectors in node-shared "
                        "memory; mpi: in private memory)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    add_timing_options(parser)
    args = parser.parse_args()
    if args.ranks:
        launch(args)
        return
    torch.set_num_threads(1)
    keep_freed_memory()
    comm = Comm(averaging=args.averaging)
    rows = []
    with threadpool_limits(1):
        for name in args.models:
            rows.append(row(name, comm.size, slowest(measure(name, args, comm), comm)))
            if comm.rank == 0 and args.json:
                print(json.dumps(rows[-1]), flush=True)
    if comm.rank == 0 and not args.json:
        print(table(rows, args))
    comm.free()


if __name__ == "__main__":
    sys.exit(main())
