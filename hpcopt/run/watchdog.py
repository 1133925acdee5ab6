"""Stall watchdog (``--stall-timeout S``): a collective that has not completed after S seconds
ends the job, with a report of where every rank is.

Design. A daemon thread on every rank wakes every ``poll`` seconds (S/10, at most 0.5 s) and
looks at the main thread's Python stack (``sys._current_frames``): when it is inside one of
``Comm``'s blocking calls (an allreduce, average, broadcast, gather, barrier or wait), the
rank is *waiting*, on that call's label. The main thread does no extra work at
all, so the watchdog costs nothing when off and one short wake-up per poll when on.

When a rank has waited in the same call for S seconds, its thread asks every other rank where
it is (point-to-point, on a communicator of the watchdog's own); the others' watchdog threads
answer even when their main thread computes, sleeps or hangs. A rank that does not answer
within ``answer_within`` seconds was killed or is stuck outside Python. The lowest-numbered
waiting rank prints one report, naming the ranks that have not arrived, and aborts the job
(MPI_Abort, exit code 4); the other waiting ranks report only if it has not done so a little
later. Needs MPI_THREAD_MULTIPLE (mpi4py asks for it by default).

Its own start is collective too (its communicator, every rank's number), and no thread answers
yet: a timer ends the job when that has not completed within S seconds, in one line from each
rank that waits (rank 0 at once, the others ``STAGGER_SECONDS`` later, by when rank 0's
MPI_Abort has ended them). A rank stopped or lost just as the loop began once left the others
waiting there for ever.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import numpy as np
from mpi4py import MPI

from ..comm.core import gather_ints
from ..comm.ulfm import is_rank_loss
from ..errors import EXIT_NOT_CONTINUED, HpcoptError, abort_job

EXIT_CODE = 4
#: Seconds a rank other than 0 waits before it ends the job whose watchdog did not start.
STAGGER_SECONDS = 1.0
#: ``Comm`` methods that block until other ranks take part.
BLOCKING_CALLS = ("allreduce_", "average_", "bcast_", "allreduce_scalar", "allreduce_host_",
                  "allgather", "gather", "barrier", "agree", "agree_errors", "waitall")
_QUERY_TAG, _REPLY_TAG = 31001, 31002
_REPLY_BYTES = 1024


def _blocking_codes() -> dict[CodeType, str]:
    """Code object -> operation name of every call in which a rank waits for others."""
    from ..comm import Comm

    return {getattr(Comm, name).__code__: name.rstrip("_") for name in BLOCKING_CALLS}


class Watchdog:
    """Watches the calling thread's collectives on ``comm`` (collective: every rank makes one).
    Its report names each rank by ``job_rank`` (default: its rank in ``comm``): the rank in the
    job as it started, which the survivors of a lost rank keep (``--on-rank-loss continue``).

    ``silent_is_lost`` (``--on-rank-loss continue``): a rank that does not answer is a rank lost
    in a way MPI does not report (a non-zero exit, SIGSTOP, a cut link): the lowest waiting rank
    says so in one line and the job ends with exit code 6 instead of the report. ``setup_only``:
    only such a rank ends the job (set-up, where a rank may rightly work for long alone)."""

    def __init__(self, comm: Any, timeout: float, steps: Callable[[], int] = lambda: -1,
                 job_rank: int | None = None, silent_is_lost: bool = False,
                 setup_only: bool = False) -> None:
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise HpcoptError("--stall-timeout needs an MPI library with MPI_THREAD_MULTIPLE",
                              everywhere=True)
        self.silent_is_lost = silent_is_lost
        starting = threading.Timer(timeout, self._not_started,
                                   (comm.rank if job_rank is None else job_rank, timeout))
        starting.daemon = True
        starting.start()
        try:
            self.mpi = comm.mpi.Dup()
            self.rank, self.size = self.mpi.Get_rank(), self.mpi.Get_size()
            self.job_ranks = gather_ints(self.mpi, self.rank if job_rank is None else job_rank)
        finally:
            starting.cancel()
        self.timeout = timeout
        self.poll = min(0.5, max(0.02, timeout / 10))
        self.answer_within = max(1.0, 4 * self.poll)
        self.steps = steps
        self.setup_only = setup_only
        self._main = threading.get_ident()
        self._codes = _blocking_codes()
        self._seen: tuple[FrameType, float] | None = None  # (the call waited in, since when)
        self._sends: list[MPI.Request] = []
        self._round = 0
        self._deferred_until = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcopt-watchdog", daemon=True)
        self._thread.start()

    def _not_started(self, job_rank: int, timeout: float) -> None:
        """The start has not completed within ``timeout``: one line, and the job ends (exit 6
        under ``silent_is_lost``, else 4)."""
        if job_rank != 0:
            time.sleep(STAGGER_SECONDS)
        code = EXIT_NOT_CONTINUED if self.silent_is_lost else EXIT_CODE
        abort_job(f"hpcopt: stall: rank {job_rank} has waited {timeout:g} s (--stall-timeout) for "
                  "the other ranks to start the stall watchdog with it as training begins: a rank "
                  "did not arrive (killed, exited or stopped); aborting the job "
                  f"(exit code {code})\n", code)

    def stop(self) -> None:
        """End the thread and free the watchdog's communicator."""
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(MPI.Exception):  # a communicator with a lost rank in it
            self.mpi.Free()

    # -- where this rank is -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """This rank's main thread: its step and, when waiting, the call, label and seconds."""
        frame = sys._current_frames().get(self._main)
        while frame is not None and frame.f_code not in self._codes:
            frame = frame.f_back
        mine: dict[str, Any] = {"rank": self.rank, "step": int(self.steps())}
        if frame is None:
            self._seen = None
            return mine
        now = time.monotonic()
        if self._seen is None or self._seen[0] is not frame:
            self._seen = (frame, now)  # holding the frame: a later call cannot reuse it
        try:
            label = str(frame.f_locals.get("label", ""))
        except Exception:  # noqa: BLE001 - a frame that is just ending
            label = ""
        return {**mine, "call": self._codes[frame.f_code], "label": label,
                "waited": now - self._seen[1]}

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        """Answer and watch until stopped; a lost rank (``--on-rank-loss continue``) ends the
        watching quietly: the survivors start a watchdog of their own communicator."""
        query = np.zeros(2, dtype=np.int64)
        request = self.mpi.Irecv(query, source=MPI.ANY_SOURCE, tag=_QUERY_TAG)
        try:
            while not self._stop.wait(self.poll):
                request = self._answer(request, query)
                mine = self.status()
                if mine.get("waited", 0.0) >= self.timeout and time.monotonic() >= self._deferred_until:
                    request = self._investigate(mine, request, query)
        except MPI.Exception as exc:
            if not is_rank_loss(exc):
                raise
        finally:
            with contextlib.suppress(MPI.Exception):  # a lost rank's requests fail here too
                request.Cancel()
                request.Wait()
                MPI.Request.Waitall(self._sends)

    def _answer(self, request: MPI.Request, query: np.ndarray) -> MPI.Request:
        """Answer every query that has arrived with this rank's status; the re-posted receive."""
        status = MPI.Status()
        while request.Test(status):
            reply = np.zeros(_REPLY_BYTES, dtype=np.uint8)
            text = json.dumps(self.status()).encode()[:_REPLY_BYTES]
            reply[:len(text)] = np.frombuffer(text, dtype=np.uint8)
            self._sends.append(self.mpi.Isend(reply, dest=int(query[0]), tag=int(query[1])))
            request = self.mpi.Irecv(query, source=MPI.ANY_SOURCE, tag=_QUERY_TAG)
        return request

    def _investigate(self, mine: dict[str, Any], request: MPI.Request,
                     query: np.ndarray) -> MPI.Request:
        """Ask every rank where it is; report and abort, or defer to a lower waiting rank."""
        self._round += 1
        tag = _REPLY_TAG + self._round
        others = [r for r in range(self.size) if r != self.rank]
        ask = np.array([self.rank, tag], dtype=np.int64)
        self._sends += [self.mpi.Isend(ask, dest=r, tag=_QUERY_TAG) for r in others]
        buffers = {r: np.zeros(_REPLY_BYTES, dtype=np.uint8) for r in others}
        pending = {r: self.mpi.Irecv(buffers[r], source=r, tag=tag) for r in others}
        answers = {self.rank: mine}
        deadline = time.monotonic() + self.answer_within
        while pending and time.monotonic() < deadline:
            request = self._answer(request, query)
            for r in [r for r, req in pending.items() if req.Test()]:
                del pending[r]
                answers[r] = json.loads(bytes(buffers[r]).rstrip(b"\0").decode())
            time.sleep(0.005)
        for req in pending.values():
            req.Cancel()
            req.Wait()
        silent = [r for r in others if r not in answers]
        if self.setup_only and not silent:
            self._seen = None  # every rank answers: wait again
            return request
        waiting = [r for r, a in answers.items() if a.get("waited", 0.0) >= self.timeout]
        if min(waiting) != self.rank and self._deferred_until == 0.0:
            self._deferred_until = time.monotonic() + 2 * self.answer_within
            return request
        if self.silent_is_lost and silent:
            abort_job(self.lost_line(silent, mine), EXIT_NOT_CONTINUED)
        abort_job(self.report(answers), EXIT_CODE)
        return request  # pragma: no cover - Abort does not return

    def lost_line(self, silent: list[int], mine: dict[str, Any]) -> str:
        """The one line of ranks that do not answer under ``silent_is_lost``."""
        named = ", ".join(str(self.job_ranks[r]) for r in silent)
        return (f"hpcopt: error: rank {named} does not answer (killed, exited or stopped: lost in a "
                f"way MPI does not report) while rank {self.job_ranks[self.rank]} has waited "
                f"{mine['waited']:.1f} s in {mine['call']} '{mine['label']}' (--stall-timeout "
                f"{self.timeout:g}): the survivors cannot go on and the job ends (exit code "
                f"{EXIT_NOT_CONTINUED})\n")

    def report(self, answers: dict[int, dict[str, Any]]) -> str:
        """The stall report: who is not in the call this rank waits in, then every rank's state."""
        mine = answers[self.rank]
        where = (mine["call"], mine["label"])
        absent = [r for r in range(self.size)
                  if r not in answers or (answers[r].get("call"), answers[r].get("label")) != where]
        named = self.job_ranks
        head = (f"not arrived: rank {', '.join(str(named[r]) for r in absent)}" if absent else
                "every rank waits in the same call (the MPI library or the network does not progress)")
        lines = [f"hpcopt: stall: a collective has not completed within --stall-timeout "
                 f"{self.timeout:g} s; {head}"]
        for r in range(self.size):
            a = answers.get(r)
            if a is None:
                state = f"no answer within {self.answer_within:g} s (killed, or stuck outside Python)"
            elif "call" in a:
                state = f"waiting {a['waited']:.1f} s in {a['call']} '{a['label']}' at step {a['step']}"
            else:
                state = f"busy outside communication at step {a['step']}"
            lines.append(f"  rank {named[r]}: {state}")
        lines.append(f"hpcopt: aborting the job (exit code {EXIT_CODE})")
        return "\n".join(lines) + "\n"


@contextmanager
def watching(comm: Any, timeout: float, steps: Callable[[], int] = lambda: -1,
             job_rank: int | None = None, silent_is_lost: bool = False,
             setup_only: bool = False) -> Iterator[Watchdog | None]:
    """A watchdog for the block when ``timeout`` > 0 (collective), else nothing at all."""
    if not timeout:
        yield None
        return
    dog = Watchdog(comm, timeout, steps, job_rank, silent_is_lost, setup_only)
    try:
        yield dog
    finally:
        dog.stop()
