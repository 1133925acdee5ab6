"""hpcopt's PR-SGD and CELGC against PyTorch's DDP, averager and clipping, and cost against d.

The peers at 2 ranks in one job, and how the cost of a step and of an average grows with the
model's size d.

Pairs, each timed on the same model, batch, data and threads (one per rank), momentum 0.9:

* PR-SGD I = 1 (``LocalSGD(interval=1)``: every step one average of x) against
  ``DistributedDataParallel`` (gloo, default buckets: the gradients' allreduce overlapped with
  backward, buffers broadcast at every forward);
* PR-SGD I = 8 against ``torch.optim.SGD`` with ``PeriodicModelAverager(period=8,
  warmup_steps=0)`` (one allreduce of the parameters after every 8th step);
* CELGC I = 8 (``LocalClip``: step min(lr, gamma / ||g||) d) against per-rank
  ``clip_grad_norm_(max_norm=gamma / lr)``, ``SGD.step`` and the same averager;

and plain PyTorch (no communication) as the baseline of where the time goes. hpcopt's side is the
step ``python -m hpcopt train --model torch:hpcopt.torch.models:NAME`` runs: ``torch_workload``
and the algorithm's ``step`` (the runner's trace and NaN guard add nothing when not armed).
Rounds are interleaved: every variant runs one block of 8 steps per round (the pairs' order
flips from round to round), a barrier before each block; a block's time is the slowest rank's,
and the page shows the median block over the rounds. Averaging per round: hpcopt's Comm counts
its own calls (seconds, bytes); the averager's calls are timed around ``average_parameters``;
DDP's reduction runs inside backward, so its exposed part is DDP's step minus the plain step.
Bytes per rank per round: what hpcopt's Comm counted (every label), and for torch the
parameters the averager or DDP reduces (DDP: plus the buffers it broadcasts every step).

Growth: float32 vectors of d = 1 MB ... 256 MB. The step overhead is hpcopt's local step (PR-SGD
without an average) minus PyTorch's ``SGD`` step on a module holding d bytes of parameters in 8
tensors whose forward reads each once (the passes over the parameters are the whole step); the
average is ``Comm.average_`` of a vector kept where training keeps x (``Comm.shared_like``:
node-shared memory, averaged in place) against ``torch.distributed.all_reduce`` + ``div_`` over
gloo. The memory ceiling comes from ``benchmarks/speed/shm_ceiling.py`` (run as its own job after this one),
drawn as d over its ceiling GB/s; without that script the page says so and draws none.

    python benchmarks/speed/peers.py [--quick] [--page docs/results/peers.md]

writes the page (default docs/results/peers.md; ``--quick``: prints it, writes nothing unless
``--page`` is given), its figure and the run's numbers (``run.json``) under ``peers/`` next to it.
Each model gets as many interleaved rounds as fit its share of ``--budget`` (780 s: the whole run
takes about 15 minutes on a loaded 2-core machine), at least 3 and at most ``--rounds`` (9).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout: benchmarks.common

from benchmarks.common.synthetic import SAMPLES, images, token_windows  # noqa: E402

PAGE = ROOT / "docs" / "results" / "peers.md"
CEILING_SCRIPT = ROOT / "benchmarks" / "speed" / "shm_ceiling.py"
MB = 1 << 20
INTERVAL = 8      # the I of the periodic pairs, and the steps of every timed block
GPT_VOCAB = 2560
RANKS = 2
NO_AVERAGE = 10**9  # PR-SGD's interval for a local step with no average
#: The variants timed per model: (key, what the page calls it).
VARIANTS = {"torch": "plain PyTorch (no communication)", "prsgd1": "hpcopt PR-SGD I = 1",
            "ddp": "torch DDP (gloo)", "prsgd8": "hpcopt PR-SGD I = 8",
            "averager": "torch SGD + PeriodicModelAverager(8)", "celgc": "hpcopt CELGC I = 8",
            "clip": "torch clip_grad_norm_ + SGD + averager(8)"}
#: (hpcopt's variant, its peer's), in the page's order; a round runs them pair by pair.
PAIRS = (("prsgd1", "ddp"), ("prsgd8", "averager"), ("celgc", "clip"))
SUITE = ("resnet20", "wordlstm", "resnet18", "gpt")
FULL = {"rounds": 9, "budget": 780.0, "sizes": "1M,4M,16M,64M,256M", "growth_rounds": 5}
QUICK = {"rounds": 1, "budget": 120.0, "sizes": "1M,16M", "growth_rounds": 2}
MIN_ROUNDS = 3     # a median of fewer is no median
GROWTH_SHARE = 0.15  # of --budget, kept for the growth sizes


# -- the models ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    """A module factory with its data (``SAMPLES`` rows), loss and batch per rank."""

    factory: Callable[[], Any]
    data: Callable[[], Any]           # -> hpcopt.torch.TensorData
    loss: Callable[[Any, Any], Any]
    batch: int
    what: str


def models() -> dict[str, Model]:
    """The page's models (those of docs/torch.md's speed targets), built lazily."""
    import torch

    from hpcopt.torch.models import gpt, resnet18, resnet20, word_lstm
    from hpcopt.torch.text import sequence_loss

    cross_entropy = torch.nn.CrossEntropyLoss()
    return {
        "resnet20": Model(resnet20, images((1, 28, 28)), cross_entropy, 32,
                          "ResNet-20 (`models.resnet20`) on 1x28x28, batch 32"),
        "wordlstm": Model(lambda: word_lstm(10000, 200, 200), token_windows(10000, 35), sequence_loss,
                          20, "word LSTM (`models.word_lstm`, 10,000 words, 200 tied), 20 windows of 35"),
        "resnet18": Model(resnet18, images((3, 32, 32)), cross_entropy, 32,
                          "ResNet-18 (`models.resnet18`) on 3x32x32, batch 32"),
        "gpt": Model(lambda: gpt(GPT_VOCAB), token_windows(GPT_VOCAB, 64), sequence_loss, 16,
                     "GPT (`models.gpt`, 2 layers of 128, 2,560 words), 16 windows of 64"),
    }


def vector_model(nbytes: int, pieces: int = 8) -> Model:
    """``nbytes`` of float32 parameters in ``pieces`` tensors; output mean(x) * sum_i ||p_i||^2,
    so forward reads each parameter once and backward writes its gradient once."""
    import torch

    from hpcopt.torch import TensorData

    n = max(pieces, nbytes // 4) // pieces

    class Vector(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pieces = torch.nn.ParameterList(torch.nn.Parameter(torch.full((n,), 0.5))
                                                 for _ in range(pieces))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean() * sum((p * p).sum() for p in self.pieces)

    def data() -> TensorData:
        return TensorData(torch.ones(SAMPLES, 1), torch.zeros(SAMPLES))

    return Model(Vector, data, lambda out, _: out, 32, f"{pieces} x {n:,} float32")


# -- the variants -------------------------------------------------------------------------------

@dataclass
class Variant:
    """One way to train: ``step()`` runs a step; ``averaging()`` is the seconds spent averaging
    so far (Comm-counted or timed around the averager); ``bytes()`` the bytes sent so far."""

    step: Callable[[], Any]
    averaging: Callable[[], float]
    bytes: Callable[[], float]


def hpcopt_variant(model: Model, algorithm: Any, comm: Any) -> Variant:
    """hpcopt's step on ``model``: ``torch_workload`` and ``algorithm.step``, as ``hpcopt train``."""
    from hpcopt.torch import torch_workload

    run = torch_workload(model.factory, model.loss, model.data(), comm, batch_size=model.batch,
                         dtype="float32")
    state = algorithm.init(run.x0, comm, buffers=run.buffers)
    oracle, before = run.problem.oracle, comm.stats.totals()
    # the init broadcast is set-up; from here on every counted call is the algorithm's
    base_seconds, base_bytes = before.seconds, before.bytes
    return Variant(lambda: algorithm.step(state, oracle, comm),
                   lambda: comm.stats.totals().seconds - base_seconds,
                   lambda: float(comm.stats.totals().bytes - base_bytes))


def torch_variant(model: Model, rank: int, lr: float, momentum: float, *, ddp: bool = False,
                  average_every: int = 0, max_norm: float | None = None) -> Variant:
    """PyTorch's loop: ``zero_grad``, forward, loss, backward, optional ``clip_grad_norm_``,
    ``SGD.step``, optional ``PeriodicModelAverager.average_parameters``; DDP-wrapped with ``ddp``."""
    import torch
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

    torch.manual_seed(0)
    module = model.factory()
    params = [p for p in module.parameters() if p.requires_grad]
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    buffer_bytes = sum(b.numel() * b.element_size() for b in module.buffers())
    trained = torch.nn.parallel.DistributedDataParallel(module) if ddp else module
    optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum)
    averager = PeriodicModelAverager(period=average_every, warmup_steps=0) if average_every else None
    data = model.data()
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(rank))
    usable = SAMPLES - SAMPLES % model.batch
    counts = {"position": 0, "steps": 0, "averages": 0, "seconds": 0.0}

    def step() -> None:
        start = counts["position"]
        counts["position"] = (start + model.batch) % usable
        index = order[start:start + model.batch]
        optimizer.zero_grad(set_to_none=True)
        model.loss(trained(data.inputs[index]), data.targets[index]).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
        optimizer.step()
        counts["steps"] += 1
        if averager is not None:
            fires = averager.step % averager.period == 0
            began = time.perf_counter()
            averager.average_parameters(module.parameters())
            counts["seconds"] += time.perf_counter() - began
            counts["averages"] += fires

    def sent() -> float:
        if ddp:  # every step: the gradients' allreduce and the buffers' broadcast
            return float(counts["steps"] * (param_bytes + buffer_bytes))
        return float(counts["averages"] * param_bytes)

    return Variant(step, lambda: counts["seconds"], sent)


def variants(model: Model, comm: Any, args: argparse.Namespace) -> dict[str, Variant]:
    from hpcopt.algorithms.local_clip import LocalClip
    from hpcopt.algorithms.local_sgd import LocalSGD

    lr, mu, rank = args.lr, args.momentum, comm.rank
    return {
        "torch": torch_variant(model, rank, lr, mu),
        "prsgd1": hpcopt_variant(model, LocalSGD(lr=lr, momentum=mu, interval=1), comm),
        "ddp": torch_variant(model, rank, lr, mu, ddp=True),
        "prsgd8": hpcopt_variant(model, LocalSGD(lr=lr, momentum=mu, interval=INTERVAL), comm),
        "averager": torch_variant(model, rank, lr, mu, average_every=INTERVAL),
        "celgc": hpcopt_variant(model, LocalClip(lr=lr, momentum=mu, interval=INTERVAL, gamma=args.gamma),
                                comm),
        "clip": torch_variant(model, rank, lr, mu, average_every=INTERVAL, max_norm=args.gamma / lr),
    }


# -- measuring ----------------------------------------------------------------------------------

def block(variant: Variant, steps: int, mpi: Any) -> tuple[float, float, float]:
    """(seconds, averaging seconds, bytes) of ``steps`` steps, after a barrier."""
    averaging, sent = variant.averaging(), variant.bytes()
    mpi.Barrier()
    start = time.perf_counter()
    for _ in range(steps):
        variant.step()
    seconds = time.perf_counter() - start
    return seconds, variant.averaging() - averaging, variant.bytes() - sent


def slowest_medians(samples: dict[str, list[tuple[float, ...]]], mpi: Any) -> dict[str, list[float]]:
    """Per key, the median over rounds of each field's maximum over the ranks."""
    gathered = mpi.allgather(samples)
    out = {}
    for key, rows in samples.items():
        per_round = [[max(g[key][r][f] for g in gathered) for f in range(len(rows[0]))]
                     for r in range(len(rows))]
        out[key] = [statistics.median(column) for column in zip(*per_round)]
    return out


def rounds_within(seconds: float, warm_up: float, most: int, comm: Any) -> int:
    """The rounds that fit ``seconds`` when one takes as long as the slowest rank's warm-up
    round (an overestimate: first calls are slower), at least ``MIN_ROUNDS`` (or ``most``)."""
    from mpi4py import MPI

    slowest = comm.mpi.allreduce(warm_up, op=MPI.MAX)
    return int(comm.mpi.bcast(max(min(MIN_ROUNDS, most), min(most, int(seconds / slowest))), root=0))


def measure_model(name: str, model: Model, comm: Any, args: argparse.Namespace,
                  seconds: float) -> dict[str, Any]:
    """Every variant of ``model``: ms per step, averaging ms and bytes per rank per round, in
    as many interleaved rounds (up to ``--rounds``) as fit ``seconds``."""
    began = time.perf_counter()
    parameters = sum(p.numel() for p in model.factory().parameters() if p.requires_grad)
    built = variants(model, comm, args)
    # warm-up: one round of each, so that every timed block starts an averaging round
    warm_up = sum(block(variant, INTERVAL, comm.mpi)[0] for variant in built.values())
    left = seconds - (time.perf_counter() - began)
    rounds = rounds_within(left, warm_up, args.rounds, comm)
    samples: dict[str, list[tuple[float, ...]]] = {key: [] for key in built}
    for r in range(rounds):
        pairs = PAIRS if r % 2 == 0 else tuple((b, a) for a, b in reversed(PAIRS))
        for key in ("torch", *(k for pair in pairs for k in pair)):
            samples[key].append(block(built[key], INTERVAL, comm.mpi))
    medians = slowest_medians(samples, comm.mpi)
    out: dict[str, Any] = {"model": name, "what": model.what, "parameters": int(parameters),
                           "rounds": rounds, "variants": {}}
    for key, (seconds, averaging, sent) in medians.items():
        rounds = INTERVAL if key in ("prsgd1", "ddp") else 1
        out["variants"][key] = {"step_ms": 1e3 * seconds / INTERVAL, "average_ms": 1e3 * averaging / rounds,
                                "bytes": sent / rounds}
    ddp, plain = out["variants"]["ddp"], out["variants"]["torch"]
    ddp["average_ms"] = ddp["step_ms"] - plain["step_ms"]  # exposed: its reduction is inside backward
    return out


def measure_growth(nbytes: int, comm: Any, args: argparse.Namespace) -> dict[str, float]:
    """At d = ``nbytes``: ms of hpcopt's and PyTorch's local step and of one average each."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from hpcopt.algorithms.local_sgd import LocalSGD

    model = vector_model(nbytes)
    steps = {"hpcopt": hpcopt_variant(model, LocalSGD(lr=args.lr, momentum=args.momentum,
                                                      interval=NO_AVERAGE), comm),
             "torch": torch_variant(model, comm.rank, args.lr, args.momentum)}
    calls = max(1, min(8, (32 * MB) // nbytes))
    samples: dict[str, list[tuple[float, ...]]] = {key: [] for key in steps}
    for variant in steps.values():
        block(variant, 1, comm.mpi)
    for _ in range(args.growth_rounds):
        for key, variant in steps.items():
            samples[key].append((block(variant, calls, comm.mpi)[0] / calls,))
    del steps
    gc.collect()
    # where training keeps x (``algorithm.init``: node-shared memory when the average takes that
    # path), so the average is the one a round makes
    vector = comm.shared_like(np.full(nbytes // 4, 1.0, dtype=np.float32))
    tensor = torch.full((nbytes // 4,), 1.0)
    world = comm.size

    def torch_average() -> None:
        dist.all_reduce(tensor)
        tensor.div_(world)

    averages = {"hpcopt_average": lambda: comm.average_(vector, label="growth"),
                "torch_average": torch_average}
    for key, call in averages.items():
        call()
        samples[key] = []
    for _ in range(args.growth_rounds):
        for key, call in averages.items():
            comm.mpi.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            samples[key].append(((time.perf_counter() - start) / calls,))
    medians = slowest_medians(samples, comm.mpi)
    return {"bytes": nbytes, **{f"{key}_ms": 1e3 * value[0] for key, value in medians.items()}}


@contextmanager
def gloo_group(mpi: Any) -> Iterator[None]:
    """torch.distributed's gloo group over the MPI ranks, on a free TCP port rank 0 picks."""
    import torch.distributed as dist

    port = 0
    if mpi.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = mpi.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=mpi.Get_rank(),
                            world_size=mpi.Get_size())
    try:
        yield
    finally:
        dist.destroy_process_group()


def measure(args: argparse.Namespace, suite: dict[str, Model] | None = None,
            report: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """The worker: every model's variants and every size's growth point (collective; identical
    on every rank). ``suite`` overrides the models of ``--models``; rank 0 passes each result
    to ``report`` (its list's name, the result) as soon as it has it."""
    import torch
    from threadpoolctl import threadpool_limits

    from hpcopt.comm import Comm

    torch.set_num_threads(1)
    comm = Comm()
    chosen = suite if suite is not None else {name: models()[name] for name in args.models}
    results: dict[str, Any] = {"models": [], "growth": [], "ranks": comm.size}
    try:
        with threadpool_limits(1), gloo_group(comm.mpi):
            models_end = time.perf_counter() + args.budget * (1 - GROWTH_SHARE)
            for i, (name, model) in enumerate(chosen.items()):
                share = (models_end - time.perf_counter()) / (len(chosen) - i)
                keep(results, "models", measure_model(name, model, comm, args, share), comm, report)
                progress(comm, f"{name} done")
            for nbytes in parse_sizes(args.sizes):
                keep(results, "growth", measure_growth(nbytes, comm, args), comm, report)
                progress(comm, f"growth {fmt_bytes(nbytes)} done")
    finally:
        comm.free()
    return results


def keep(results: dict[str, Any], kind: str, result: Any, comm: Any,
         report: Callable[[str, Any], None] | None) -> None:
    """Add ``result`` to ``results[kind]``, report it (rank 0), free what measuring it left."""
    results[kind].append(result)
    if report is not None and comm.rank == 0:
        report(kind, result)
    gc.collect()


def progress(comm: Any, text: str) -> None:
    if comm.rank == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def fmt_bytes(nbytes: int) -> str:
    from hpcopt.bench.common import fmt_bytes as fmt

    return fmt(nbytes)


def parse_sizes(text: str) -> list[int]:
    from hpcopt.bench.common import parse_bytes

    return [parse_bytes(item) for item in text.split(",") if item]


# -- the ceiling --------------------------------------------------------------------------------

def memory_ceiling(sizes: str, script: Path = CEILING_SCRIPT,
                   timeout: float = 600) -> tuple[list[dict[str, float]] | None, str]:
    """shm_ceiling.py's rows (rank 0's JSON list) for ``sizes``, and a note for the page; rows
    None (and the note says why) when the script is missing or fails."""
    name = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    if not script.exists():
        return None, f"`{name}` is not in this checkout, so no memory ceiling is drawn."
    command = ["mpiexec", "-n", str(RANKS), sys.executable, str(script), "--sizes", sizes, "--json"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"`{name}` did not finish in {timeout:.0f} s, so no memory ceiling is drawn."
    if done.returncode:
        return None, (f"`{name}` failed (exit {done.returncode}: {done.stderr.strip()[-300:]}), so no "
                      "memory ceiling is drawn.")
    start = done.stdout.find("[")
    try:
        rows = json.loads(done.stdout[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        rows = None
    if not isinstance(rows, list) or not all("ceiling_gbps" in r and "bytes" in r for r in rows):
        return None, f"`{name}` printed no JSON list of ceilings, so no memory ceiling is drawn."
    return rows, (f"The memory ceiling is `mpiexec -n {RANKS} python {name} --sizes {sizes} --json`, run "
                  "after the measurements: the time d takes at its `ceiling_gbps`.")


# -- the page -----------------------------------------------------------------------------------

def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def comparison_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per pair of ``result`` (one model): both sides' figures and peer ms / hpcopt ms."""
    v = result["variants"]
    return [{"pair": (ours, peer), "ours": v[ours], "peer": v[peer],
             "speed": v[peer]["step_ms"] / v[ours]["step_ms"]} for ours, peer in PAIRS]


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    """One line per pair where hpcopt is behind its peer, with by how much."""
    lines = []
    for result in results:
        for row in comparison_rows(result):
            if row["speed"] < 1:
                ours, peer = row["pair"]
                slower = row["ours"]["step_ms"] / row["peer"]["step_ms"] - 1
                lines.append(f"- {result['what']}: {VARIANTS[ours]} is {100 * slower:.1f}% slower per "
                             f"step than {VARIANTS[peer]} ({row['ours']['step_ms']:.1f} against "
                             f"{row['peer']['step_ms']:.1f} ms).")
    return lines


def comparison_table(results: list[dict[str, Any]]) -> list[str]:
    lines = ["| model (parameters) | hpcopt | peer | hpcopt ms/step | peer ms/step | speed (peer ms / "
             "hpcopt ms) | hpcopt averaging ms/round | peer averaging ms/round | hpcopt bytes/rank/round "
             "| peer bytes/rank/round |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        for row in comparison_rows(result):
            ours, peer = row["pair"]
            a, b = row["ours"], row["peer"]
            exposed = " (exposed)" if peer == "ddp" else ""
            lines.append(f"| {result['what']} ({result['parameters']:,}) | {VARIANTS[ours]} | "
                         f"{VARIANTS[peer]} | {a['step_ms']:.1f} | {b['step_ms']:.1f} | "
                         f"{row['speed']:.3f}x | "
                         f"{a['average_ms']:.2f} | {b['average_ms']:.2f}{exposed} | {mb(a['bytes'])} | "
                         f"{mb(b['bytes'])} |")
    return lines


def breakdown_table(results: list[dict[str, Any]]) -> list[str]:
    """Where a step's time goes: the local step against plain PyTorch, the averages, clipping."""
    lines = ["| model | plain torch ms/step | hpcopt local ms/step (PR-SGD I = 8 less its average) | "
             "local step vs torch | hpcopt average ms (I = 8) | averager ms (I = 8) | CELGC - PR-SGD "
             "ms/step | clip+averager - averager ms/step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        v = result["variants"]
        local = v["prsgd8"]["step_ms"] - v["prsgd8"]["average_ms"] / INTERVAL
        lines.append(f"| {result['what']} | {v['torch']['step_ms']:.1f} | {local:.1f} | "
                     f"{v['torch']['step_ms'] / local:.3f}x | {v['prsgd8']['average_ms']:.2f} | "
                     f"{v['averager']['average_ms']:.2f} | "
                     f"{v['celgc']['step_ms'] - v['prsgd8']['step_ms']:+.1f} | "
                     f"{v['clip']['step_ms'] - v['averager']['step_ms']:+.1f} |")
    return lines


def ceiling_ms(ceiling: list[dict[str, float]] | None) -> dict[int, float]:
    """d (bytes) -> ms of d at the ceiling's GB/s."""
    return {int(r["bytes"]): 1e3 * r["bytes"] / (1e9 * r["ceiling_gbps"]) for r in ceiling or ()
            if r["ceiling_gbps"] > 0}


def growth_table(growth: list[dict[str, float]], ceiling: list[dict[str, float]] | None) -> list[str]:
    floor = ceiling_ms(ceiling)
    lines = ["| d | torch step ms | hpcopt step ms | step overhead ms | hpcopt average ms | torch "
             "all_reduce ms | memory ceiling ms |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for g in growth:
        at = floor.get(int(g["bytes"]))
        lines.append(f"| {g['bytes'] / MB:g} MB | {g['torch_ms']:.2f} | {g['hpcopt_ms']:.2f} | "
                     f"{g['hpcopt_ms'] - g['torch_ms']:+.2f} | {g['hpcopt_average_ms']:.2f} | "
                     f"{g['torch_average_ms']:.2f} | {f'{at:.2f}' if at is not None else '-'} |")
    return lines


def plot(growth: list[dict[str, float]], ceiling: list[dict[str, float]] | None, ranks: int,
         path: Path) -> None:
    """Step overhead and averaging time against d, log-log, with the ceiling when there is one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = [g["bytes"] / MB for g in growth]
    overhead = [(x, g["hpcopt_ms"] - g["torch_ms"]) for x, g in zip(d, growth)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(d, [g["hpcopt_average_ms"] for g in growth], "o-", label="hpcopt Comm.average_")
    ax.plot(d, [g["torch_average_ms"] for g in growth], "s-", label="torch all_reduce + div_ (gloo)")
    shown = [(x, y) for x, y in overhead if y > 0]
    if shown:
        ax.plot(*zip(*shown), "^-", label="hpcopt local step - torch SGD step")
    hidden = [x for x, y in overhead if y <= 0]
    if hidden:
        ax.plot([], [], " ", label=f"step overhead <= 0 at {', '.join(f'{x:g}' for x in hidden)} MB")
    floor = ceiling_ms(ceiling)
    if floor:
        ax.plot([s / MB for s in floor], list(floor.values()), "k--", label="memory ceiling (shm_ceiling.py)")
    else:
        ax.plot([], [], " ", label="no memory ceiling (the page says why)")
    ax.set(xscale="log", yscale="log", xlabel="d (MB of float32)", ylabel="ms",
           title=f"Cost against d, {ranks} rank(s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def page(data: dict[str, Any], ceiling: list[dict[str, float]] | None, ceiling_note: str,
         figure: str) -> str:
    """The page, every figure from ``data`` (the worker's numbers and the run's conditions)."""
    results, growth, run = data["models"], data["growth"], data["run"]
    behind = verdicts(results)
    pairs = len(results) * len(PAIRS)
    ahead = (f"hpcopt is ahead of its peer in all {pairs} pairs." if not behind else
             f"hpcopt is ahead of its peer in {pairs - len(behind)} of {pairs} pairs; behind in:")
    rounds = ", ".join(f"{r['model']} {r['rounds']}" for r in results)
    command = "python benchmarks/speed/peers.py" + (" --quick" if run["quick"] else "")
    return "\n".join([
        "# hpcopt against its PyTorch peers",
        "",
        "<!-- docs-check",
        "skip: peers.py -- the full run takes ~15 minutes; tests/unit/test_peers_page.py writes this "
        "page from a tiny measured run",
        "-->",
        "```bash",
        command,
        "```",
        "",
        f"{data['ranks']} rank(s) under mpiexec on one machine, torch {run['torch']} (gloo), 1 thread "
        f"per rank, float32, lr {run['lr']:g}, momentum {run['momentum']:g}, CELGC gamma {run['gamma']:g} "
        f"(clipped when ||g|| > {run['gamma'] / run['lr']:g}), synthetic data ({SAMPLES} samples). "
        f"Each number is the median over interleaved rounds (after one warm-up round) of the slowest "
        f"rank's block of {INTERVAL} steps; a round runs every variant once. Rounds per model: "
        f"{rounds}: as many as fit a budget of {run['budget']:.0f} s for the whole job (at most "
        f"{run['rounds']}, at least {min(MIN_ROUNDS, run['rounds'])}). Growth: median of "
        f"{run['growth_rounds']} rounds per size. Load average {run['load_before']} at the start, "
        f"{run['load_after']} at the end (a shared machine: other jobs took cores meanwhile); the run "
        f"took {run['seconds']:.0f} s. The method is in the script's docstring.",
        "",
        "## Per step and per round",
        "",
        "Speed above 1x: hpcopt is faster. DDP reduces inside backward, so its averaging column is "
        "exposed time: DDP's step minus the plain PyTorch step. Bytes are message sizes per rank and "
        "round (hpcopt: what its Comm counted on every label, the batch-norm statistics' average "
        "included; torch: the parameters reduced, DDP also the buffers it broadcasts every step).",
        "",
        *comparison_table(results),
        "",
        ahead,
        *behind,
        *([f"**{data['failed']}**"] if data.get("failed") else []),
        "",
        "## Where the time goes",
        "",
        "The plain PyTorch step has no communication; hpcopt's local step is PR-SGD I = 8's block "
        "less its Comm-counted average, per step. The last two columns are what clipping adds on each "
        "side.",
        "",
        *breakdown_table(results),
        "",
        "## How cost grows with d",
        "",
        "Step overhead: hpcopt's local step (PR-SGD, no average) minus PyTorch's SGD step on a module "
        "of d bytes of float32 parameters in 8 tensors whose forward reads each once. Average: "
        "`Comm.average_` of a vector where training keeps x (`Comm.shared_like`: node-shared "
        "memory, averaged in place) against `torch.distributed.all_reduce` + `div_` over gloo.",
        "",
        ceiling_note,
        "",
        f"![step overhead and averaging time against d]({figure})",
        "",
        *growth_table(growth, ceiling),
        "",
    ])


def write(data: dict[str, Any], ceiling: list[dict[str, float]] | None, ceiling_note: str,
          path: Path) -> str:
    """Write the page at ``path`` and its figure under ``path.stem``/ beside it; the page's text."""
    figure = Path(path.stem) / "growth.png"
    plot(data["growth"], ceiling, data["ranks"], path.parent / figure)
    text = page(data, ceiling, ceiling_note, figure.as_posix())
    path.write_text(text)
    return text


# -- the two entry points -----------------------------------------------------------------------

def load_average() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def launch(args: argparse.Namespace) -> None:
    """Run the worker under mpiexec, then the ceiling script; print the page and write it with
    the run's numbers (``run.json`` in the figure's folder)."""
    import torch

    start, before = time.perf_counter(), load_average()
    command = ["mpiexec", "-n", str(RANKS), sys.executable, str(Path(__file__).resolve()), "--worker",
               "--models", *args.models, "--rounds", str(args.rounds), "--budget", str(args.budget),
               "--sizes", args.sizes, "--growth-rounds", str(args.growth_rounds), "--lr", str(args.lr),
               "--momentum", str(args.momentum), "--gamma", str(args.gamma)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": path})
    data: dict[str, Any] = {"models": [], "growth": [], "ranks": RANKS, "failed": ""}
    for line in done.stdout.splitlines():  # one result a line: what a failed job measured is kept
        if line.startswith("{"):
            (kind, result), = json.loads(line).items()
            data[kind].append(result)
    if done.returncode:
        data["failed"] = (f"The measuring job stopped with exit code {done.returncode} after "
                          f"{len(data['models'])} models and {len(data['growth'])} sizes.")
        print(data["failed"], file=sys.stderr)
    ceiling, note = memory_ceiling(args.sizes)
    data["run"] = {"torch": torch.__version__, "lr": args.lr, "momentum": args.momentum, "gamma": args.gamma,
                   "rounds": args.rounds, "budget": args.budget, "growth_rounds": args.growth_rounds,
                   "quick": args.quick, "load_before": before, "load_after": load_average(),
                   "seconds": time.perf_counter() - start}
    if args.page is None:
        print(page(data, ceiling, note, "peers/growth.png"))
        return
    saved = args.page.parent / args.page.stem / "run.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps({"data": data, "ceiling": ceiling, "note": note}, indent=1))
    print(write(data, ceiling, note, args.page))


def rewrite(saved: Path, page_path: Path) -> None:
    """The page and figure again from a run's saved numbers (``run.json``), measuring nothing."""
    run = json.loads(saved.read_text())
    print(write(run["data"], run["ceiling"], run["note"], page_path))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help=f"a short run (rounds: {QUICK['rounds']}, sizes {QUICK['sizes']}); prints the page, "
                        "writes it only with --page")
    p.add_argument("--page", type=Path, help=f"the page to write (default {PAGE.relative_to(ROOT)}; "
                                             "its figure goes under peers/ beside it)")
    p.add_argument("--models", nargs="+", choices=SUITE, default=list(SUITE))
    p.add_argument("--rounds", type=int, help=f"at most this many interleaved rounds per model "
                                              f"(default {FULL['rounds']}, --quick {QUICK['rounds']})")
    p.add_argument("--budget", type=float, help=f"seconds for the measuring job: each model gets as many "
                                                f"rounds as fit its share, at least {MIN_ROUNDS} (default "
                                                f"{FULL['budget']:g}, --quick {QUICK['budget']:g})")
    p.add_argument("--sizes", help=f"growth sizes, comma-separated (default {FULL['sizes']})")
    p.add_argument("--growth-rounds", type=int, help=f"rounds per size (default {FULL['growth_rounds']})")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--gamma", type=float, default=0.05, help="CELGC's step-length bound (clip at gamma/lr)")
    p.add_argument("--from-json", type=Path, metavar="RUN_JSON",
                   help="write the page from a run's saved numbers (the run.json beside its figure), "
                        "measuring nothing")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = parser().parse_args()
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.page is None and not args.quick:
        args.page = PAGE
    if args.from_json is not None:
        rewrite(args.from_json, args.page or PAGE)
    elif not args.worker:
        launch(args)
    else:
        measure(args, report=lambda kind, result: print(json.dumps({kind: result}), flush=True))


if __name__ == "__main__":
    main()
