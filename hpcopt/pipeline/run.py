"""The run loop of pipeline algorithms (PPRS, pipelined GD and AGD): one rank per stage.

``mpiexec -n DELTA python -m hpcopt train --algorithm pprs ...`` ends up here (``hpcopt.cli``
dispatches on the algorithm). The data-parallel loop (``hpcopt.train``) averages one model per
rank; here rank s owns stage s, the only traffic of an iteration is the pipeline's own
point-to-point messages (label ``<algorithm>.activation`` / ``.gradient``), and every stage
runs the same update on its block. Iterations are full-batch, so an epoch is one iteration:
``--steps N`` (else ``--epochs``, rounded up) iterations. With ``--device gpu`` each stage's
parameters, optimizer state, activations and gradients are CuPy arrays on the GPU of its
node-local rank, and the messages between stages go straight through or staged
(hpcopt/staging.py), as for the data-parallel loop.

At an iteration t (every rank passes the same ones, in order):

1. ``eval_every`` divides t: f(x_t) without smoothing, by one forward pass (label ``eval``);
2. ``trace_every`` or ``eval_every`` divides t: a trace row, from one small allgather (label
   ``trace``) of each stage's window: loss (last stage), ||g|| of its block, busy and idle
   seconds, messages sent, the SIGTERM flag. The row: loss, ||g||, per-stage busy/idle, the
   measured bubble (mean over stages of idle / (busy + idle)) against the ideal
   (Delta - 1) / (K + Delta - 1), tau (the slowest stage's busy seconds per forward or
   backward of one sample), the modelled pipeline time sum of 2 tau (K + Delta - 1) per
   iteration, and the messages sent so far by all stages;
3. a checkpoint (``checkpoint_every``, the last iteration, or SIGTERM): each stage's block and
   optimizer state (``hpcopt.pipeline.checkpoint``).

Reused from the data-parallel loop: the run directory, SIGTERM handling, the trace writer and
checkpoint files' conventions, progress lines, thread choice.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from ..algorithms.pprs import PipelineState
from ..backend import CPU
from ..comm import Comm, agreed, node_layout
from ..config import Config, check_resume
from ..errors import UserError
from ..faults import FaultPlan
from ..io import checkpoint as ckpt_io
from ..io import trace as trace_io
from ..io.vet import vet_checkpoint
from ..nonfinite import nonfinite_loss, nonfinite_parameters
from ..problems.staged import StagedProblem, setup_stage
from ..progress import Progress
from ..runs import StopSignal, header_end, open_trace, run_directory
from ..staging import prepare_gpu
from ..threads import ThreadChoice, configure_threads
from ..watchdog import watching
from . import checkpoint as pipe_ckpt
from .executor import Pipeline
from .parts import Algorithm, build_algorithm, build_problem, describe, plan_for
from .schedules import ideal_bubble
from .split import StagePlan

EVAL_LABEL = "eval"
#: Per-rank window values allgathered for a trace row (label "trace").
_FIELDS = ("loss_sum", "loss_max", "iterations", "grad_sq", "busy", "idle", "samples", "sends",
           "stop", "eval")


@dataclass
class PipelineSummary:
    """What a pipeline run reports (the same on every rank)."""

    steps: int
    samples: int                 # K per iteration
    stages: int                  # Delta
    train_loss: float            # the last row's mean loss over its window
    final_loss: float | None     # f(x_T) without smoothing; None when stopped by SIGTERM
    bubble: float                # measured idle share, mean over stages, whole run
    bubble_ideal: float
    tau: float                   # seconds per forward or backward of one sample, slowest stage
    modelled_seconds: float      # sum over iterations of 2 tau (K + Delta - 1)
    wall_seconds: float
    messages: int                # point-to-point messages of the algorithm, all stages
    threads: ThreadChoice
    out: str = ""
    checkpoint: str = ""
    stopped: bool = False
    history: list[dict[str, float]] = field(default_factory=list)  # every trace row

    def lines(self) -> list[str]:
        first = (f"final loss        {self.final_loss:.6g} (f(x) without smoothing)"
                 if self.final_loss is not None else
                 "stopped           by SIGTERM before the end; resume from the checkpoint below")
        return [
            first,
            f"train loss        {self.train_loss:.6g} (last trace row)",
            f"iterations        {self.steps}, K={self.samples} sample(s) each over "
            f"{self.stages} stage(s)",
            f"bubble            {100 * self.bubble:.1f}% measured (mean over stages), "
            f"{100 * self.bubble_ideal:.1f}% ideal (Delta-1)/(K+Delta-1)",
            f"messages          {self.messages:,} point-to-point, all stages",
            f"time              {self.wall_seconds:.2f} s measured, {self.modelled_seconds:.2f} s "
            f"modelled (tau {1e3 * self.tau:.3f} ms per op)",
            f"threads           {self.threads.describe()}",
            f"files             {self.out or 'none'} (checkpoint {self.checkpoint or 'none'})",
        ]


@dataclass
class _Built:
    problem: StagedProblem
    plan: StagePlan
    algorithm: Algorithm
    total: int


def _build(config: Config, comm: Comm, problem: StagedProblem | None,
           ckpt: pipe_ckpt.PipelineCheckpoint | None) -> _Built:
    """Check the rank count against the stage plan (from the architecture alone), then build
    the problem and the algorithm. No communication: run inside ``agreed``."""
    if getattr(config.run, "network", ""):
        raise UserError("network applies only to data-parallel algorithms")
    total = config.run.steps or math.ceil(config.run.epochs)
    if ckpt is not None:
        check_resume(ckpt.config, config)
        if ckpt.tick >= total:
            raise UserError(f"{ckpt.path} is at iteration {ckpt.tick} of {total}: the run is "
                            "complete (pass --steps N with N larger to train further)")
    xp = comm.backend.xp
    if problem is not None and problem.xp is not xp:
        raise UserError(f"the given problem holds {problem.xp.__name__} arrays, but this run's "
                        f"device {config.run.device} needs {xp.__name__} arrays")
    architecture = problem or build_problem(config, architecture_only=True)
    plan = plan_for(config, architecture.model, comm.size)
    problem = problem or build_problem(config, xp=xp)
    trainable = int(problem.trainable_mask().sum())
    if trainable == 0:
        raise UserError(f"{problem.name} has no trainable parameters")
    return _Built(problem, plan, build_algorithm(config, problem, trainable), total)


def train_pipeline(config: Config, comm: Comm | None = None, verbose: bool = True,
                   resume: str | Path | None = None, problem: StagedProblem | None = None,
                   faults: FaultPlan | None = None) -> tuple[PipelineSummary, PipelineState]:
    """Run the configured pipeline algorithm with stage s on rank s; returns the summary and
    this stage's final state. ``problem`` skips building it from the config (benchmarks reuse
    one trained classifier); ``resume`` continues from a checkpoint bit for bit.

    Failures (docs/failures.md): the stall watchdog (``stall_timeout``: a stage waiting for a
    message or a collective that long ends the job, naming the stages that have not arrived),
    a non-finite loss in a trace row or non-finite parameters before a checkpoint (exit 3, the
    last good checkpoint kept), and ``faults``, a debug fault to inject (hpcopt.faults; STEP
    counts iterations)."""
    comm = comm or Comm()
    local_rank, local_size = node_layout(comm.mpi)
    threads = configure_threads(local_size)
    if config.run.device == "gpu":  # the GPU of this node-local rank, and how MPI reaches it
        agreed(lambda: prepare_gpu(comm, local_rank), comm)
    else:
        comm.backend = CPU
    ckpt = None
    if resume:  # rank 0 has a child process read the whole file first (hpcopt.io.vet)
        agreed(lambda: vet_checkpoint(resume) if comm.rank == 0 else None, comm)
        ckpt = agreed(lambda: pipe_ckpt.read(resume, comm.size), comm)
    built = agreed(lambda: _build(config, comm, problem, ckpt), comm)
    algo_cfg, dtype = config.algorithm, np.dtype(config.run.dtype)
    label = algo_cfg.algorithm
    setup = setup_stage(built.problem, comm, built.plan, kind=algo_cfg.pipeline, label=label,
                        dtype=dtype)
    pipe, prob = setup.pipeline, built.problem
    evaluator = Pipeline(prob.model, built.plan, pipe.params, comm, prob.input_shape,
                         source=prob.source, sink=prob.sink, frozen=prob.frozen,
                         kind=algo_cfg.pipeline, label=EVAL_LABEL)
    state = built.algorithm.init(setup.x0, comm, setup.box)
    block = built.plan.param_slice(prob.model, comm.rank)
    window = np.zeros(len(pipe_ckpt.WINDOW_COLUMNS))
    if ckpt is not None:
        window = agreed(lambda: pipe_ckpt.restore(ckpt, comm.rank, pipe.params, block, state,
                                                  comm.backend), comm)
    out, run_id = run_directory(config, ckpt, comm)
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, out=str(out or "")))
    loop = _Loop(config, comm, built, pipe, evaluator, state, block, window, out, run_id,
                 ckpt.wall_seconds if ckpt else 0.0, faults)
    loop.writer = agreed(lambda: _trace_writer(config, prob, out, run_id, ckpt, comm), comm)
    show = verbose and config.run.progress and comm.rank == 0
    if show:
        resumed = f"{ckpt.path} at iteration {ckpt.tick}" if ckpt else ""
        print(f"hpcopt train: {label} on {describe(config, prob, built.plan, built.algorithm)}, "
              f"{config.run.dtype}, {built.total} iterations, {threads.describe()}\n"
              f"{header_end(out, resumed, comm)}", flush=True)
    try:
        with StopSignal(out is not None) as stop_signal, \
                watching(comm, config.run.stall_timeout, lambda: state.step):
            summary = loop.run(ckpt, stop_signal, threads, show)
    finally:
        if loop.writer is not None:
            loop.writer.close()
    if show:
        print("summary\n  " + "\n  ".join(summary.lines()), flush=True)
    if summary.stopped and verbose and comm.rank == 0:
        print(f"hpcopt: SIGTERM: stopped at iteration {state.step} after writing "
              f"{summary.checkpoint}; continue with: mpiexec -n {comm.size} python -m hpcopt "
              f"resume {summary.checkpoint}", flush=True)
    return summary, state


class _Loop:
    """A pipeline run in progress on this rank."""

    def __init__(self, config: Config, comm: Comm, built: _Built, pipe: Pipeline,
                 evaluator: Pipeline, state: PipelineState, block: slice, window: np.ndarray,
                 out: Path | None, run_id: str, wall_before: float,
                 faults: FaultPlan | None = None) -> None:
        self.config, self.comm, self.built, self.faults = config, comm, built, faults
        self.pipe, self.evaluator, self.state, self.block = pipe, evaluator, state, block
        self.out, self.run_id, self.wall_before = out, run_id, wall_before
        self.writer: trace_io.TraceWriter | None = None
        self.label = config.algorithm.algorithm
        self.samples = built.algorithm.samples_per_iteration
        self.stages = comm.size
        self.ideal = ideal_bubble(self.stages, self.samples)
        # the window since the last row (saved in checkpoints) and the run's running totals
        self.loss_sum, self.loss_max, self.iterations = float(window[0]), float(window[1]), int(window[2])
        self.messages, self.modelled = int(window[3]), float(window[5])
        self.pending_sends = int(window[4])  # this rank's sends before a resume, not yet in a row
        self.sends_base = 0
        self.busy_total = self.idle_total = 0.0
        self.tau = math.nan
        self.history: list[dict[str, float]] = []
        self.checkpoint = ""
        self.start = 0.0

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.start

    def _sends(self) -> int:
        stats = self.comm.stats
        return sum(stats.totals(label=f"{self.label}.{kind}", op="send").calls
                   for kind in ("activation", "gradient"))

    def run(self, ckpt: pipe_ckpt.PipelineCheckpoint | None, stop_signal: StopSignal,
            threads: ThreadChoice, show: bool) -> PipelineSummary:
        config, comm, state = self.config, self.comm, self.state
        algorithm, total = self.built.algorithm, self.built.total
        every, eval_every = config.run.trace_every, config.run.eval_every
        checkpoint_every = config.run.checkpoint_every
        progress = Progress(total, show)
        oracle = self.pipe.gradient
        last = comm.rank == comm.size - 1
        train_loss, stopped = math.nan, False
        comm.barrier(label="start")
        if ckpt is not None:
            ckpt_io.restore_counters(ckpt, comm)  # type: ignore[arg-type]  (uses .comm only)
        self.sends_base = self._sends() - self.pending_sends
        self.pipe.timing.reset()
        self.start = time.perf_counter()
        progress.start -= self.wall_before
        while state.step < total:
            if self.faults is not None and self.faults.before_gradient(comm.rank, state.step + 1, None):
                state.x.reshape(-1)[0] = math.nan  # "nan": this stage's parameters
            loss = algorithm.step(state, oracle, comm)
            if last:
                self.loss_sum += loss
                self.loss_max = max(self.loss_max, loss) if self.iterations else loss
            self.iterations += 1
            tick = state.step
            evaluation = math.nan
            if eval_every and tick % eval_every == 0:
                evaluation = self.evaluator.loss(state.x)
            if tick % every == 0 or (eval_every and tick % eval_every == 0):
                row = self.row(tick, evaluation, stop_signal.raised)
                train_loss = row["loss_mean"]
                if not math.isfinite(train_loss):  # the same row on every stage: all stop
                    raise nonfinite_loss(f"iteration {tick} (mean loss {train_loss})",
                                         self.checkpoint, skip=False)
                stopped = tick < total and bool(row.pop("stop"))
                if progress.due(tick) or stopped:
                    progress.report(tick, f"loss {train_loss:.6g} | bubble "
                                    f"{100 * row['bubble']:.1f}% (ideal {100 * self.ideal:.1f}%)")
            if self.out is not None and (stopped or tick == total or
                                         (checkpoint_every and tick % checkpoint_every == 0)):
                self.save(tick)
            if stopped:
                break
        final = None
        if not stopped:
            if self.iterations:
                train_loss = self.row(state.step, math.nan, False)["loss_mean"]
            final = comm.allreduce_scalar(self.evaluator.loss(state.x), label=EVAL_LABEL)
        summary = self.summarize(final, train_loss, threads, stopped)
        if self.writer is not None and final is not None:
            self.writer.finish({"step": state.step, "wall": summary.wall_seconds,
                                "final_loss": final, "messages": self.messages,
                                "bubble": summary.bubble, "bubble_ideal": self.ideal,
                                "modelled_time": self.modelled, "checkpoint": self.checkpoint})
        return summary

    def row(self, tick: int, evaluation: float, stop: bool) -> dict[str, Any]:
        """Collective (label "trace"): reduce the window over stages, write a trace row."""
        comm, timing = self.comm, self.pipe.timing
        sends = self._sends()
        grad_sq = float(comm.backend.xp.dot(self.state.grad, self.state.grad))
        mine = np.array([self.loss_sum, self.loss_max, self.iterations, grad_sq, timing.busy,
                         timing.idle, timing.samples, sends - self.sends_base, float(stop),
                         evaluation if math.isfinite(evaluation) else 0.0])
        everyone = comm.allgather(mine, trace_io.LABEL)
        col = {name: everyone[:, i] for i, name in enumerate(_FIELDS)}
        lastrow = comm.size - 1
        iterations = int(col["iterations"][lastrow])
        busy, idle = col["busy"], col["idle"]
        spent = busy + idle
        bubbles = np.divide(idle, spent, out=np.zeros_like(idle), where=spent > 0)
        per_op = np.divide(busy, 2 * col["samples"], out=np.zeros_like(busy),
                           where=col["samples"] > 0)
        self.tau = float(per_op.max())
        self.modelled += iterations * 2 * self.tau * (self.samples + self.stages - 1)
        self.messages += int(col["sends"].sum())
        self.busy_total += float(busy.sum())
        self.idle_total += float(idle.sum())
        algo = self.built.algorithm
        lr = algo.lr if getattr(algo, "outer", "nesterov") == "nesterov" else \
            algo.eta(self.state.step, self.state.alpha)  # type: ignore[union-attr]
        fields: dict[str, Any] = {
            "step": tick, "rounds": 0,
            "loss_mean": col["loss_sum"][lastrow] / iterations if iterations else math.nan,
            "loss_max": col["loss_max"][lastrow] if iterations else math.nan,
            "grad_norm": math.sqrt(col["grad_sq"].sum()),
            "grad_norm_max": math.sqrt(col["grad_sq"].max()),
            "lr": lr, "wall": self.wall(),
            "eval_loss": col["eval"].sum() if math.isfinite(evaluation) else math.nan,
            "eval_accuracy": math.nan,
            "bubble": float(bubbles.mean()), "bubble_ideal": self.ideal, "tau": self.tau,
            "modelled_time": self.modelled, "messages": self.messages,
            **{f"busy_{s}": float(busy[s]) for s in range(comm.size)},
            **{f"idle_{s}": float(idle[s]) for s in range(comm.size)},
        }
        if self.writer is not None:
            self.writer.append(fields, trace_io.comm_totals(comm))
        self.history.append(dict(fields))
        self.loss_sum, self.loss_max, self.iterations = 0.0, 0.0, 0
        self.sends_base = sends
        timing.reset()
        return {**fields, "stop": bool(col["stop"].max() > 0)}

    def save(self, tick: int) -> None:
        """Collective: write this iteration's checkpoint (rank 0 writes, then prunes)."""
        if self.writer is not None:
            self.writer.flush()
        assert self.out is not None
        finite = bool(self.comm.backend.xp.isfinite(self.state.x).all())
        if self.comm.allreduce_scalar(0.0 if finite else 1.0, label=pipe_ckpt.LABEL):
            raise nonfinite_parameters(f"iteration {tick}", self.checkpoint, skip=False)
        path = ckpt_io.checkpoint_path(self.out, tick)
        window = np.array([self.loss_sum, self.loss_max, self.iterations, self.messages,
                           self._sends() - self.sends_base, self.modelled])
        block = self.pipe.params.copy()  # with x_t, not the last point evaluated, in it
        block[self.pipe.trainable] = self.state.x
        pipe_ckpt.save(path, self.comm, self.config, self.built.problem.model.layout,
                       block, self.block, self.state, window, tick, self.run_id,
                       self.writer.rows if self.writer else 0, self.wall(),
                       before_commit=(self.faults.commit_hook(self.comm.rank, tick)
                                      if self.faults else None))
        if self.comm.rank == 0:
            ckpt_io.prune(path.parent, self.config.run.keep_checkpoints)
        self.checkpoint = str(path)

    def summarize(self, final: float | None, train_loss: float, threads: ThreadChoice,
                  stopped: bool) -> PipelineSummary:
        wall = float(self.comm.allreduce_host_(np.array([self.wall()]), op=MPI.MAX,
                                               label="summary")[0])
        spent = self.busy_total + self.idle_total
        return PipelineSummary(
            steps=self.state.step, samples=self.samples, stages=self.stages,
            train_loss=train_loss, final_loss=final,
            bubble=self.idle_total / spent if spent else 0.0, bubble_ideal=self.ideal,
            tau=self.tau, modelled_seconds=self.modelled, wall_seconds=wall,
            messages=self.messages, threads=threads, out=str(self.out or ""),
            checkpoint=self.checkpoint, stopped=stopped, history=self.history)


def _trace_writer(config: Config, problem: StagedProblem, out: Path | None, run_id: str,
                  ckpt: pipe_ckpt.PipelineCheckpoint | None,
                  comm: Comm) -> trace_io.TraceWriter | None:
    """The trace with the pipeline columns: bubble, tau, modelled time, messages, per stage."""
    columns = ("bubble", "bubble_ideal", "tau", "modelled_time", "messages",
               *(f"{kind}_{s}" for kind in trace_io.STAGE_COLUMNS for s in range(comm.size)))
    return open_trace(config, out, run_id, comm, problem.model.layout.size,
                      (ckpt.trace_rows, ckpt.tick) if ckpt else None, columns)
