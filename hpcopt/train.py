"""The training loop: steps, trace rows, evaluation, checkpoints, resume, progress, summary.

Everything outside the algorithm's own communication happens at ticks of ``algorithm.clock``
(the only points every rank passes in the same order), in this order at a tick t:

1. evaluation of the averaged model, when ``eval_every`` divides t (label "eval");
2. a trace row, when ``trace_every`` or ``eval_every`` divides t: the window's reduction (one
   small non-blocking collective, label "trace") starts, and the previous row's finishes. It
   carries the SIGTERM flag, so ranks agree to stop at the same tick (the first row tick after
   a finished row shows the flag) without any extra collective;
3. a checkpoint, when ``checkpoint_every`` divides t, at the last tick, or when stopping (the
   rows in flight are finished first, so a checkpoint counts every row before it).

After the last tick: a row for a partial last window, the "final" average when the run ended
mid-round (with the batch-norm buffer policy on the same label), the final evaluation. A
resumed run restores the state at a checkpoint's tick and then performs exactly the operations
the uninterrupted run performs after that tick, so on the same number of ranks its losses,
parameters and trace are bitwise the same.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from .algorithms.buffers import sync_buffers
from .algorithms.data_parallel import DataParallelState
from .algorithms.local_sgd import AVERAGE_LABEL
from .build import RunParts, build_run
from .comm import Comm, agreed, node_layout
from .config import Config, check_resume
from .costmodel import (
    SETUP_LABELS,
    NetworkProfile,
    comm_modelled,
    get_profile,
    main_ops,
    network_delay,
    profile_attrs,
)
from .errors import UserError
from .faults import FaultPlan
from .io import checkpoint as ckpt_io
from .io import trace as trace_io
from .io.vet import vet_checkpoint
from .nonfinite import StepGuard
from .preflight import agree_ticks, check_output
from .problems.classification import Evaluation
from .problems.language_model import LMEvaluation
from .progress import Progress
from .runs import StopSignal, header_end, open_trace, run_directory
from .staging import prepare_gpu
from .threads import ThreadChoice, configure_threads
from .watchdog import watching

State = DataParallelState


@dataclass
class Summary:
    """What a run reports (identical on every rank). ``final`` is None when it was stopped."""

    steps: int
    rounds: int
    final: Evaluation | LMEvaluation | None
    train_loss: float
    wall_seconds: float
    comm_seconds: float            # mean over ranks, while the wall clock runs (no set-up labels)
    bytes_per_rank: float          # mean over ranks, all labels
    average_bytes_per_rank: float  # the algorithm's own label
    parameters: int
    workers: int
    samples_per_second: float      # all ranks together (tokens for a language model)
    threads: ThreadChoice
    out: str = ""
    checkpoint: str = ""           # the newest checkpoint written
    stopped: bool = False          # stopped early by SIGTERM (a checkpoint was written)
    history: list[tuple[int, Evaluation | LMEvaluation]] = field(default_factory=list)
    unit: str = "samples"          # what samples_per_second counts: samples or tokens
    clip_fraction: float | None = None  # clipping algorithms: clipped steps / steps, all ranks
    network: str = ""              # --network: the cost-model profile, and the communication
    modelled_seconds: float = 0.0  # seconds it models for this run's calls (mean over ranks)

    def lines(self) -> list[str]:
        comm_share = self.comm_seconds / self.wall_seconds if self.wall_seconds else 0.0
        final = self.final
        if isinstance(final, LMEvaluation):
            first = (f"test perplexity   {final.perplexity:.3f} (loss {final.loss:.4f}, "
                     f"{final.tokens} tokens)")
        elif final is not None:
            first = (f"test accuracy     {final.accuracy:.4f} (loss {final.loss:.4f}, "
                     f"{final.samples} samples)")
        else:
            first = "stopped           by SIGTERM before the end; resume from the checkpoint below"
        clipped = ([f"clipped           {100 * self.clip_fraction:.1f}% of the steps (all ranks)"]
                   if self.clip_fraction is not None else [])
        modelled = ([f"network model     {self.network}: {self.modelled_seconds:.3f} s of communication "
                     f"(measured {self.comm_seconds:.3f} s)"] if self.network else [])
        return [
            first,
            f"train loss        {self.train_loss:.4f} (last trace row, mean over ranks)",
            f"steps             {self.steps} per rank, {self.rounds} averaging rounds",
            *clipped,
            f"communicated      {_megabytes(self.bytes_per_rank)} per rank "
            f"({_megabytes(self.average_bytes_per_rank)} averaging the {self.parameters:,} parameters)",
            f"time              {self.wall_seconds:.1f} s, {100 * comm_share:.1f}% in communication",
            *modelled,
            f"throughput        {self.samples_per_second:,.0f} {self.unit}/s over {self.workers} rank(s)",
            f"threads           {self.threads.describe()}",
            f"files             {self.out or 'none'} (checkpoint {self.checkpoint or 'none'})",
        ]


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def evaluate_average(parts: RunParts, state: State, scratch: Any,
                     comm: Comm) -> Evaluation | LMEvaluation:
    """Evaluate the averaged model without disturbing training (a copy is averaged, label eval).

    Batch-norm statistics: at a round boundary the ones the policy left; mid-round a copy of
    them with the policy applied (label eval)."""
    if parts.algorithm.synchronized(state):
        return parts.evaluate(state.x, state.grad, comm)  # every rank holds the average already
    scratch[...] = state.x
    model = comm.average_(scratch, label="eval")
    buffers = state.buffers
    if buffers is None:
        return parts.evaluate(model, state.grad, comm)
    copy = buffers.copy()
    sync_buffers(copy, parts.algorithm.buffer_policy, comm, label="eval")
    return parts.evaluate(model, state.grad, comm, buffers=copy)


def _evaluation_fields(evaluation: Evaluation | LMEvaluation | None, lm: bool) -> dict[str, float]:
    """The trace's evaluation columns: eval_loss, and eval_accuracy or (LMs) eval_perplexity."""
    fields = {"eval_loss": evaluation.loss if evaluation else np.nan,
              "eval_accuracy": getattr(evaluation, "accuracy", np.nan)}
    if lm:
        fields["eval_perplexity"] = getattr(evaluation, "perplexity", np.nan)
    return fields


@dataclass
class _Run:
    """A run in progress on this rank: its parts, state, files and clocks."""

    config: Config
    parts: RunParts
    comm: Comm
    state: State
    window: trace_io.Window
    out: Path | None                     # None: no files (no trace, no checkpoints)
    run_id: str
    writer: trace_io.TraceWriter | None  # rank 0 only, when tracing
    wall_before: float                   # seconds of earlier segments (resumed runs)
    start: float = 0.0
    checkpoint: str = ""
    network: NetworkProfile | None = None  # --network: modelled seconds in each trace row
    guard: StepGuard = field(default_factory=StepGuard)  # --on-nonfinite, --debug-fail-at

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.start

    def row(self, tick: int, evaluation: Evaluation | LMEvaluation | None,
            stop: bool) -> list[trace_io.Row]:
        """Collective: finish the previous row's reduction and start this tick's; the rows
        finished (written to the trace on rank 0)."""
        finished = self.window.complete(self.comm)
        state = self.state
        fields = {"step": state.step, "rounds": state.rounds, "wall": self.wall(),
                  "lr": self.parts.algorithm.lr_at(max(state.step - 1, 0)),
                  **_evaluation_fields(evaluation, self.config.language_model)}
        row = trace_io.Row(tick, fields, trace_io.comm_totals(self.comm, self.network))
        self.window.post(self.comm, stop, row)
        self.guard.window_skips = 0
        return self._publish(finished)

    def finish_rows(self) -> list[trace_io.Row]:
        """Collective: finish the reductions in flight; the rows finished."""
        return self._publish(self.window.complete(self.comm))

    def _publish(self, rows: list[trace_io.Row]) -> list[trace_io.Row]:
        if self.writer is not None:
            if self.network is not None:
                self.writer.ops.update(main_ops(self.comm.stats.counters))
            for row in rows:
                assert row.stats is not None
                stats = {"loss_mean": row.stats.loss_mean, "loss_max": row.stats.loss_max,
                         "grad_norm": row.stats.grad_norm, "grad_norm_max": row.stats.grad_norm_max}
                if self.parts.clipping:
                    stats["clip_fraction"] = row.stats.clip_fraction
                self.writer.append({**row.fields, **stats}, row.comm)
        return rows

    def save(self, tick: int, scratch: Any) -> None:
        """Collective: write the checkpoint of this tick (rank 0 writes, then prunes old ones).
        Rows in flight must be finished first (``finish_rows``)."""
        if self.writer is not None:
            self.writer.flush()  # the checkpoint counts only rows that are on disk
        state, comm = self.state, self.comm
        model = state.x
        synchronized = self.parts.algorithm.synchronized(state)
        if not synchronized:
            scratch[...] = state.x
            model = comm.average_(scratch, label=ckpt_io.LABEL)
        assert self.out is not None
        self.guard.check_model(model, tick, self.checkpoint)
        path = ckpt_io.checkpoint_path(self.out, tick)
        at = ckpt_io.Position(self.config, self.parts.model.layout, tick, self.run_id,
                              self.writer.rows if self.writer else 0, self.wall())
        ckpt_io.save(path, comm, at, state, synchronized=synchronized, model=model,
                     sampler=self.parts.problem.sampler, window=self.window.fold(),
                     hidden=self.parts.carried[0]() if self.parts.carried else None,
                     before_commit=self.guard.commit_hook(tick))
        if comm.rank == 0:
            ckpt_io.prune(path.parent, self.config.run.keep_checkpoints)
        self.checkpoint = str(path)


def train(config: Config, comm: Comm | None = None, verbose: bool = True,
          resume: str | Path | None = None,
          faults: FaultPlan | None = None) -> tuple[Summary, State]:
    """Run the configured data-parallel algorithm (PR-SGD, CELGC, the naive clipping baseline,
    SlowMo or any other registered one), continuing from checkpoint ``resume`` when given;
    returns the summary and this rank's final state.

    At the end every rank holds the averaged model: if the last round was partial, one more
    average is taken on the label "final" (so the "average" label counts exactly floor(T/I)).
    Files go to the run directory ``config.run.out`` (``{time}`` in it becomes the start time;
    empty: no files, the default here, while the command line defaults to ``runs/{time}``):
    ``trace.h5`` and ``checkpoints/step-<tick>.h5``. A resumed run always has one (by default
    the checkpoint's). With a run directory, SIGTERM makes the ranks agree at the next trace
    row, write a checkpoint and return with ``summary.stopped`` set. Failure handling
    (docs/failures.md): checks before the first step (hpcopt.preflight), the stall
    watchdog (``stall_timeout``), NaN/Inf (``on_nonfinite``), and ``faults``, a debug
    fault to inject (hpcopt.faults).
    """
    comm = comm or Comm()
    comm.averaging = config.run.averaging
    if config.run.network_delay:  # sleep what the modelled network would take, after every call
        comm.stats.delay = network_delay(get_profile(config.run.network), comm.size)
    local_rank, local_size = node_layout(comm.mpi)
    threads = configure_threads(local_size)
    if config.run.device == "gpu":  # the GPU of this node-local rank, and how MPI reaches it
        agreed(lambda: prepare_gpu(comm, local_rank), comm)
    ckpt = None
    if resume:  # rank 0 has a child process read the whole file (hpcopt.io.vet) and check its
        # digest; then each rank reads its own rows
        agreed(lambda: vet_checkpoint(resume) if comm.rank == 0 else None, comm)
        ckpt = agreed(lambda: ckpt_io.read_checkpoint(resume, comm.rank, comm.size, verify=False), comm)
    parts = agreed(lambda: build_run(config, comm), comm)
    comm.backend = parts.backend
    algorithm, backend = parts.algorithm, parts.backend
    state = (algorithm.init(parts.x0, comm) if parts.buffers is None
             else algorithm.init(parts.x0, comm, buffers=parts.buffers))
    window = trace_io.Window(backend, clipping=parts.clipping)
    total = algorithm.clock_ticks(parts.total_steps)
    agree_ticks(total, parts.local_steps, comm)
    if ckpt is not None:
        window_state = agreed(lambda: _restore(ckpt, config, parts, state, total, comm), comm)
        window.restore(window_state)
    out, run_id = run_directory(config, ckpt, comm)
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, out=str(out or "")))
    writer = agreed(lambda: _trace_writer(config, parts, out, run_id, ckpt, comm), comm)
    agreed(lambda: check_output(out, parts, comm), comm)
    run = _Run(config, parts, comm, state, window, out, run_id, writer,
               ckpt.wall_seconds if ckpt else 0.0,
               network=get_profile(config.run.network) if config.run.network else None)
    run.guard = StepGuard(config.run.on_nonfinite, faults, comm.rank)
    show = verbose and config.run.progress and comm.rank == 0
    if show:
        print(_header(parts, comm, threads, out, ckpt), flush=True)
    try:
        with StopSignal(out is not None) as stop_signal, \
                watching(comm, config.run.stall_timeout, lambda: state.step):
            summary = _loop(run, ckpt, total, stop_signal, threads, show)
    finally:
        comm.stats.delay = None  # delay mode ends with the run
        if writer is not None:
            writer.close()
    if show:
        print("summary\n  " + "\n  ".join(summary.lines()), flush=True)
    if summary.stopped and verbose and comm.rank == 0:
        print(f"hpcopt: SIGTERM: stopped at step {state.step} after writing {summary.checkpoint}; "
              f"continue with: mpiexec -n {comm.size} python -m hpcopt resume {summary.checkpoint}",
              flush=True)
    return summary, state


def _loop(run: _Run, ckpt: ckpt_io.Checkpoint | None, total: int, stop_signal: StopSignal,
          threads: ThreadChoice, show: bool) -> Summary:
    config, parts, comm, state, window = run.config, run.parts, run.comm, run.state, run.window
    algorithm = parts.algorithm
    every, eval_every = config.run.trace_every, config.run.eval_every
    guard = run.guard
    oracle = window.traced(guard.wrap(parts.problem.oracle, lambda: state.step))
    scratch = parts.backend.xp.empty_like(state.x)
    progress = Progress(total, show)
    history: list[tuple[int, Evaluation | LMEvaluation]] = []
    train_loss, report_due, stopped = float("nan"), False, False
    tick = ckpt.tick if ckpt else 0
    tracing = config.run.trace and run.out is not None

    def row_due(t: int) -> bool:
        return t % every == 0 or bool(eval_every and t % eval_every == 0)

    def arm(t: int) -> bool:  # take ||g|| on the steps up to tick t when it ends a traced row
        return tracing and (row_due(t) or t == total)

    def last_good() -> str:  # the newest checkpoint on disk, for a NaN/Inf stop's message
        return run.checkpoint or (str(ckpt.path) if ckpt else "")

    comm.barrier(label="start")
    if ckpt is not None:
        ckpt_io.restore_counters(ckpt, comm)
    run.start = time.perf_counter()
    progress.start -= run.wall_before
    window.armed = arm(tick + 1)
    for _ in range(parts.local_steps - state.step):
        loss = algorithm.step(state, oracle, comm)
        if guard.kept():
            window.add(loss, getattr(state, "clipped", False))  # clipping algorithms' flag
        tick_now = algorithm.clock(state)
        if tick_now is None:
            continue
        tick = tick_now
        report_due = progress.due(tick) or report_due
        evaluation = None
        if eval_every and tick % eval_every == 0:
            evaluation = evaluate_average(parts, state, scratch, comm)
            history.append((tick, evaluation))
        rows = run.row(tick, evaluation, stop_signal.raised) if row_due(tick) else []
        stopped = tick < total and any(r.stats.stop for r in rows)
        save = run.out and (stopped or tick == total or (config.run.checkpoint_every and
                                                         tick % config.run.checkpoint_every == 0))
        if save or stopped:
            rows += run.finish_rows()
        guard.check_rows(rows, tick, last_good(), run.finish_rows)
        for row in rows:
            train_loss = row.stats.loss_mean
            if report_due:
                progress.report(row.tick, f"loss {train_loss:.4f} | rounds {row.fields['rounds']}")
                report_due = False
        if save:
            run.save(tick, scratch)
        if stopped:
            break
        window.armed = arm(tick + 1)
    final = None
    if not stopped:
        rows = run.row(tick, None, False) if window.steps or window.losses or guard.window_skips else []
        rows += run.finish_rows()
        guard.check_rows(rows, tick, last_good(), run.finish_rows)
        for row in rows:
            train_loss = row.stats.loss_mean
        if not algorithm.synchronized(state):
            algorithm.finish(state, comm, label="final")
        parts.backend.synchronize()
        final = evaluate_average(parts, state, scratch, comm)
    guard.report(comm, show)
    summary = _summarize(run, final, train_loss, history, threads, stopped)
    if run.writer is not None and final is not None:
        run.writer.finish({"step": state.step, "rounds": state.rounds, "wall": run.wall(),
                           "bytes": sum(c[1] for c in trace_io.comm_totals(comm).values()),
                           **_final_fields(final), "checkpoint": run.checkpoint})
    return summary


def _restore(ckpt: ckpt_io.Checkpoint, config: Config, parts: RunParts, state: State,
             total: int, comm: Comm) -> np.ndarray:
    """Check that ``ckpt`` fits this run, then load this rank's part; the trace window to go on."""
    path = ckpt.path
    check_resume(ckpt.config, config)
    if ckpt.layout != parts.model.layout:
        raise UserError(f"{path}: its model ({_describe(ckpt.layout)}) does not match the model "
                        f"its config describes ({_describe(parts.model.layout)})")
    if ckpt.tick >= total:
        raise UserError(f"{path} is at step {ckpt.tick} of {total}: the run is complete "
                        "(pass --steps N with N larger to train further)")
    window = ckpt_io.restore(ckpt, comm.rank, state, parts.problem.sampler, comm.backend,
                             parts.carried[1] if parts.carried else None)
    if parts.algorithm.clock(state) != ckpt.tick:
        raise UserError(f"{path}: its counters do not match its tick {ckpt.tick}")
    return window


def _describe(layout: Any) -> str:
    return ", ".join(f"{name} {'x'.join(map(str, shape))}" for name, shape in layout.entries)


def _trace_writer(config: Config, parts: RunParts, out: Path | None, run_id: str,
                  ckpt: ckpt_io.Checkpoint | None, comm: Comm) -> trace_io.TraceWriter | None:
    network = profile_attrs(get_profile(config.run.network)) if config.run.network else {}
    extra = (("clip_fraction",) if parts.clipping else ()) + \
        (("eval_perplexity",) if config.language_model else ())
    return open_trace(config, out, run_id, comm, parts.model.layout.size,
                      (ckpt.trace_rows, ckpt.tick) if ckpt else None, extra, network)


def _summarize(run: _Run, final: Evaluation | LMEvaluation | None, train_loss: float,
               history: list[tuple[int, Evaluation | LMEvaluation]], threads: ThreadChoice,
               stopped: bool) -> Summary:
    comm, state, parts = run.comm, run.state, run.parts
    totals = comm.stats.totals()
    modelled = (sum(seconds for label, seconds in
                    comm_modelled(comm.stats.counters, comm.size, run.network).items()
                    if label not in SETUP_LABELS) if run.network else 0.0)
    timed_seconds = totals.seconds - sum(comm.stats.totals(label).seconds for label in SETUP_LABELS)
    local = np.array([timed_seconds, totals.bytes, comm.stats.totals(AVERAGE_LABEL).bytes,
                      parts.processed(state.step), int(getattr(state, "clip_count", 0)),
                      state.step, modelled])
    comm.allreduce_host_(local, label="summary")
    wall = float(comm.allreduce_host_(np.array([run.wall()]), op=MPI.MAX, label="summary")[0])
    size = comm.size
    return Summary(steps=state.step, rounds=state.rounds, final=final, train_loss=train_loss,
                   wall_seconds=wall, comm_seconds=local[0] / size, bytes_per_rank=local[1] / size,
                   average_bytes_per_rank=local[2] / size, parameters=parts.model.layout.size,
                   workers=size, samples_per_second=local[3] / wall if wall else 0.0,
                   threads=threads, out=str(run.out or ""), checkpoint=run.checkpoint, stopped=stopped,
                   history=history, unit=parts.unit,
                   network=run.network.name if run.network else "", modelled_seconds=local[6] / size,
                   clip_fraction=((float(local[4] / local[5]) if local[5] else 0.0)
                                  if parts.clipping else None))


def _header(parts: RunParts, comm: Comm, threads: ThreadChoice, out: Path | None,
            ckpt: ckpt_io.Checkpoint | None) -> str:
    cfg = parts.config
    resumed = f"{ckpt.path} at step {ckpt.tick}" if ckpt else ""
    return (f"hpcopt train: {cfg.algorithm.algorithm} on {parts.description} "
            f"({parts.model.layout.size:,} parameters, {cfg.run.dtype}), "
            f"{comm.size} rank(s), {_algorithm_settings(parts)}, batch {cfg.data.batch_size}/rank, "
            f"{parts.total_steps} steps, {threads.describe()}\n{header_end(out, resumed, comm)}")


def _final_fields(final: Evaluation | LMEvaluation) -> dict[str, Any]:
    """The trace summary's attributes of the final evaluation."""
    if isinstance(final, LMEvaluation):
        return {"eval_loss": final.loss, "eval_perplexity": final.perplexity,
                "eval_tokens": final.tokens}
    return {"eval_loss": final.loss, "eval_accuracy": final.accuracy, "eval_samples": final.samples}


def _algorithm_settings(parts: RunParts) -> str:
    settings = parts.algorithm.describe()
    if parts.buffers is not None:
        settings += f", buffer_policy {parts.algorithm.buffer_policy}"
    return settings
