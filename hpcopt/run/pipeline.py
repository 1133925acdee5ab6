"""The pipeline session (PPRS, pipelined GD and AGD): one rank per stage.

``mpiexec -n DELTA python -m hpcopt train --algorithm pprs ...`` ends up here (``hpcopt.train``
dispatches on the algorithm). The data-parallel session averages one model per rank; here rank
s owns stage s, the only traffic of an iteration is the pipeline's own point-to-point messages
(label ``<algorithm>.activation`` / ``.gradient``), and every stage runs the same update on its
block. Iterations are full-batch, so an epoch is one iteration: ``--steps N`` (else
``--epochs``, rounded up) iterations. With ``--device gpu`` each stage's parameters, optimizer
state, activations and gradients are CuPy arrays on the GPU of its node-local rank, and the
messages between stages go straight through or staged (hpcopt/comm/staging.py), as for the data-
parallel loop.

At an iteration t (every rank passes the same ones, in order):

1. ``eval_every`` divides t: f(x_t) without smoothing, by one forward pass (label ``eval``);
2. ``trace_every`` or ``eval_every`` divides t: a trace row, from one small allgather (label
   ``trace``) of each stage's window: loss (last stage), ||g|| of its block, busy and idle
   seconds, messages sent, the stop value (the stop signal and a checkpoint request). The row:
   loss, ||g||, per-stage busy/idle, the measured bubble (mean over stages of idle / (busy +
   idle)) against the ideal (Delta - 1) / (K + Delta - 1), tau (the slowest stage's busy
   seconds per forward or backward of one sample), the modelled pipeline time sum of
   2 tau (K + Delta - 1) per iteration, and the messages sent so far by all stages;
3. a checkpoint (``checkpoint_every``, ``checkpoint_minutes``, the last iteration, or a stop):
   each stage's block and optimizer state (``hpcopt.io.pipeline_checkpoint``).

The runner (``hpcopt.run.runner``) does the rest, as for every workload: set-up agreed by all
ranks, the run directory, SIGTERM and SIGINT, the stall watchdog, progress lines and the summary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from ..algorithms.pprs import PipelineState
from ..comm import Comm
from ..config import Config, check_resume
from ..errors import HpcoptError
from ..io import pipeline_checkpoint as pipe_ckpt
from ..io import trace as trace_io
from ..pipeline.executor import Pipeline
from ..pipeline.parts import Algorithm, build_algorithm, build_problem, describe, plan_for
from ..pipeline.schedules import ideal_bubble
from ..pipeline.split import StagePlan
from ..problems.staged import StagedProblem, setup_stage
from . import checkpointing, directory
from .faults import FaultPlan
from .nonfinite import nonfinite_loss, nonfinite_parameters
from .preflight import CHECKPOINT_OVERHEAD
from .runner import RunFiles, Ticks, run, wall_text
from .threads import ThreadChoice
from .window import LABEL as TRACE_LABEL
from .window import Row, WindowStats, comm_totals, read_stop

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
    final_loss: float | None     # f(x_T) without smoothing; None when stopped by a signal
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
    stop_signal: str = ""        # what stopped it: "SIGTERM" or "SIGINT" ("" when not stopped)
    history: list[dict[str, float]] = field(default_factory=list)  # every trace row
    earlier_seconds: float = 0.0  # a resumed run: the wall seconds of its earlier jobs (in wall_seconds)

    def lines(self) -> list[str]:
        first = (f"final loss        {self.final_loss:.6g} (f(x) without smoothing)"
                 if self.final_loss is not None else
                 f"stopped           by {self.stop_signal} before the end; resume from the "
                 "checkpoint below")
        return [
            first,
            f"train loss        {self.train_loss:.6g} (last trace row)",
            f"iterations        {self.steps}, K={self.samples} sample(s) each over "
            f"{self.stages} stage(s)",
            f"bubble            {100 * self.bubble:.1f}% measured (mean over stages), "
            f"{100 * self.bubble_ideal:.1f}% ideal (Delta-1)/(K+Delta-1)",
            f"messages          {self.messages:,} point-to-point, all stages",
            f"time              {wall_text(self.wall_seconds, self.earlier_seconds, 2)} measured, "
            f"{self.modelled_seconds:.2f} s "
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


def _build(config: Config, comm: Comm, problem: StagedProblem | None) -> _Built:
    """Check the rank count against the stage plan (from the architecture alone), then build
    the problem and the algorithm. No communication: run inside ``agreed``."""
    if getattr(config.run, "network", ""):
        raise HpcoptError("network applies only to data-parallel algorithms")
    total = config.run.steps or math.ceil(config.run.epochs)
    xp = comm.backend.xp
    if problem is not None and problem.xp is not xp:
        raise HpcoptError(f"the given problem holds {problem.xp.__name__} arrays, but this run's "
                          f"device {config.run.device} needs {xp.__name__} arrays")
    architecture = problem or build_problem(config, architecture_only=True)
    plan = plan_for(config, architecture.model, comm.size)
    problem = problem or build_problem(config, xp=xp)
    trainable = int(problem.trainable_mask().sum())
    if trainable == 0:
        raise HpcoptError(f"{problem.name} has no trainable parameters")
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
    last good checkpoint kept), and ``faults``, a debug fault to inject (hpcopt.run.faults; STEP
    counts iterations)."""
    summary, session = run(PipelineSessionBuilder(problem, faults), config, comm or Comm(), verbose, resume)
    return summary, session.state


class PipelineSessionBuilder:
    """The runner's builder of a pipeline run: ``problem`` (None: the config's) cut into stages."""

    noun = "iteration"

    def __init__(self, problem: StagedProblem | None = None, faults: FaultPlan | None = None) -> None:
        self.problem, self.faults = problem, faults

    def read_checkpoint(self, path: str | Path, comm: Comm) -> pipe_ckpt.PipelineCheckpoint:
        return pipe_ckpt.read(path, comm.size)

    def build(self, config: Config, comm: Comm, ckpt: Any) -> PipelineSession:
        return PipelineSession(config, comm, _build(config, comm, self.problem), self.faults)


class PipelineSession:
    """A pipeline run in progress on this rank (the runner's ``Session``)."""

    state: PipelineState  # from start()

    def __init__(self, config: Config, comm: Comm, built: _Built,
                 faults: FaultPlan | None = None) -> None:
        self.config, self.comm, self.built, self.faults = config, comm, built, faults
        algo_cfg, prob = config.algorithm, built.problem
        self.label = algo_cfg.algorithm
        setup = setup_stage(prob, comm, built.plan, kind=algo_cfg.pipeline, label=self.label,
                            dtype=np.dtype(config.run.dtype))
        self.pipe = setup.pipeline
        self.evaluator = Pipeline(prob.model, built.plan, self.pipe.params, comm, prob.input_shape,
                                  source=prob.source, sink=prob.sink, frozen=prob.frozen,
                                  kind=algo_cfg.pipeline, label=EVAL_LABEL)
        self.setup = setup
        self.block = built.plan.param_slice(prob.model, comm.rank)
        run = config.run
        self.ticks = Ticks(built.total, run.trace_every, run.eval_every, run.checkpoint_every)
        self.samples = built.algorithm.samples_per_iteration
        self.stages = comm.size
        self.ideal = ideal_bubble(self.stages, self.samples)
        self._restore_window(np.zeros(len(pipe_ckpt.WINDOW_COLUMNS)))
        self.sends_base = 0
        self.busy_total = self.idle_total = 0.0
        self.tau = math.nan
        self.history: list[dict[str, float]] = []
        self.checkpoint = ""
        self.resumed_from = ""
        self.files: RunFiles | None = None
        self.rank_loss = None  # a lost stage ends the job (--on-rank-loss continue is refused)

    def _restore_window(self, window: np.ndarray) -> None:
        """The window since the last row (saved in checkpoints) and the run's running totals."""
        self.loss_sum, self.loss_max, self.iterations = float(window[0]), float(window[1]), int(window[2])
        self.messages, self.modelled = int(window[3]), float(window[5])
        self.pending_sends = int(window[4])  # this rank's sends before a resume, not yet in a row

    # -- set-up --------------------------------------------------------------------------------

    def progress(self) -> int:
        return self.state.step

    def start(self, comm: Comm) -> None:
        """The algorithm's state on this stage's block (the stage plan was checked against the
        rank count when built)."""
        self.state = self.built.algorithm.init(self.setup.x0, comm, self.setup.box)

    def restore(self, ckpt: pipe_ckpt.PipelineCheckpoint) -> None:
        check_resume(ckpt.config, self.config)
        if ckpt.tick >= self.ticks.total:
            raise HpcoptError(f"{ckpt.path} is at iteration {ckpt.tick} of {self.ticks.total}: the "
                              "run is complete (pass --steps N with N larger to train further)")
        self._restore_window(checkpointing.restore_pipeline(ckpt, self.comm.rank, self.pipe.params,
                                                            self.block, self.state, self.comm.backend))
        self.resumed_from = str(ckpt.path)

    def trace_columns(self) -> tuple[tuple[str, ...], dict[str, Any]]:
        """The pipeline columns: bubble, tau, modelled time, messages, per stage busy and idle."""
        return ("bubble", "bubble_ideal", "tau", "modelled_time", "messages",
                *(f"{kind}_{s}" for kind in trace_io.STAGE_COLUMNS for s in range(self.stages))), {}

    def parameters(self) -> int:
        return self.built.problem.model.layout.size

    def checkpoint_bytes(self) -> int:
        """Every stage's block and (at most) three optimizer vectors of it, plus the overhead."""
        itemsize = np.dtype(self.config.run.dtype).itemsize
        return 4 * itemsize * self.parameters() + CHECKPOINT_OVERHEAD

    def header(self, threads: ThreadChoice) -> str:
        built, config = self.built, self.config
        setting = describe(config, built.problem, built.plan, built.algorithm)
        return (f"hpcopt train: {self.label} on {setting}, {config.run.dtype}, {built.total} "
                f"iterations, {threads.describe()}")

    # -- the loop ------------------------------------------------------------------------------

    def begin(self, files: RunFiles, ckpt: pipe_ckpt.PipelineCheckpoint | None) -> None:
        self.files, self.config = files, files.config
        if ckpt is not None:
            checkpointing.restore_counters(ckpt.comm, self.comm)
        self.sends_base = self._sends() - self.pending_sends
        self.pipe.timing.reset()

    def steps_left(self) -> int:
        return self.ticks.total - self.state.step

    def step(self) -> int:
        comm, state = self.comm, self.state
        if self.faults is not None and self.faults.before_gradient(comm.rank, state.step + 1, None):
            state.x.reshape(-1)[0] = math.nan  # "nan": this stage's parameters
        loss = self.built.algorithm.step(state, self.pipe.gradient, comm)
        if comm.rank == comm.size - 1:
            self.loss_sum += loss
            self.loss_max = max(self.loss_max, loss) if self.iterations else loss
        self.iterations += 1
        return state.step

    def evaluate(self, tick: int) -> float:
        """f(x_t) without smoothing: its part on the last stage, 0 on the others."""
        return self.evaluator.loss(self.state.x)

    def _sends(self) -> int:
        stats = self.comm.stats
        return sum(stats.totals(label=f"{self.label}.{kind}", op="send").calls
                   for kind in ("activation", "gradient"))

    def row(self, tick: int, evaluation: float | None, stop: float) -> list[Row]:
        """One allgather (label "trace") of each stage's window; the row, finished at once."""
        comm, timing = self.comm, self.pipe.timing
        sends = self._sends()
        grad_sq = float(comm.backend.xp.dot(self.state.grad, self.state.grad))
        mine = np.array([self.loss_sum, self.loss_max, self.iterations, grad_sq, timing.busy,
                         timing.idle, timing.samples, sends - self.sends_base, stop,
                         0.0 if evaluation is None else evaluation])
        everyone = comm.allgather(mine, TRACE_LABEL)
        col = {name: everyone[:, i] for i, name in enumerate(_FIELDS)}
        last = comm.size - 1
        iterations = int(col["iterations"][last])
        signal, checkpoint = read_stop(col["stop"])
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
        stats = WindowStats(
            loss_mean=col["loss_sum"][last] / iterations if iterations else math.nan,
            loss_max=col["loss_max"][last] if iterations else math.nan,
            grad_norm=math.sqrt(col["grad_sq"].sum()), grad_norm_max=math.sqrt(col["grad_sq"].max()),
            stop=signal, checkpoint=checkpoint)
        fields: dict[str, Any] = {
            "step": tick, "rounds": 0, "lr": self.built.algorithm.step_size(self.state),
            "wall": self._files().wall(),
            "eval_loss": col["eval"].sum() if evaluation is not None else math.nan,
            "eval_accuracy": math.nan,
            "bubble": float(bubbles.mean()), "bubble_ideal": self.ideal, "tau": self.tau,
            "modelled_time": self.modelled, "messages": self.messages,
            **{f"busy_{s}": float(busy[s]) for s in range(comm.size)},
            **{f"idle_{s}": float(idle[s]) for s in range(comm.size)},
        }
        row = {**fields, **stats.columns()}
        writer = self._files().writer
        if writer is not None:
            writer.append(row, comm_totals(comm))
        self.history.append(dict(row))  # the summary's own copy: the writer keeps row until a flush
        self.loss_sum, self.loss_max, self.iterations = 0.0, 0.0, 0
        self.sends_base = sends
        timing.reset()
        return [Row(tick, fields, {}, stats)]

    def finish_rows(self) -> list[Row]:
        return []  # rows are finished as they are made

    def check_rows(self, rows: list[Row], tick: int) -> None:
        """The same rows on every stage: all stop at a non-finite loss."""
        for row in rows:
            assert row.stats is not None
            if not math.isfinite(row.stats.loss_mean):
                raise nonfinite_loss(f"iteration {row.tick} (mean loss {row.stats.loss_mean})",
                                     self.checkpoint or self.resumed_from, skip=False)

    def note(self, row: Row) -> str:
        assert row.stats is not None
        return (f"loss {row.stats.loss_mean:.6g} | bubble {100 * row.fields['bubble']:.1f}% "
                f"(ideal {100 * self.ideal:.1f}%)")

    def save(self, tick: int) -> None:
        """Write this iteration's checkpoint (rank 0 writes, then prunes)."""
        files, comm = self._files(), self.comm
        if files.writer is not None:
            files.writer.flush()
        assert files.out is not None
        finite = bool(comm.backend.xp.isfinite(self.state.x).all())
        if comm.allreduce_scalar(0.0 if finite else 1.0, label=checkpointing.LABEL):
            raise nonfinite_parameters(f"iteration {tick}", self.checkpoint or self.resumed_from,
                                       skip=False)
        path = directory.checkpoint_path(files.out, tick)
        window = np.array([self.loss_sum, self.loss_max, self.iterations, self.messages,
                           self._sends() - self.sends_base, self.modelled])
        block = self.pipe.params.copy()  # with x_t, not the last point evaluated, in it
        block[self.pipe.trainable] = self.state.x
        checkpointing.save_pipeline(path, comm, files.config, self.built.problem.model.layout,
                                    block, self.block, self.state, window, tick, files.run_id,
                                    files.writer.rows if files.writer else 0, files.wall(),
                                    before_commit=(self.faults.commit_hook(comm.rank, tick)
                                                   if self.faults else None))
        if comm.rank == 0:
            directory.prune(path.parent, files.config.run.keep_checkpoints, files.run_id)
        self.checkpoint = str(path)

    def last_rows(self, tick: int) -> list[Row]:
        return self.row(self.state.step, None, 0) if self.iterations else []

    def final(self) -> float:
        return self.comm.allreduce_scalar(self.evaluator.loss(self.state.x), label=EVAL_LABEL)

    def summarize(self, final: float | None, train_loss: float, threads: ThreadChoice,
                  stopped: str, show: bool) -> PipelineSummary:
        files = self._files()
        wall = float(self.comm.allreduce_host_(np.array([files.wall()]), op=MPI.MAX,
                                               label="summary")[0])
        spent = self.busy_total + self.idle_total
        return PipelineSummary(
            steps=self.state.step, samples=self.samples, stages=self.stages,
            train_loss=train_loss, final_loss=final,
            bubble=self.idle_total / spent if spent else 0.0, bubble_ideal=self.ideal,
            tau=self.tau, modelled_seconds=self.modelled, wall_seconds=wall,
            messages=self.messages, threads=threads, out=str(files.out or ""),
            checkpoint=self.checkpoint, stopped=bool(stopped), stop_signal=stopped,
            history=self.history, earlier_seconds=files.wall_before)

    def trace_summary(self, final: float, summary: PipelineSummary) -> dict[str, Any]:
        return {"step": self.state.step, "wall": summary.wall_seconds, "final_loss": final,
                "messages": self.messages, "bubble": summary.bubble, "bubble_ideal": self.ideal,
                "modelled_time": self.modelled, "checkpoint": self.checkpoint}

    def _files(self) -> RunFiles:
        assert self.files is not None, "begin() comes first"
        return self.files
