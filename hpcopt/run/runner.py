"""The runner: one loop for every kind of run (data-parallel, pipeline, or a user's own).

It owns what every run shares: threads and the GPU, reading the checkpoint to resume from,
agreement across ranks on each set-up step (``hpcopt.comm.agreed``: a problem found on one
rank ends every rank with the same message), the run directory (locked for the job, holding
one run: ``hpcopt.run.directory.claim``) and trace file, SIGTERM and SIGINT
(``hpcopt.run.signals``), the stall watchdog, progress lines and the summary. A session builder
builds a :class:`Session` on each rank; the runner drives it through the ticks of the run (the points
every rank passes in the same order), and at a tick t:

1. ``session.evaluate`` when ``eval_every`` divides t;
2. ``session.row`` when ``trace_every`` or ``eval_every`` divides t: a trace row carrying
   this rank's stop signal, so the ranks agree to stop at the first finished row that shows
   one, without an extra collective; rank 0's value also asks for a checkpoint once
   ``checkpoint_minutes`` of wall time have passed by its clock (:class:`CheckpointClock`);
3. ``session.save`` when ``checkpoint_every`` divides t, at the last tick, when stopping, or
   at the first finished row that asks for one (the rows in flight are finished first, so a
   checkpoint counts every row before it, and a stop signal in them is seen there).

After the last tick, ``session.last_rows`` and ``session.final`` (the partial last window,
the end of a partial round, the final evaluation), then ``session.summarize``. With
``--timeline true`` the steps, evaluations, checkpoint writes and counted calls are recorded as
spans (``hpcopt.run.recorder``), gathered every 64 finished rows, before each checkpoint and at
the end. A resumed run
restores the session at a checkpoint's tick and then performs exactly the operations the
uninterrupted run performs after it, so its results are bitwise the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..backend import CPU
from ..comm import Comm, agreed, node_layout, ulfm
from ..comm.launcher import relaunch_command
from ..comm.staging import prepare_gpu
from ..comm.ulfm import is_rank_loss
from ..config import Config
from ..errors import HpcoptError
from ..io import trace as trace_io
from .directory import claim, run_directory, vet_resumed
from .files import header_end, open_trace
from .lock import RunLock
from .preflight import check_output
from .progress import Progress
from .recorder import Recorder, open_timeline
from .signals import StopSignal, signal_name
from .threads import ThreadChoice, configure_threads
from .watchdog import watching
from .window import Row, WindowStats, stop_value

#: Bytes of a lock's token (``hpcopt.run.lock.Holder.token``: 32 hex digits).
TOKEN_BYTES = 32


@dataclass(frozen=True)
class Ticks:
    """When things happen: the run's length in ticks and the ``[run]`` intervals."""

    total: int
    trace_every: int
    eval_every: int = 0
    checkpoint_every: int = 0

    def evaluation_due(self, tick: int) -> bool:
        return bool(self.eval_every and tick % self.eval_every == 0)

    def row_due(self, tick: int) -> bool:
        return tick % self.trace_every == 0 or self.evaluation_due(tick)

    def checkpoint_due(self, tick: int) -> bool:
        return tick == self.total or bool(self.checkpoint_every and tick % self.checkpoint_every == 0)


@dataclass
class CheckpointClock:
    """``checkpoint_minutes`` (docs/failures.md): rank 0 asks for a checkpoint once ``seconds``
    of wall time have passed since the segment started or since the last checkpoint. The ask
    rides in its next trace row (``stop_value``), so every rank checkpoints at the first
    finished row that shows it, the same tick everywhere, with no byte or collective more."""

    seconds: float  # 0: never
    since: float = field(default_factory=time.perf_counter)

    def asks(self, rank: int) -> bool:
        """Whether this rank's next row asks for a checkpoint (only rank 0's clock counts)."""
        return rank == 0 and 0 < self.seconds <= time.perf_counter() - self.since

    def restart(self) -> None:
        """A checkpoint was written: count from now."""
        self.since = time.perf_counter()


@dataclass
class RunFiles:
    """What the runner sets up for a session: the run directory, the trace, the wall clock."""

    config: Config                       # with ``run.out`` the run directory chosen
    out: Path | None                     # None: no files (no trace, no checkpoints)
    run_id: str
    writer: trace_io.TraceWriter | None  # rank 0 only, when tracing
    wall_before: float                   # seconds of earlier segments (a resumed run)
    started: float = 0.0
    timeline: Recorder | None = None  # with --timeline: this rank's spans
    lock_token: str = ""  # --on-rank-loss continue: rank 0's lock (``hpcopt.run.lock.release_lost``)

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.started


def wall_text(wall: float, earlier: float, digits: int) -> str:
    """A summary's ``wall`` seconds; a resumed run's (``earlier``: the seconds of its earlier
    jobs, 0 for a run never resumed) are all its jobs', and the text says so: "12.3 s (all jobs
    of the resumed run; this job 4.1 s)"."""
    if not earlier:
        return f"{wall:.{digits}f} s"
    return f"{wall:.{digits}f} s (all jobs of the resumed run; this job {wall - earlier:.{digits}f} s)"


class RankLossHandler(Protocol):
    """How a session goes on without a lost rank (``--on-rank-loss continue``:
    ``hpcopt.run.rank_loss.RankLossRecovery``)."""

    def due(self, session: Any, tick: int) -> bool:
        """Whether to keep a snapshot at ``tick`` (the same answer on every rank)."""

    def snapshot(self, session: Any, tick: int) -> None:
        """Keep this rank's state at ``tick`` in memory (no communication)."""

    def recover(self, session: Any, exc: BaseException) -> tuple[Any, int]:
        """Collective on the survivors of ``exc``'s lost rank: the session rebuilt on them and
        the tick it goes on from."""


class Session(Protocol):
    """One rank's side of a run, as the runner drives it. Methods marked collective are
    called on every rank in the same order."""

    ticks: Ticks
    comm: Comm       # the communicator it runs on (after a lost rank, the survivors')
    state: Any       # the algorithm's state on this rank, from start() (``hpcopt.train`` returns it)
    checkpoint: str  # the newest checkpoint written ("" for none)

    @property
    def rank_loss(self) -> RankLossHandler | None:
        """How it survives a lost rank (None: the loss ends the job)."""

    def progress(self) -> int:
        """Steps this rank has taken (the stall watchdog's measure of progress)."""

    def start(self, comm: Comm) -> None:
        """Collective: the algorithm's initial state, and checks that need every rank's numbers
        (e.g. the same number of ticks)."""

    def restore(self, ckpt: Any) -> None:
        """Continue from checkpoint ``ckpt`` (no communication)."""

    def trace_columns(self) -> tuple[tuple[str, ...], dict[str, Any]]:
        """The trace's extra columns and attributes."""

    def parameters(self) -> int:
        """The model's size, for the trace's attributes."""

    def checkpoint_bytes(self) -> int:
        """An upper bound of one checkpoint's size, checked against the free space."""

    def header(self, threads: ThreadChoice) -> str:
        """The first line of the run's header."""

    def begin(self, files: RunFiles, ckpt: Any) -> None:
        """Collective: the clocks start (after the start barrier); ``files`` are the run's."""

    def steps_left(self) -> int:
        """The steps this rank still takes."""

    def step(self) -> int | None:
        """One step; the tick it ends, or None when it ends none."""

    def evaluate(self, tick: int) -> Any:
        """Collective: evaluate the model at ``tick``."""

    def row(self, tick: int, evaluation: Any, stop: float) -> list[Row]:
        """Collective: start the trace row of ``tick`` with this rank's ``stop_value``
        (its stop signal, 0: none, and whether it asks for a checkpoint); the rows finished by now."""

    def finish_rows(self) -> list[Row]:
        """Collective: finish the rows in flight; they are returned."""

    def check_rows(self, rows: list[Row], tick: int) -> None:
        """Raise (on every rank alike) if a finished row shows divergence."""

    def note(self, row: Row) -> str:
        """What a progress line says about a finished row (its loss first)."""

    def save(self, tick: int) -> None:
        """Collective: write the checkpoint of ``tick``."""

    def last_rows(self, tick: int) -> list[Row]:
        """Collective: the row of a partial last window, and the rows in flight."""

    def final(self) -> Any:
        """Collective: end the run (e.g. a partial round's average) and evaluate its model."""

    def summarize(self, final: Any, train_loss: float, threads: ThreadChoice,
                  stopped: str, show: bool) -> Any:
        """Collective: the summary, the same on every rank; ``stopped``: the signal that
        stopped the run ("SIGTERM", "SIGINT"; "" when it ran to the end)."""

    def trace_summary(self, final: Any, summary: Any) -> dict[str, Any]:
        """The trace's attributes at the end of a finished run."""


class SessionBuilder(Protocol):
    """A kind of run: reads its checkpoints and builds its session on each rank."""

    noun: str  # what a tick is called in messages: "step" or "iteration"

    def read_checkpoint(self, path: str | Path, comm: Comm) -> Any:
        """This rank's part of checkpoint ``path`` (no communication)."""

    def build(self, config: Config, comm: Comm, ckpt: Any) -> Session:
        """This rank's session (no communication)."""


def run(builder: SessionBuilder, config: Config, comm: Comm, verbose: bool = True,
        resume: str | Path | None = None) -> tuple[Any, Session]:
    """Run ``builder``'s session on every rank of ``comm``, continuing from checkpoint ``resume`` when
    given; the summary and this rank's session. Files go to ``config.run.out`` (``{time}`` in
    it becomes the start time; empty: no files, or for a resumed run the directory holding the
    checkpoint's ``checkpoints/``); rank 0 holds the directory's lock until the run ends. With a
    run directory, SIGTERM (and on the command line SIGINT) makes the ranks agree at a trace row,
    write a checkpoint and stop (``summary.stopped``, ``summary.stop_signal``). Under
    ``--on-rank-loss continue`` the stall watchdog watches the set-up too, for ranks lost
    in a way MPI does not report (``_watched_setup``)."""
    with _watched_setup(comm, config) as setup:
        return _run(builder, config, comm, verbose, resume, setup)


def _watched_setup(comm: Comm, config: Config) -> contextlib.ExitStack:
    """Under ``--on-rank-loss continue`` with ``--stall-timeout``, a watchdog that ends the job
    (one line, exit 6) when a rank waits that long in set-up for one that does not answer
    (hpcopt.run.watchdog); ``_loop`` ends it as its own starts. Else nothing."""
    setup = contextlib.ExitStack()
    if config.run.on_rank_loss == "continue":
        setup.enter_context(watching(comm, config.run.stall_timeout, silent_is_lost=True,
                                     setup_only=True))
    return setup


def _run(builder: SessionBuilder, config: Config, comm: Comm, verbose: bool,
         resume: str | Path | None, setup: contextlib.ExitStack) -> tuple[Any, Session]:
    """``run``'s work, with ``setup`` (``_watched_setup``) for ``_loop`` to end."""
    local_rank, local_size = node_layout(comm.mpi)
    threads = configure_threads(local_size)
    if config.run.device == "gpu":  # the GPU of this node-local rank, and how MPI reaches it
        agreed(lambda: prepare_gpu(comm, local_rank), comm)
    else:
        comm.backend = CPU
    ckpt = None
    if resume:  # unless another job holds the run directory, rank 0 has a child process read
        # the whole file (hpcopt.io.vet) and check its digest; then each rank reads its own part
        agreed(lambda: vet_resumed(resume, config.run.out) if comm.rank == 0 else None, comm)
        ckpt = agreed(lambda: builder.read_checkpoint(resume, comm), comm)
    session = agreed(lambda: builder.build(config, comm, ckpt), comm)
    session.start(comm)
    if ckpt is not None:
        agreed(lambda: session.restore(ckpt), comm)
    out, run_id = run_directory(config, ckpt, comm)
    if out is None and config.run.checkpoint_minutes:  # the same on every rank
        raise HpcoptError("checkpoint_minutes writes checkpoints: it needs a run directory (--out DIR)",
                          everywhere=True)
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, out=str(out or "")))
    # rank 0 locks the run directory for the job's life and checks it holds no other run
    lock = agreed(lambda: claim(out, run_id, ckpt is not None, verbose) if comm.rank == 0 else None, comm)
    writer = None
    try:
        columns, attrs = session.trace_columns()
        writer = agreed(lambda: open_trace(config, out, run_id, comm, session.parameters(),
                                           (ckpt.trace_rows, ckpt.tick) if ckpt else None,
                                           columns, attrs), comm)
        timeline = agreed(lambda: open_timeline(config, writer, comm,
                                                            ckpt.wall_seconds if ckpt else None), comm)
        agreed(lambda: check_output(out, session.checkpoint_bytes(), comm), comm)
        files = RunFiles(config, out, run_id, writer, ckpt.wall_seconds if ckpt else 0.0,
                         timeline=timeline, lock_token=_lock_token(lock, config, comm))
        show = verbose and config.run.progress and comm.rank == 0
        resumed = f"{ckpt.path} at {builder.noun} {ckpt.tick}" if ckpt else ""
        if show:
            print(f"{session.header(threads)}\n{header_end(out, resumed, comm)}", flush=True)
        elif resumed and verbose and comm.rank == 0:  # without progress lines, still say what resumed
            print(f"hpcopt: resuming from {resumed} (run directory {out})", flush=True)
        with StopSignal(out is not None) as stop_signal, \
                np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # NaN/Inf: nonfinite.py
            summary, session = _loop(session, files, comm, ckpt, stop_signal, threads, show, setup)
    finally:
        comm.stats.delay = comm.stats.spans = None  # the network delay mode and the timeline end
        if writer is not None:
            writer.close()
        if lock is not None:
            lock.release()
    if verbose and comm.rank == 0:  # the summary, with progress lines or without
        print("summary\n  " + "\n  ".join(summary.lines()), flush=True)
    comm = session.comm  # the survivors' after a lost rank (hpcopt.run.rank_loss)
    if summary.stopped and verbose and comm.rank == 0:
        print(f"hpcopt: {summary.stop_signal}: stopped at {builder.noun} {session.progress()} "
              f"after writing {summary.checkpoint}; continue with: {relaunch_command(comm.size)} "
              f"python -m hpcopt resume {summary.checkpoint}{_named_model(config)}", flush=True)
    return summary, session


def _lock_token(lock: RunLock | None, config: Config, comm: Comm) -> str:
    """Under ``--on-rank-loss continue`` with a run directory, rank 0's lock token on every rank
    (a broadcast on "preflight"): the survivors of rank 0 remove its lock. Else ""."""
    if config.run.on_rank_loss != "continue" or not config.run.out:
        return ""
    token = np.frombuffer(lock.holder.token.encode().ljust(TOKEN_BYTES), dtype=np.uint8).copy() \
        if lock is not None else np.zeros(TOKEN_BYTES, dtype=np.uint8)
    comm.bcast_(token, label="preflight")
    return token.tobytes().rstrip(b"\0 ").decode()


def _named_model(config: Config) -> str:
    """The ``--model`` a resume must repeat (a torch model is never imported because a
    checkpoint names it), or ""."""
    return f" --model {config.model.model}" if config.model.torch else ""


def _loop(session: Session, files: RunFiles, comm: Comm, ckpt: Any, stop_signal: StopSignal,
          threads: ThreadChoice, show: bool,
          setup: contextlib.ExitStack) -> tuple[Any, Session]:
    """Train to the end under the stall watchdog (``setup``'s ends as it starts); the summary
    and the session. With a session's ``rank_loss`` (``--on-rank-loss continue``,
    hpcopt.run.rank_loss) it keeps a snapshot at every round's end, and a lost rank makes the
    survivors go on from the last one, up to the summary; the survivors then agree that none
    was lost since (ULFM's agreement, under the watchdog), before they exit without
    MPI_Finalize (hpcopt.cli)."""
    progress = Progress(session.ticks.total, show)
    tick = ckpt.tick if ckpt else 0
    recovery = session.rank_loss
    stall_timeout, job_rank = files.config.run.stall_timeout, comm.rank  # its number in the report
    continued = recovery is not None  # a rank that does not answer is a lost rank
    setup.close()
    with contextlib.ExitStack() as watch:
        watch.enter_context(watching(comm, stall_timeout, session.progress, silent_is_lost=continued))
        comm.barrier(label="start")
        session.begin(files, ckpt)
        files.started = time.perf_counter()
        clock = CheckpointClock(60 * files.config.run.checkpoint_minutes)
        progress.start -= files.wall_before
        timeline = files.timeline
        if timeline is not None:  # spans of every step, evaluation, checkpoint and counted call
            timeline.start(files.started - files.wall_before, session.progress())
            comm.stats.spans = timeline.communicated
        if recovery is not None and recovery.due(session, tick):
            recovery.snapshot(session, tick)
        ulfm.moment("in training")
        while True:
            try:
                final, stop, train_loss = _ticks(session, files, comm, tick, stop_signal, clock, progress)
                summary = session.summarize(final, train_loss, threads, signal_name(stop) if stop else "",
                                            show)
                if timeline is not None:
                    timeline.gather(comm)
                break
            except Exception as exc:
                if recovery is None or not is_rank_loss(exc):
                    raise
                session, tick = recovery.recover(session, exc)
                comm = session.comm
                watch.close()  # the watchdog of the old communicator, then one of the survivors'
                watch.enter_context(watching(comm, stall_timeout, session.progress, job_rank,
                                             silent_is_lost=True))
        if files.writer is not None and final is not None:
            files.writer.finish(session.trace_summary(final, summary))
        if continued:  # a rank lost since the summary ends the job (hpcopt.cli: exit 6)
            ulfm.moment("after the last step")
            comm.agree(1, label="end")
    return summary, session


def _ticks(session: Session, files: RunFiles, comm: Comm, tick: int, stop_signal: StopSignal,
           clock: CheckpointClock, progress: Progress) -> tuple[Any, int, float]:
    """The steps from ``tick`` to the end (or a stop signal), the last rows and the final
    evaluation: (the final evaluation or None when stopped, the stop signal, the train loss)."""
    ticks, recovery = session.ticks, session.rank_loss
    train_loss, report_due, stop = math.nan, False, 0
    step, evaluate, save, final_of = session.step, session.evaluate, session.save, session.final
    timeline = files.timeline
    if timeline is not None:
        step = timeline.stepping(step, session.progress)
        evaluate = timeline.timed("evaluation", "evaluation", evaluate)
        save = timeline.timed("checkpoint", "checkpoint", save)
        final_of = timeline.timed("evaluation", "final", final_of)
    for _ in range(session.steps_left()):
        ended = step()
        if ended is None:
            continue
        tick = ended
        report_due = progress.due(tick) or report_due
        evaluation = evaluate(tick) if ticks.evaluation_due(tick) else None
        rows = []
        if ticks.row_due(tick):
            value = stop_value(stop_signal.raised, clock.asks(comm.rank))
            rows = session.row(tick, evaluation, value)
        due = files.out is not None and ticks.checkpoint_due(tick)
        snapshot = recovery is not None and recovery.due(session, tick)
        if due or snapshot or _stop(rows) or _asked(rows):
            rows += session.finish_rows()
        stop = _stop(rows) if tick < ticks.total else 0  # rows finished just now count too
        checkpoint = due or _asked(rows)  # asked only with a run directory
        session.check_rows(rows, tick)
        for row in rows:
            train_loss = _stats(row).loss_mean
            if report_due:
                progress.report(row.tick, session.note(row))
                report_due = False
        if timeline is not None:  # before a checkpoint, as the trace's rows
            timeline.rows_finished(len(rows), comm, due=checkpoint or bool(stop))
        if checkpoint or stop:
            save(tick)
            clock.restart()
        if snapshot and recovery is not None:
            recovery.snapshot(session, tick)
        if stop:
            stop_signal.settle()
            return None, stop, train_loss
    rows = session.last_rows(tick)
    session.check_rows(rows, tick)
    for row in rows:
        train_loss = _stats(row).loss_mean
    return final_of(), 0, train_loss


def _stop(rows: list[Row]) -> int:
    """The stop signal the finished ``rows`` show (the same on every rank; 0: none)."""
    return max((_stats(row).stop for row in rows), default=0)


def _asked(rows: list[Row]) -> bool:
    """Whether a finished row asks for a checkpoint (``checkpoint_minutes``; the same on every rank)."""
    return any(_stats(row).checkpoint for row in rows)


def _stats(row: Row) -> WindowStats:
    assert row.stats is not None, "a finished row has its statistics"
    return row.stats
