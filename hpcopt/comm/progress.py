"""How a non-blocking reduction moves on while its rank computes (``--comm-progress``).

    calls         MPI's own: MPICH moves a non-blocking collective on only inside MPI calls, so
                  a reduction posted at a round and waited for tau steps later, with no MPI call
                  between, travels in its wait (nothing hidden)
    mpich-thread  MPICH's asynchronous progress thread (``MPIR_CVAR_ASYNC_PROGRESS=1``, read when
                  MPI starts: ``hpcopt.run.mpi_start`` sets it from the command line); it polls
                  a core for the whole run
    comm-thread   hpcopt's communication thread (``CommThread``): it posts each reduction on a
                  communicator of its own and tests it every ``POLL_SECONDS`` until it completes,
                  sleeping between tests, so the reduction moves on while the rank computes and
                  nothing polls while none is in flight

The communication thread posts the same ``MPI_Iallreduce`` as the main thread would, in the
order the main thread handed them over (the same on every rank), so the sums are bit for bit
those of ``calls``. It notes when each reduction completed: its own seconds in MPI, from which
``Comm.complete`` counts the fraction of it hidden, 1 - held / own (held: the seconds the rank
spent in its post and its wait; OSU's overlap measure).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

PROGRESS_MODES = ("calls", "mpich-thread", "comm-thread")
#: The environment variable that turns MPICH's progress thread on, read by ``MPI_Init``.
MPICH_ASYNC = "MPIR_CVAR_ASYNC_PROGRESS"
#: Seconds the communication thread sleeps between two tests of the reductions in flight: at
#: 100 Mbit/s the link moves 6 KB meanwhile, far less than a socket's buffer.
POLL_SECONDS = 5e-4
#: The trace column of a run whose communication thread measures its reductions: the fraction of
#: their own seconds hidden, over the run up to the row (``hidden_fraction`` of the counters).
HIDDEN_COLUMN = "hidden_fraction"


@dataclass
class Posted:
    """A reduction handed to the communication thread: ``recv <- sum_i send_i``; ``started``
    and ``finished`` (``time.perf_counter``) once it was posted and found complete."""

    send: np.ndarray
    recv: np.ndarray
    op: MPI.Op
    started: float = 0.0
    finished: float = 0.0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def own_seconds(self) -> float:
        """The reduction's own seconds in MPI, from its post to its completion."""
        return self.finished - self.started


class CommThread:
    """A thread that moves non-blocking allreduces on (module docstring); made on every rank of
    ``mpi_comm`` at once (it duplicates it)."""

    def __init__(self, mpi_comm: MPI.Comm) -> None:
        self.mpi = mpi_comm.Dup()
        self._jobs: queue.Queue[Posted | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="hpcopt-comm", daemon=True)
        self._thread.start()

    def post(self, send: np.ndarray, recv: np.ndarray, op: MPI.Op) -> Posted:
        """Hand ``recv <- sum_i send_i`` over (neither written, nor ``recv`` read, until ``wait``)."""
        job = Posted(send, recv, op)
        self._jobs.put(job)
        return job

    def wait(self, job: Posted) -> None:
        """Until ``job`` completed; its MPI error, if any, raised here."""
        job.done.wait()
        if job.error is not None:
            raise job.error

    def free(self) -> None:
        """End the thread (after the reductions handed over) and free its communicator."""
        self._jobs.put(None)
        self._thread.join()
        self.mpi.Free()

    def _run(self) -> None:
        """Post what is handed over (in order), then test the reductions in flight every
        ``POLL_SECONDS``; wait idle while none is; end at ``free``'s None."""
        active: list[tuple[Posted, MPI.Request]] = []
        while True:
            try:
                job = self._jobs.get(block=not active)
            except queue.Empty:  # none handed over: test those in flight
                active = [(job, request) for job, request in active if not self._finished(job, request)]
                if active:
                    time.sleep(POLL_SECONDS)
                continue
            if job is None:
                return
            self._start(job, active)

    def _start(self, job: Posted, active: list[tuple[Posted, MPI.Request]]) -> None:
        try:
            job.started = time.perf_counter()
            active.append((job, self.mpi.Iallreduce(job.send, job.recv, op=job.op)))
        except Exception as exc:  # noqa: BLE001 - handed to the waiting rank
            job.error = exc
            job.done.set()

    @staticmethod
    def _finished(job: Posted, request: MPI.Request) -> bool:
        try:
            if not request.Test():
                return False
        except Exception as exc:  # noqa: BLE001 - handed to the waiting rank
            job.error = exc
        job.finished = time.perf_counter()
        job.done.set()
        return True


def hidden_fraction(held: float, own: float) -> float:
    """The fraction of reductions' own seconds ``own`` that the rank did not spend held in them
    (``held``), in [0, 1]; NaN without any."""
    if own <= 0:
        return float("nan")
    return float(min(1.0, max(0.0, 1.0 - held / own)))


def describe(mode: str) -> str:
    """The trace's ``comm_progress`` value of a mode: ``thread`` for MPICH's (the name traces
    have always used), the mode's own name otherwise."""
    return "thread" if mode == "mpich-thread" else mode
