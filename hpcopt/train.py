"""The training loop: steps, periodic evaluation of the averaged model, progress, summary."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from .algorithms.local_sgd import AVERAGE_LABEL, LocalSGDState
from .build import RunParts, build_run
from .comm import Comm, agreed, node_layout
from .config import Config
from .problems.classification import Evaluation
from .progress import Progress
from .threads import ThreadChoice, configure_threads


@dataclass
class Summary:
    """What a finished run reports (identical on every rank)."""

    steps: int
    rounds: int
    final: Evaluation
    train_loss: float
    wall_seconds: float
    comm_seconds: float            # mean over ranks
    bytes_per_rank: float          # mean over ranks, all labels
    average_bytes_per_rank: float  # the algorithm's own label
    parameters: int
    workers: int
    samples_per_second: float      # all ranks together
    threads: ThreadChoice
    history: list[tuple[int, Evaluation]] = field(default_factory=list)

    def lines(self) -> list[str]:
        comm_share = self.comm_seconds / self.wall_seconds if self.wall_seconds else 0.0
        return [
            f"test accuracy     {self.final.accuracy:.4f} (loss {self.final.loss:.4f}, "
            f"{self.final.samples} samples)",
            f"train loss        {self.train_loss:.4f} (last progress window, mean over ranks)",
            f"steps             {self.steps} per rank, {self.rounds} averaging rounds",
            f"communicated      {_megabytes(self.bytes_per_rank)} per rank "
            f"({_megabytes(self.average_bytes_per_rank)} averaging the {self.parameters:,} parameters)",
            f"time              {self.wall_seconds:.1f} s, {100 * comm_share:.1f}% in communication",
            f"throughput        {self.samples_per_second:,.0f} samples/s over {self.workers} rank(s)",
            f"threads           {self.threads.describe()}",
        ]


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def evaluate_average(parts: RunParts, state: LocalSGDState, scratch: Any, comm: Comm) -> Evaluation:
    """Evaluate the averaged model without disturbing training (a copy is averaged, label eval)."""
    if state.steps_in_round == 0:
        model = state.x  # every rank holds the average already
    else:
        scratch[...] = state.x
        model = comm.average_(scratch, label="eval")
    return parts.problem.evaluate(model, state.grad, parts.test_features, parts.test_labels, comm)


def train(config: Config, comm: Comm | None = None, verbose: bool = True) -> tuple[Summary, LocalSGDState]:
    """Run PR-SGD as configured; returns the summary and this rank's final state.

    At the end every rank holds the averaged model: if the last round was partial, one more
    average is taken on the label "final" (so the "average" label counts exactly floor(T/I)).
    """
    comm = comm or Comm()
    threads = configure_threads(node_layout(comm.mpi)[1])
    parts = agreed(lambda: build_run(config, comm), comm)
    comm.backend = parts.backend
    algorithm, backend = parts.algorithm, parts.backend
    show = verbose and config.run.progress and comm.rank == 0
    if show:
        print(_header(parts, comm, threads), flush=True)
    state = algorithm.init(parts.x0, comm)
    progress = Progress(algorithm.clock_ticks(parts.total_steps), show)
    scratch = backend.xp.empty_like(state.x)
    history: list[tuple[int, Evaluation]] = []
    window = np.zeros(2)
    losses: list[Any] = []
    comm.barrier(label="start")
    start = time.perf_counter()
    for _ in range(parts.local_steps):
        losses.append(algorithm.step(state, parts.problem.oracle, comm))
        tick = algorithm.clock(state)
        if tick is None:
            continue
        if progress.due(tick):
            window[:] = (float(backend.xp.stack(losses).sum()), len(losses))
            losses.clear()
            comm.allreduce_host_(window, label="log")
            progress.report(tick, f"loss {window[0] / window[1]:.4f} | rounds {state.rounds}")
        if config.run.eval_every and tick % config.run.eval_every == 0:
            history.append((tick, evaluate_average(parts, state, scratch, comm)))
    if state.steps_in_round:
        comm.average_(state.x, label="final")
        state.steps_in_round = 0
    backend.synchronize()
    wall = time.perf_counter() - start
    final = evaluate_average(parts, state, scratch, comm)
    summary = _summarize(parts, state, comm, threads, final, wall, window, history)
    if show:
        print("summary\n  " + "\n  ".join(summary.lines()), flush=True)
    return summary, state


def _summarize(parts: RunParts, state: LocalSGDState, comm: Comm, threads: ThreadChoice,
               final: Evaluation, wall: float, window: np.ndarray,
               history: list[tuple[int, Evaluation]]) -> Summary:
    totals = comm.stats.totals()
    local = np.array([totals.seconds, totals.bytes, comm.stats.totals(AVERAGE_LABEL).bytes,
                      state.step * parts.config.data.batch_size])
    comm.allreduce_host_(local, label="summary")
    wall = float(comm.allreduce_host_(np.array([wall]), op=MPI.MAX, label="summary")[0])
    size = comm.size
    train_loss = window[0] / window[1] if window[1] else float("nan")
    return Summary(steps=state.step, rounds=state.rounds, final=final, train_loss=train_loss,
                   wall_seconds=wall, comm_seconds=local[0] / size, bytes_per_rank=local[1] / size,
                   average_bytes_per_rank=local[2] / size, parameters=parts.model.layout.size,
                   workers=size, samples_per_second=local[3] / wall if wall else 0.0,
                   threads=threads, history=history)


def _header(parts: RunParts, comm: Comm, threads: ThreadChoice) -> str:
    cfg = parts.config
    sizes = "-".join(str(s) for s in (parts.test_features.shape[1], *cfg.model.hidden,
                                      parts.dataset.num_classes))
    return (f"hpcopt train: {cfg.algorithm.algorithm} on {cfg.data.dataset} "
            f"({parts.dataset.x_train.shape[0]} train / {parts.dataset.x_test.shape[0]} test), "
            f"mlp {sizes} ({parts.model.layout.size:,} parameters, {cfg.run.dtype}), "
            f"{comm.size} rank(s), I={cfg.algorithm.interval}, batch {cfg.data.batch_size}/rank, "
            f"{parts.total_steps} steps, {threads.describe()}")
