"""Going on without a lost rank (``--on-rank-loss continue``; Open MPI's ULFM, hpcopt.comm.ulfm).

At every round's end (every I ticks) with nothing in flight (a streaming run's fragments
all landed) each rank keeps a
**snapshot** in host memory: what a checkpoint would hold of it (the model, its per-rank state
as the algorithm declares it, its sampler position, the trace window) and the trace's row
count. The last two are kept: survivors differ by at most the one collective in which the
rank was lost. When a collective reports a lost rank, the survivors:

1. revoke and shrink the communicator (``ulfm.shrink``) and agree on the newest snapshot all
   of them hold (``ulfm.agree_min``): the last round every survivor completed;
2. gather their snapshots of that round and carry them over to the survivors exactly as
   ``resume --ranks-changed`` carries a checkpoint (``hpcopt.run.rescale.rescaled``): the
   round's averaged model (where the ranks' models differ at the round's end, as CELGC's and a
   streaming run's: the survivors' models averaged, in float64, on
   every rank alike), per-rank state by each field's policy over the survivors (the lost
   rank's optimizer state is gone), the data partitioned anew for the survivors and the
   samplers re-seeded, a streaming run's (idle) ``in_flight`` reset;
3. build the run again on the survivors' communicator (the plain MPI averaging path: RMA
   windows do not survive a lost rank) with the same length in steps, restore it there, cut
   the trace back to the round's rows, record the loss, and go on from that round.

No disk is read. Rank 0 holds the run directory's lock and writes the trace and the
checkpoints: its loss ends the job (``RankLossError``, printed by the lowest survivor), as does
a run that cannot go on at the smaller count (its reason in one line). A snapshot is kept at
the loop's first tick, so a loss from the first step on is survived; one outside the loop (set-up,
after the summary) ends the job too (``hpcopt.comm.ulfm.ended``, hpcopt.cli).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..algorithms import state as fields
from ..build import build_run
from ..comm import Comm, ulfm
from ..errors import EXIT_NOT_CONTINUED, HpcoptError
from ..io import data_parallel_checkpoint as ckpt_io
from ..io.trace import RankLoss
from . import checkpointing
from .lock import release_lost
from .rescale import rescaled

if TYPE_CHECKING:
    from .data_parallel import DataParallelSession

#: The communication label of the survivors' gathering of their snapshots.
LABEL = "rank_loss"
MODES = ("abort", "continue")


class RankLossError(HpcoptError):
    """A rank was lost and the survivors cannot go on: every survivor raises it alike, and the
    lowest survivor (``reports``) prints it."""

    exit_code = EXIT_NOT_CONTINUED

    def __init__(self, message: str, reports: bool) -> None:
        super().__init__(message, everywhere=True)
        self.reports = reports


@dataclass
class Snapshot:
    """One rank's state at a round's end, in host memory (a checkpoint's part of this rank)."""

    tick: int
    step: int                          # this rank's local step at the round's end
    trace_rows: int
    model: np.ndarray                  # this rank's x (the round's average when synchronized)
    synchronized: bool                 # every rank holds the same x
    rows: dict[str, np.ndarray]        # per-rank vectors (not the reset ones)
    numbers: checkpointing.RankNumbers       # counters, sampler row, scalars and flags
    window: np.ndarray
    shared: dict[str, np.ndarray]


@dataclass
class RankLossRecovery:
    """The snapshots of one rank and the losses survived so far (the session's ``rank_loss``)."""

    snapshots: list[Snapshot] = field(default_factory=list)
    losses: list[RankLoss] = field(default_factory=list)

    def due(self, session: DataParallelSession, tick: int) -> bool:
        """Whether ``tick`` ends a round (the algorithm's ``round_ends``: a multiple of the
        interval I; without one, a tick where the ranks' models agree) with nothing in flight (a
        streaming fragment's reduction), and no snapshot holds it yet (the same answer on every
        rank)."""
        state, algorithm = session.state, session.algorithm
        if self.snapshots and self.snapshots[-1].tick == tick:
            return False
        return not algorithm.in_flight(state) and algorithm.round_ends(state, tick)

    def snapshot(self, session: DataParallelSession, tick: int) -> None:
        """Keep this rank's state at ``tick`` (after the runner finished the rows in flight)."""
        state, to_host, config = session.state, session.comm.backend.to_host, session.config
        policies = fields.rescale_policies(state)
        rows = {name: to_host(getattr(state, name)).copy() for name in fields.present(state, fields.VECTOR)
                if policies[name] != fields.RESET}  # reset on the survivors anyway: not kept
        writer = session.files.writer if session.files else None
        self.snapshots = [*self.snapshots[-1:], Snapshot(
            tick=tick, step=state.step, trace_rows=writer.rows if writer else 0,
            model=to_host(state.x).copy(),
            synchronized=session.algorithm.synchronized(state), rows=rows,
            numbers=checkpointing.rank_numbers(state, session.workload.problem.sampler.state(), config),
            window=session.window.fold(),
            shared={n: to_host(getattr(state, n)).copy() for n in fields.present(state, fields.SHARED)})]

    def recover(self, session: DataParallelSession,
                exc: BaseException) -> tuple[DataParallelSession, int]:
        """Collective on the survivors: the run rebuilt on them at the last round all of them
        completed, and that round's tick (see the module's docstring); RankLossError where it
        cannot go on."""
        started, step = time.perf_counter(), session.state.step
        shrunk = ulfm.shrink(session.comm.mpi)
        if not shrunk.lost:  # an error of some other kind in a wait on several requests
            raise exc
        survivors = Comm(shrunk.mpi, averaging="mpi")  # RMA windows do not survive a lost rank
        ulfm.watch(survivors.mpi)  # a loss the survivors cannot go on from revokes theirs
        survivors.stats = session.comm.stats  # the counters go on (and the delay, the spans)
        lost = ", ".join(map(str, shrunk.lost))
        what = f"rank {lost} lost at step {step} ({ulfm.error_name(exc)})"
        lowest = survivors.rank == 0  # prints the line where the survivors cannot go on
        if 0 in shrunk.lost:
            files = session.files
            if lowest and files is not None and files.out is not None and files.lock_token:
                with contextlib.suppress(HpcoptError, OSError):  # else taken over once stale
                    release_lost(files.out, files.lock_token, files.run_id)  # rank 0 cannot
            raise RankLossError(f"{what}: rank 0 holds the run directory and writes its trace and "
                                "checkpoints, so the job ends; resume its last checkpoint "
                                "(on fewer ranks: resume --ranks-changed)", lowest)
        newest = self.snapshots[-1].tick if self.snapshots else -1
        tick = ulfm.agree_min(survivors.mpi, newest)
        snapshot = next((s for s in self.snapshots if s.tick == tick), None)
        if ulfm.agree_min(survivors.mpi, int(snapshot is not None)) == 0 or snapshot is None:
            raise RankLossError(f"{what}: the survivors hold no common round to go on from", lowest)
        try:
            rebuilt = _rebuilt(session, survivors, snapshot)
        except HpcoptError as error:
            raise RankLossError(f"{what}: cannot go on at {survivors.size} ranks: {error}",
                                lowest) from None
        seconds = time.perf_counter() - started
        self.losses += [RankLoss(step, rank, seconds, snapshot.step) for rank in shrunk.lost]
        rebuilt.rank_loss = self
        writer = rebuilt.files.writer if rebuilt.files else None
        if writer is not None:
            writer.roll_back(snapshot.trace_rows)
            for loss in self.losses[-len(shrunk.lost):]:
                writer.record_rank_loss(loss)
        if survivors.rank == 0:
            print(f"hpcopt: {what}; going on at {survivors.size} ranks from step {tick} (the round's "
                  f"averaged model, the survivors' state, data partitioned anew) after {seconds:.3f} s",
                  flush=True)
        return rebuilt, tick


def _rebuilt(session: DataParallelSession, comm: Comm, snapshot: Snapshot) -> DataParallelSession:
    """The run on ``comm`` (the survivors), restored at ``snapshot`` (collective)."""
    from .data_parallel import DataParallelSession

    assert session.files is not None, "a run's files are set before its first step"
    config = session.config  # as long as before in steps: the survivors' epochs are longer
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, steps=session.parts.total_steps))
    session.files.config = config
    rebuilt = DataParallelSession(config, comm, build_run(config, comm), faults=None,
                                  job_rank=session.schedule.rank)
    rebuilt.start(comm)
    ckpt = _gathered(session, comm, snapshot)
    state = rebuilt.state
    carried, _ = rescaled(ckpt, comm.size, comm.rank, state, rebuilt.workload.problem.sampler.state(),
                          comm.backend.to_host, in_flight=rebuilt.algorithm.in_flight)
    for name in fields.present(state, fields.VECTOR):  # those left out of the snapshot: reset
        if name not in carried.rows:
            carried.rows[name] = comm.backend.to_host(getattr(state, name)).reshape(1, -1)
    rebuilt.restore(carried, at_end=True)  # a loss after the last step: the summary again
    rebuilt.begin(session.files, carried)
    rebuilt.checkpoint, rebuilt.resumed_from = session.checkpoint, session.resumed_from
    rebuilt.history = [(t, evaluation) for t, evaluation in session.history if t <= snapshot.tick]
    return rebuilt


def _gathered(session: DataParallelSession, comm: Comm, snapshot: Snapshot) -> ckpt_io.Checkpoint:
    """Every survivor's ``snapshot`` as one checkpoint of ``comm.size`` ranks (collective)."""
    ints = comm.allgather(snapshot.numbers.ints, LABEL)
    reals = comm.allgather(snapshot.numbers.reals, LABEL)
    counters, sampler, scalars = snapshot.numbers.unpacked(ints, reals)
    rows = {name: comm.allgather(values, LABEL) for name, values in snapshot.rows.items()}
    model = snapshot.model
    if not snapshot.synchronized:  # mid-round (streaming): the survivors' models, averaged
        models = comm.allgather(snapshot.model, LABEL)
        model = models.mean(axis=0, dtype=np.float64).astype(models.dtype)
    return ckpt_io.Checkpoint(
        config=session.config, world_size=comm.size, tick=snapshot.tick,
        run_id=session.files.run_id if session.files else "", trace_rows=snapshot.trace_rows,
        wall_seconds=0.0, layout=session.workload.layout, model=model,
        counters=counters, sampler=sampler, window=comm.allgather(snapshot.window, LABEL),
        comm=comm.stats.stored_rows(), rows=rows, ranks=tuple(range(comm.size)),
        path=Path(f"the snapshot of step {snapshot.tick}"), scalars=scalars, shared=snapshot.shared)
