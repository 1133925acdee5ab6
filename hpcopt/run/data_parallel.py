"""Data-parallel training: every rank holds a model, the algorithm averages them.

The workload (``hpcopt.Workload``: from the config's [data] and [model] sections, or
from user code) plugs into the runner (``hpcopt.run.runner``) through this module's session.
Ticks are those of ``algorithm.clock``; at a tick the runner asks, in order:

1. evaluation of the averaged model (a copy is averaged mid-round, label "eval");
2. a trace row: the window's reduction (one small non-blocking collective, label "trace")
   starts, and the previous row's finishes, so no rank waits for it on the step path;
3. a checkpoint of the averaged model and every rank's state.

After the last tick: a row for a partial last window, the "final" average when the run ended
mid-round (with the batch-norm buffer policy on the same label), the final evaluation. On the
same number of ranks a resumed run's losses, parameters and trace are bitwise the uninterrupted
run's. The session names no algorithm: each reports its own trace columns, summary figures and
lines (``trace_columns``, ``summary_tallies``, ``summary_report``: ``DataParallelAlgorithm``),
and each evaluation its own (``summary_line``, ``row_fields``, ``final_fields``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from ..algorithms.buffers import sync_buffers
from ..algorithms.data_parallel import DataParallelState
from ..build import RunParts, build_run
from ..comm import GROUP_LABEL, Comm
from ..comm.core import agreed, node_indices, prepare_progress, progress_mode
from ..comm.costmodel import (
    HIDDEN,
    SETUP_LABELS,
    NodeLayout,
    comm_modelled,
    get_profile,
    main_ops,
    network_delay,
    node_layout_of,
    profile_attrs,
)
from ..comm.progress import HIDDEN_COLUMN
from ..comm.ulfm import unavailable
from ..config import Config, check_resume
from ..errors import HpcoptError
from ..io import data_parallel_checkpoint as ckpt_io
from ..io import trace as trace_io
from ..io.trace import PEAK_COLUMN
from ..workload import ModelEvaluation, Workload
from . import checkpointing, directory
from .fault_schedule import Schedule, check_ranks, check_reached, stop_received
from .faults import FaultPlan
from .nonfinite import StepGuard
from .preflight import agree_ticks, estimate
from .rank_loss import RankLossRecovery
from .rescale import rescaled
from .runner import RunFiles, Ticks, run, wall_text
from .threads import ThreadChoice
from .window import Row, Window, comm_totals

State = DataParallelState
#: The labels of the rounds, whose modelled seconds a call the summary shows (``--network``).


@dataclass
class Summary:
    """What a run reports (identical on every rank). ``final`` is None when it was stopped."""

    steps: int
    rounds: int
    final: ModelEvaluation | None
    train_loss: float
    wall_seconds: float
    comm_seconds: float            # mean over ranks, while the wall clock runs (no set-up labels)
    bytes_per_rank: float          # mean over ranks, all labels
    average_bytes_per_rank: float  # the algorithm's own label (with streaming fragments')
    in_node_bytes_per_rank: float  # of bytes_per_rank, on communicators within one node
    parameters: int
    workers: int
    samples_per_second: float      # all ranks together (tokens for a language model)
    threads: ThreadChoice
    out: str = ""
    checkpoint: str = ""           # the newest checkpoint written
    stopped: bool = False          # stopped early by a signal (a checkpoint was written)
    stop_signal: str = ""          # which: "SIGTERM" or "SIGINT" ("" when not stopped)
    history: list[tuple[int, ModelEvaluation]] = field(default_factory=list)
    unit: str = "samples"          # what samples_per_second counts: samples or tokens
    clip_fraction: float | None = None  # clipping algorithms' (their summary_report): clipped / steps
    reported: list[str] = field(default_factory=list)  # the algorithm's own lines (after steps)
    network: str = ""              # --network: the cost-model profile, and the communication
    modelled_seconds: float = 0.0  # seconds it models for this run's calls (mean over ranks)
    #: the modelled seconds of one call of each round label ("average", "group_average")
    modelled_per_round: dict[str, float] = field(default_factory=dict)
    #: two-level runs (--group-size): the group averages' rounds, bytes per rank (of
    #: bytes_per_rank) and, of those, the bytes on communicators within one node
    group_rounds: int = 0
    group_bytes_per_rank: float = 0.0
    group_in_node_bytes_per_rank: float = 0.0
    rank_losses: list[trace_io.RankLoss] = field(default_factory=list)  # --on-rank-loss continue: survived
    earlier_seconds: float = 0.0   # a resumed run: the wall seconds of its earlier jobs (in wall_seconds)

    def lines(self) -> list[str]:
        comm_share = self.comm_seconds / self.wall_seconds if self.wall_seconds else 0.0
        first = (self.final.summary_line() if self.final is not None else
                 f"stopped           by {self.stop_signal} before the end; resume from the "
                 "checkpoint below")
        a_round = f", {self.modelled_seconds / self.rounds:.4f} s a round" if self.rounds else ""
        per_round = ", ".join(f"{label} {1e3 * seconds:.3f} ms"
                              for label, seconds in self.modelled_per_round.items())
        modelled = ([f"network model     {self.network}: {self.modelled_seconds:.3f} s of communication"
                     f"{a_round} (measured {self.comm_seconds:.3f} s){'; one round: ' if per_round else ''}"
                     f"{per_round}"] if self.network else [])
        return [
            first,
            f"train loss        {self.train_loss:.4f} (last trace row, mean over ranks)",
            f"steps             {self.steps} per rank, {self.rounds} averaging rounds",
            *self.reported,
            *self._losses(),
            f"communicated      {self._communicated()}",
            *self._group_averages(),
            f"time              {wall_text(self.wall_seconds, self.earlier_seconds, 1)}, "
            f"{100 * comm_share:.1f}% in communication",
            *modelled,
            f"throughput        {self.samples_per_second:,.0f} {self.unit}/s over {self.workers} rank(s)",
            f"threads           {self.threads.describe()}",
            f"files             {self.out or 'none'} (checkpoint {self.checkpoint or 'none'})",
        ]

    def _losses(self) -> list[str]:
        """The line of the ranks lost and survived (none without a loss)."""
        if not self.rank_losses:
            return []
        each = "; ".join(f"rank {loss.rank} at step {loss.step}, {loss.recover_seconds:.3f} s to recover"
                         for loss in self.rank_losses)
        return [f"ranks lost        {len(self.rank_losses)} ({each}); finished on {self.workers}"]

    def _communicated(self) -> str:
        if self.workers == 1:  # the counters hold the messages' sizes, but nothing leaves the rank
            return "nothing (1 rank: its averages and reductions move no bytes)"
        across = self.bytes_per_rank - self.in_node_bytes_per_rank
        return (f"{_megabytes(self.bytes_per_rank)} per rank ({_megabytes(self.average_bytes_per_rank)} "
                f"averaging the {self.parameters:,} parameters; {_megabytes(self.in_node_bytes_per_rank)} "
                f"in-node, {_megabytes(across)} across nodes)")


    def _group_averages(self) -> list[str]:
        """The group averages' line of a two-level run on several ranks, else none."""
        if self.workers == 1 or not self.group_rounds:
            return []
        across = self.group_bytes_per_rank - self.group_in_node_bytes_per_rank
        return [f"group averages    {_megabytes(self.group_bytes_per_rank)} per rank in {self.group_rounds} "
                f"rounds ({_megabytes(self.group_in_node_bytes_per_rank)} in-node, "
                f"{_megabytes(across)} across nodes)"]


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def evaluate_average(parts: RunParts, state: State, scratch: Any,
                     comm: Comm) -> ModelEvaluation:
    """Evaluate the averaged model without disturbing training (a copy is averaged, label eval).

    Batch-norm statistics: at a round boundary the ones the policy left; mid-round a copy of
    them with the policy applied (label eval)."""
    evaluate = parts.workload.evaluate
    if parts.algorithm.synchronized(state):
        return evaluate(state.x, state.grad, comm)  # every rank holds the average already
    scratch[...] = state.x
    model = comm.average_(scratch, label="eval")
    buffers = state.buffers
    if buffers is None:
        return evaluate(model, state.grad, comm)
    copy = buffers.copy()
    sync_buffers(copy, parts.algorithm.buffer_policy, comm, label="eval")
    return evaluate(model, state.grad, comm, buffers=copy)


def _evaluation_fields(evaluation: ModelEvaluation | None, lm: bool) -> dict[str, float]:
    """The trace's evaluation columns: eval_loss, eval_accuracy and (LMs) eval_perplexity, NaN
    where the evaluation has none (none at all on a row without one)."""
    fields = dict.fromkeys(("eval_loss", "eval_accuracy", *(("eval_perplexity",) if lm else ())), np.nan)
    if evaluation is not None:
        fields.update(evaluation.row_fields())
    return fields


class DataParallelSessionBuilder:
    """The runner's builder of a data-parallel run: ``workload`` (None: the config's) trained by
    the configured algorithm, with ``faults`` (hpcopt.run.faults) injected for tests; with
    ``ranks_changed`` a checkpoint of another number of ranks is carried over (hpcopt.run.rescale:
    every rank then reads every rank's part of it)."""

    noun = "step"

    def __init__(self, workload: Workload | None = None, faults: FaultPlan | None = None,
                 ranks_changed: bool = False) -> None:
        self.workload, self.faults, self.ranks_changed = workload, faults, ranks_changed

    def read_checkpoint(self, path: str | Path, comm: Comm) -> ckpt_io.Checkpoint:
        if self.ranks_changed:
            return ckpt_io.read_checkpoint(path, verify=False)
        return ckpt_io.read_checkpoint(path, comm.rank, comm.size, verify=False)

    def build(self, config: Config, comm: Comm, ckpt: Any) -> DataParallelSession:
        check_ranks(config.run, comm.size, resumed=ckpt is not None)
        parts = build_run(config, comm, self.workload)
        check_reached(config.run, lambda rank: parts.algorithm.steps_for(parts.total_steps, rank, comm.size),
                      comm.size)
        return DataParallelSession(config, comm, parts, self.faults)


class DataParallelSession:
    """A data-parallel run in progress on this rank (the runner's ``Session``); ``job_rank``:
    this rank in the job as it started (the survivors' run after a lost rank numbers them anew),
    the rank ``--fault`` and ``--straggler`` name."""

    state: State  # from start()
    scratch: Any  # a vector like state.x, for averages that must not touch it

    def __init__(self, config: Config, comm: Comm, parts: RunParts,
                 faults: FaultPlan | None, job_rank: int | None = None) -> None:
        self.config, self.comm, self.parts = config, comm, parts
        comm.backend = parts.backend
        self.algorithm, self.workload = parts.algorithm, parts.workload
        workload = parts.workload
        self.window = Window(parts.backend, clipping=self.algorithm.clips)
        run = config.run
        self.ticks = Ticks(self.algorithm.clock_ticks(parts.total_steps), run.trace_every,
                           run.eval_every, run.checkpoint_every)
        self.network = get_profile(run.network) if run.network else None
        self.layout: NodeLayout | None = None  # from start()
        self.comm_progress = progress_mode(comm)  # how much of a non-blocking reduction can be hidden
        self.guard = StepGuard(run.on_nonfinite, faults, comm.rank)
        self.schedule = Schedule(run, comm.rank if job_rank is None else job_rank,  # --fault, --straggler
                                 parts.backend.synchronize, stop_received)
        self.oracle = self.window.traced(self.guard.wrap(
            self.schedule.wrap(workload.problem.oracle, lambda: self.state.step), lambda: self.state.step))
        self.history: list[tuple[int, ModelEvaluation]] = []
        self.checkpoint = ""
        self.resumed_from = ""  # the checkpoint this run continues (for a NaN/Inf message)
        self.files: RunFiles | None = None
        self.tracing = False
        #: --on-rank-loss continue: the snapshots and the losses survived (hpcopt.run.rank_loss)
        self.rank_loss = RankLossRecovery() if run.on_rank_loss == "continue" else None

    # -- set-up --------------------------------------------------------------------------------

    def progress(self) -> int:
        return self.state.step

    def start(self, comm: Comm) -> None:
        """The algorithm's initial state (it broadcasts x0), then every rank must run as many
        ticks."""
        workload, algorithm = self.workload, self.algorithm
        self.state = (algorithm.init(workload.x0, comm) if workload.buffers is None
                      else algorithm.init(workload.x0, comm, buffers=workload.buffers))
        self.scratch = self.parts.backend.xp.empty_like(self.state.x)
        agree_ticks(self.ticks.total, self.parts.local_steps, comm)
        if comm.rank == 0:
            for warning in algorithm.warnings():
                print(f"hpcopt: warning: {warning}", file=sys.stderr, flush=True)
        # with --network on several nodes, the cost model prices in-node calls at memory speed
        self.layout = node_layout_of(node_indices(comm.mpi), self.network.memory) if self.network else None

    def restore(self, ckpt: ckpt_io.Checkpoint, at_end: bool = False) -> None:
        """Check that ``ckpt`` fits this run, then load this rank's part; ``at_end``: it may be
        at the run's last tick (the survivors of a rank lost after the last step)."""
        path, layout = ckpt.path, self.workload.layout
        check_resume(ckpt.config, self.config)
        if ckpt.layout != layout:
            raise HpcoptError(f"{path}: its model ({_describe(ckpt.layout)}) does not match the "
                              f"model its config describes ({_describe(layout)})")
        if ckpt.tick >= self.ticks.total and not (at_end and ckpt.tick == self.ticks.total):
            raise HpcoptError(f"{path} is at step {ckpt.tick} of {self.ticks.total}: the run is "
                              "complete (pass --steps N with N larger to train further)")
        carried = self.workload.carried
        if ckpt.world_size != self.comm.size:
            ckpt, line = rescaled(ckpt, self.comm.size, self.comm.rank, self.state,
                                  self.workload.problem.sampler.state(), self.comm.backend.to_host,
                                  in_flight=self.algorithm.in_flight)
            if self.comm.rank == 0:
                print(line, flush=True)
        self.window.restore(checkpointing.restore(ckpt, self.comm.rank, self.state,
                                            self.workload.problem.sampler, self.comm.backend,
                                            carried[1] if carried else None))
        if self.algorithm.clock(self.state) != ckpt.tick:
            raise HpcoptError(f"{path}: its counters do not match its tick {ckpt.tick}")
        self.resumed_from = str(path)

    def trace_columns(self) -> tuple[tuple[str, ...], dict[str, Any]]:
        extra = self.algorithm.trace_columns() + \
            (("eval_perplexity",) if self.workload.language_model else ()) + self._hidden_column()
        attrs = profile_attrs(self.network, layout=self.layout) if self.network else {}
        return extra, {**attrs, "averaging": self.comm.averaging_path(self.state.x)}

    def _hidden_column(self) -> tuple[str, ...]:
        """``hidden_fraction`` where the communication thread moves this run's reductions in
        flight on (a streaming run's: those with ``peak_bytes_in_flight``)."""
        in_flight = PEAK_COLUMN in self.algorithm.trace_columns()
        return (HIDDEN_COLUMN,) if in_flight and self.comm.comm_thread is not None else ()

    def parameters(self) -> int:
        return self.workload.layout.size

    def checkpoint_bytes(self) -> int:
        return estimate(self.parts, self.comm.size)

    def header(self, threads: ThreadChoice) -> str:
        cfg, parts = self.config, self.parts
        settings = self.algorithm.describe()
        schedule = self.algorithm.describe_schedule()
        if schedule:
            settings += f", {schedule}"
        if self.workload.buffers is not None:
            settings += f", buffer_policy {self.algorithm.buffer_policy}"
        if cfg.algorithm.wire:
            settings += f", wire {cfg.algorithm.wire}"
        preset = f" (preset {cfg.run.preset})" if cfg.run.preset else ""
        return (f"hpcopt train: {cfg.algorithm.algorithm}{preset} on {self.workload.description} "
                f"({self.parameters():,} parameters, {cfg.run.dtype}), {self.comm.size} rank(s), "
                f"{settings}, {parts.total_steps} steps, {threads.describe()}")

    # -- the loop ------------------------------------------------------------------------------

    def begin(self, files: RunFiles, ckpt: ckpt_io.Checkpoint | None) -> None:
        self.files, self.config = files, files.config
        self.tracing = files.config.run.trace and files.out is not None
        if ckpt is not None:
            checkpointing.restore_counters(ckpt.comm, self.comm)
        if ckpt is not None and ckpt.world_size != self.comm.size and files.out is not None:
            self._say_what_is_replaced(files.out, ckpt)
        resumed_tick = ckpt.tick if ckpt else None
        if self.schedule.fault is None:
            self.schedule.begin(files.out, files.run_id, resumed_tick)
        else:  # every rank reads the fault's record: a bad one is one line from rank 0, not one a rank
            agreed(lambda: self.schedule.begin(files.out, files.run_id, resumed_tick), self.comm)
        self.window.armed = self._arm((ckpt.tick if ckpt else 0) + 1)

    def _say_what_is_replaced(self, out: Path, ckpt: ckpt_io.Checkpoint) -> None:
        """Rank 0, resuming on another number of ranks: one line naming the old count's newer
        checkpoints in the run directory, which this run's replace (same step) and prune."""
        newer = directory.checkpoints_after(out, ckpt.tick)
        if self.comm.rank != 0 or not newer:
            return
        names = ", ".join(path.name for path in newer[:3]) + (", ..." if len(newer) > 3 else "")
        print(f"hpcopt: --ranks-changed: {out / ckpt_io.SUBDIR} holds {len(newer)} checkpoint(s) "
              f"after step {ckpt.tick} ({names}) of the run before on {ckpt.world_size} rank(s): "
              f"this run on {self.comm.size} replaces the one at each step where it writes its "
              "own, and --keep-checkpoints prunes the oldest (resume with --out DIR to keep them)",
              flush=True)

    def _arm(self, tick: int) -> bool:
        """Take ||g|| on the steps up to ``tick`` when it ends a traced row."""
        return self.tracing and (self.ticks.row_due(tick) or tick == self.ticks.total)

    def steps_left(self) -> int:
        return self.parts.local_steps - self.state.step

    def step(self) -> int | None:
        loss = self.algorithm.step(self.state, self.oracle, self.comm)
        if self.guard.kept():
            self.window.add(loss, self.algorithm.step_clipped(self.state))
        tick = self.algorithm.clock(self.state)
        if tick is not None:
            self.window.armed = self._arm(tick + 1)
        return tick

    def evaluate(self, tick: int) -> ModelEvaluation:
        evaluation = evaluate_average(self.parts, self.state, self.scratch, self.comm)
        self.history.append((tick, evaluation))
        return evaluation

    def row(self, tick: int, evaluation: ModelEvaluation | None,
            stop: float) -> list[Row]:
        """Finish the previous row's reduction and start this tick's."""
        finished = self.window.complete(self.comm)
        state = self.state
        fields = {"step": state.step, "rounds": state.rounds, "wall": self._files().wall(),
                  "lr": self.algorithm.lr_at(max(state.step - 1, 0)),
                  **_evaluation_fields(evaluation, self.workload.language_model),
                  **self.algorithm.trace_row(state),
                  **{name: self.comm.stats.hidden_fraction() for name in self._hidden_column()}}
        totals = comm_totals(self.comm, self.network, self.layout, HIDDEN[self.comm_progress])
        row = Row(tick, fields, totals)
        self.window.post(self.comm, stop, row)
        self.guard.window_skips = 0
        return self._publish(finished)

    def finish_rows(self) -> list[Row]:
        return self._publish(self.window.complete(self.comm))

    def _publish(self, rows: list[Row]) -> list[Row]:
        writer = self._files().writer
        if writer is not None:
            if self.network is not None:
                writer.ops.update(main_ops(self.comm.stats.counters))
            for row in rows:
                assert row.stats is not None
                writer.append({**row.fields, **row.stats.columns(self.algorithm.clips)}, row.comm)
        return rows

    def check_rows(self, rows: list[Row], tick: int) -> None:
        self.guard.check_rows(rows, tick, self.checkpoint or self.resumed_from, self.finish_rows)

    def note(self, row: Row) -> str:
        assert row.stats is not None
        return f"loss {row.stats.loss_mean:.4f} | rounds {row.fields['rounds']}"

    def save(self, tick: int) -> None:
        """Write the checkpoint of this tick (rank 0 writes, then prunes old ones)."""
        files, state, comm = self._files(), self.state, self.comm
        if files.writer is not None:
            files.writer.flush()  # the checkpoint counts only rows that are on disk
        model = state.x
        synchronized = self.algorithm.synchronized(state)
        if not synchronized:
            self.scratch[...] = state.x
            model = comm.average_(self.scratch, label=checkpointing.LABEL)
        assert files.out is not None
        self.guard.check_model(model, tick, self.checkpoint or self.resumed_from)
        path = directory.checkpoint_path(files.out, tick)
        at = checkpointing.Position(files.config, self.workload.layout, tick, files.run_id,
                              files.writer.rows if files.writer else 0, files.wall())
        carried = self.workload.carried
        checkpointing.save(path, comm, at, state, synchronized=synchronized, model=model,
                     sampler=self.workload.problem.sampler, window=self.window.fold(),
                     hidden=carried[0]() if carried else None,
                     before_commit=self.guard.commit_hook(tick))
        if comm.rank == 0:
            directory.prune(path.parent, files.config.run.keep_checkpoints, files.run_id)
        self.checkpoint = str(path)

    def last_rows(self, tick: int) -> list[Row]:
        window = self.window
        rows = self.row(tick, None, 0) if window.steps or window.losses or self.guard.window_skips else []
        return rows + self.finish_rows()

    def final(self) -> ModelEvaluation:
        if not self.algorithm.synchronized(self.state):
            self.algorithm.finish(self.state, self.comm, label="final")
        self.parts.backend.synchronize()
        return evaluate_average(self.parts, self.state, self.scratch, self.comm)

    def summarize(self, final: ModelEvaluation | None, train_loss: float,
                  threads: ThreadChoice, stopped: str, show: bool) -> Summary:
        self.guard.report(self.comm, show)
        comm, state, algorithm, files = self.comm, self.state, self.algorithm, self._files()
        totals = comm.stats.totals()
        by_label = (comm_modelled(comm.stats.counters, comm.size, self.network,
                                  label_ranks=comm.stats.ranks, label_rails=comm.stats.rails,
                                  layout=self.layout,
                                  hidden=HIDDEN[self.comm_progress]) if self.network else {})
        modelled = sum(seconds for label, seconds in by_label.items() if label not in SETUP_LABELS)
        ops = main_ops(comm.stats.counters)  # a round's calls: those of the op that moved its bytes
        per_round = {label: by_label[label] / comm.stats.totals(label, ops[label]).calls
                     for label in algorithm.round_labels
                     if comm.stats.totals(label).calls and label in by_label}
        timed_seconds = totals.seconds - sum(comm.stats.totals(label).seconds for label in SETUP_LABELS)
        averaged = sum(comm.stats.totals(label).bytes for label in algorithm.averaged_labels)
        group = comm.stats.totals(GROUP_LABEL)
        group_rounds = comm.stats.totals(GROUP_LABEL, ops[GROUP_LABEL]).calls if group.calls else 0
        local = np.array([timed_seconds, totals.bytes, averaged,
                          self.workload.processed(state.step), modelled, totals.in_node_bytes,
                          group.bytes, group.in_node_bytes, *algorithm.summary_tallies(state)])
        comm.allreduce_host_(local, label="summary")
        figures, reported = algorithm.summary_report(local[8:].tolist())
        wall = float(comm.allreduce_host_(np.array([files.wall()]), op=MPI.MAX, label="summary")[0])
        size = comm.size
        return Summary(steps=state.step, rounds=state.rounds, final=final, train_loss=train_loss,
                       wall_seconds=wall, comm_seconds=local[0] / size, bytes_per_rank=local[1] / size,
                       average_bytes_per_rank=local[2] / size, in_node_bytes_per_rank=local[5] / size,
                       parameters=self.parameters(),
                       workers=size, samples_per_second=local[3] / wall if wall else 0.0,
                       threads=threads, out=str(files.out or ""), checkpoint=self.checkpoint,
                       stopped=bool(stopped), stop_signal=stopped, history=self.history,
                       unit=self.workload.unit,
                       network=self.network.name if self.network else "",
                       modelled_seconds=local[4] / size, modelled_per_round=per_round,
                       group_rounds=group_rounds,
                       group_bytes_per_rank=local[6] / size, group_in_node_bytes_per_rank=local[7] / size,
                       reported=reported, rank_losses=self.rank_loss.losses if self.rank_loss else [],
                       earlier_seconds=files.wall_before,
                       **figures)

    def trace_summary(self, final: ModelEvaluation, summary: Summary) -> dict[str, Any]:
        state = self.state
        return {"step": state.step, "rounds": state.rounds, "wall": self._files().wall(),
                "bytes": sum(c[1] for c in comm_totals(self.comm).values()),
                **final.final_fields(), "checkpoint": self.checkpoint}

    def _files(self) -> RunFiles:
        assert self.files is not None, "begin() comes first"
        return self.files


def _describe(layout: Any) -> str:
    return ", ".join(f"{name} {'x'.join(map(str, shape))}" for name, shape in layout.entries)


def train_data_parallel(config: Config, comm: Comm, verbose: bool = True,
                        resume: str | Path | None = None, faults: FaultPlan | None = None,
                        workload: Workload | None = None,
                        ranks_changed: bool = False) -> tuple[Summary, State]:
    """``hpcopt.train`` for the data-parallel algorithms (see there)."""
    if config.run.on_rank_loss == "continue":
        why = unavailable() or ("the survivors rebuild the workload the config describes, not a "
                                "Workload given in code" if workload is not None else "")
        if why:
            raise HpcoptError(f"--on-rank-loss continue: {why} (--on-rank-loss abort, the default, "
                              "ends the job at a lost rank; resume its last checkpoint)", everywhere=True)
        if config.run.averaging == "shm":
            raise HpcoptError("--on-rank-loss continue: --averaging shm's RMA windows do not survive a "
                              "lost rank (a loss in their barrier ends the job); use --averaging mpi "
                              "or auto, which is mpi under continue", everywhere=True)
    # under continue, auto is the plain MPI path from the start: a rank lost inside a shared-memory
    # window's barrier is reported as MPI_ERR_OTHER, not as a failed process, and ends the job
    comm.averaging = ("mpi" if config.run.on_rank_loss == "continue" and config.run.averaging == "auto"
                      else config.run.averaging)
    if config.run.network_delay:  # sleep what the modelled network would take, after every call
        comm.stats.delay = network_delay(get_profile(config.run.network), comm.size)
    prepare_progress(config.run.comm_progress, comm)
    builder = DataParallelSessionBuilder(workload, faults, ranks_changed)
    summary, session = run(builder, config, comm, verbose, resume)
    comm.stop_comm_thread()  # the run's own: a later run on this Comm chooses again
    return summary, session.state
