"""SIGTERM, SIGUSR1 and SIGINT: the ranks stop together at a checkpoint, or the job ends at once.

In the training loop, with a run directory to checkpoint to, either signal only sets a flag
(:class:`StopSignal`). The flag travels with the rank's next trace row; every rank sees it
when that row's reduction finishes (at the next row, or at once at a checkpoint tick; a
pipeline's rows finish at once), so all ranks stop at the same tick, within two rows of the
signal, even when only one rank received it. They write a checkpoint there and exit with
128 + the signal's number: 143 for SIGTERM, 130 for SIGINT (stopped, not finished); SIGUSR1 is
a SIGTERM (143) that Open MPI's ``mpirun`` forwards without killing the ranks. Where ranks
received different signals, the higher number (SIGTERM) is the one reported.

On the command line :class:`JobSignals`, around the whole job on every rank, makes sure that
the job ends. A thread of its own learns of each signal at once, whatever the main thread is
doing (waiting in MPI for another rank, say):

- outside the training loop (set-up, after the last step, no run directory), where no
  checkpoint can be agreed, the job ends at once: one line, MPI_Abort with 143 or 130;
- SIGINT in the loop: the same when the ranks have not agreed on a checkpoint within
  ``GRACE_SECONDS``, so that Ctrl-C always ends the job within seconds. SIGTERM waits for its
  row (a batch system's grace period before SIGKILL is for that).

So that a signal which reached every rank prints one line, rank 0 acts at once and the other
ranks ``STAGGER_SECONDS`` later, by when rank 0's MPI_Abort has ended them. Launchers: MPICH's
Hydra ``mpiexec`` forwards every SIGTERM and the first SIGINT to every rank (it prints that it
does; a second Ctrl-C ends ``mpiexec`` itself), Slurm sends SIGTERM to every task at the time
limit, ``kill PID`` reaches one rank. Each rank runs in a session of its own under Hydra, so a
terminal's Ctrl-C reaches the ranks only through ``mpiexec``. Open MPI's ``mpirun`` forwards
SIGUSR1 as it is, but answers SIGTERM and SIGINT by killing the ranks (``PRRTE_KILL_SECONDS``)
and exits 1 at once, dropping what they print: too soon for a checkpoint unless the next row is
that close (docs/failures.md, "Launchers"). It ends a job after an MPI_Abort the same way, and
that SIGTERM adds no line of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from ..errors import abort_job

#: The signals that stop a run. SIGUSR1 asks for the same stop as SIGTERM (exit 143): Open MPI's
#: ``mpirun`` forwards it to every rank and kills nothing, where it answers SIGTERM and SIGINT by
#: killing every rank 0.5 s later (docs/failures.md, "Launchers").
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
#: Open MPI's ``mpirun`` (PRRTE) ends a job, after an MPI_Abort or when it got SIGTERM or SIGINT
#: itself, by sending every rank SIGCONT, SIGTERM 0.25 s later and SIGKILL 0.25 s after that
#: (measured, Open MPI 5.0). A SIGTERM this many seconds after a SIGCONT, in a rank PRRTE
#: launched, is that sequence: the job is ending already, and whoever ended it has said why.
PRRTE_KILL_SECONDS = 1.0
#: Seconds from a SIGINT in the loop until the job is aborted if no checkpoint was agreed.
GRACE_SECONDS = 3.0
#: Seconds the ranks other than 0 wait before they end the job themselves (one line, not N).
STAGGER_SECONDS = 1.0
#: Where MPICH's Hydra, Open MPI, PMIx and Slurm tell a process its rank.
LAUNCHER_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def exit_code(signum: int) -> int:
    """The exit code of a job that ``signum`` stopped: 128 + the number of the signal it counts
    as, as if that had killed the process (143 for SIGTERM and SIGUSR1, 130 for SIGINT)."""
    return 128 + (signal.SIGTERM if signum == signal.SIGUSR1 else signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignal:
    """This rank's stop request in the training loop: ``raised`` is the signal it received (0:
    none), which the runner sends with its next trace row. Requests count only when ``enabled``
    (there is a run directory to checkpoint to). Under :class:`JobSignals` that thread watches
    SIGTERM and SIGINT; otherwise (the Python API) a handler of its own watches SIGTERM.
    ``current`` is the loop's while it runs (a straggler's sleep ends once it is raised)."""

    current: ClassVar[StopSignal | None] = None

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.raised = 0
        self._previous: Any = None
        self._outer: StopSignal | None = None

    def __enter__(self) -> StopSignal:
        self._outer, StopSignal.current = StopSignal.current, self
        job = JobSignals.active
        if job is not None:
            job.enter_loop(self)
        elif self.enabled and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, lambda signum, _: self.request(signum))
        return self

    def request(self, signum: int) -> None:
        """Stop at the next row (the first signal counts)."""
        if self.enabled and not self.raised:
            self.raised = signum

    def settle(self) -> None:
        """The checkpoint of an agreed stop is written on this rank: only the summary is left,
        so the SIGINT deadline is off."""
        if JobSignals.active is not None:
            JobSignals.active.settle()

    def __exit__(self, *_: Any) -> None:
        StopSignal.current = self._outer
        if JobSignals.active is not None:
            JobSignals.active.leave_loop()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class JobSignals:
    """SIGTERM and SIGINT for a whole command-line job on this rank (see the module's
    docstring); ``grace`` and ``stagger`` in seconds. Installed only from the main thread."""

    active: ClassVar[JobSignals | None] = None

    def __init__(self, grace: float = GRACE_SECONDS, stagger: float = STAGGER_SECONDS,
                 early: list[int] | None = None) -> None:
        self.grace, self.stagger = grace, stagger
        self.early = early if early is not None else []  # noted before it was installed, still growing
        self.received: list[int] = []
        self._loop: StopSignal | None = None
        self._settled = False
        self._deadline: threading.Timer | None = None
        self._ending: threading.Thread | None = None  # the thread that ends the job
        self._lock = threading.Lock()
        self._installed = False
        self._continued = -PRRTE_KILL_SECONDS  # time.monotonic() of the last SIGCONT
        self._forward: Callable[[int], None] | None = None  # see forward

    # -- installing ---------------------------------------------------------------------------

    def __enter__(self) -> JobSignals:
        """Install; inside another JobSignals, that one (``python -m hpcopt`` installs one
        before it imports the rest, so a signal during start-up is handled too)."""
        if JobSignals.active is not None:
            return JobSignals.active
        if threading.current_thread() is not threading.main_thread():
            return self
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        # the C-level handler writes each signal's number here at once, for the thread below
        self._wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._handlers = {signum: signal.signal(signum, self._handle)
                          for signum in (*SIGNALS, signal.SIGCONT)}
        self._thread = threading.Thread(target=self._listen, name="hpcopt-signals", daemon=True)
        self._thread.start()
        self._installed = True
        JobSignals.active = self
        for signum in tuple(self.early):  # one that came after set_wakeup_fd arrives twice: harmless
            self._receive(signum)
        return self

    def __exit__(self, *_: Any) -> None:
        """Restore the previous handlers. The SIGINT deadline is off (the job is ending), but
        an end of the job under way (a rank waiting its stagger) still happens."""
        if not self._installed:
            return
        JobSignals.active = None
        signal.set_wakeup_fd(self._wakeup)
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)
        os.write(self._write, b"\0")  # ends the thread
        self._thread.join()
        os.close(self._read)
        os.close(self._write)
        with self._lock:
            if self._deadline is not None:
                self._deadline.cancel()
            ending = self._ending
        if ending is not None:
            ending.join()  # it aborts the job

    def exit_code(self, code: int) -> int:
        """The job's exit code: ``code``, but 130 for a job that received SIGINT and would exit
        0 (a run that ended before it could stop: never 0 after Ctrl-C)."""
        return exit_code(signal.SIGINT) if code == 0 and signal.SIGINT in self.received else code

    def forward(self, handler: Callable[[int], None] | None) -> None:
        """From now on each signal goes to ``handler`` (None: ends the job again); ``handled_by``."""
        with self._lock:
            self._forward = handler

    # -- the training loop (StopSignal) -------------------------------------------------------

    def enter_loop(self, loop: StopSignal) -> None:
        with self._lock:
            self._loop = loop

    def leave_loop(self) -> None:
        with self._lock:
            self._loop = None

    def settle(self) -> None:
        with self._lock:
            self._settled = True
            if self._deadline is not None:
                self._deadline.cancel()

    # -- signals ------------------------------------------------------------------------------

    def _handle(self, signum: int, _: Any) -> None:
        """The Python-level handler (main thread, between two bytecodes): the loop's flag, at
        once where the main thread signalled itself (the thread below sets it too)."""
        loop = self._loop
        if loop is not None and signum in SIGNALS:
            loop.request(signum)

    def _listen(self) -> None:
        while True:
            for signum in os.read(self._read, 64):
                if signum == 0:
                    return
                if signum == signal.SIGCONT:
                    self._continued = time.monotonic()
                elif signum in SIGNALS:
                    self._receive(signum)

    def _receive(self, signum: int) -> None:
        rank = launcher_rank()
        with self._lock:
            self.received.append(signum)
            if self._forward is not None:
                self._forward(signum)
                return
            loop = self._loop
            if self._ending is not None or self._settled:
                return  # the job is ending already
            if loop is not None and loop.enabled:
                loop.request(signum)  # a checkpoint, should the next row come before SIGKILL
                if self._killed_by_prrte(signum):
                    return
                if signum == signal.SIGINT and self._deadline is None:
                    self._deadline = threading.Timer(self.grace, self._expire, (signum, rank))
                    self._deadline.daemon = True
                    self._deadline.start()
                return
            if self._killed_by_prrte(signum):
                return
            why = ("no run directory to checkpoint to" if loop else
                   "outside the training loop, no checkpoint to write")
            self._end(signum, rank, why)

    def _killed_by_prrte(self, signum: int) -> bool:
        """Whether ``signum`` is Open MPI's ``mpirun`` ending the job (``PRRTE_KILL_SECONDS``)."""
        return (signum == signal.SIGTERM and os.environ.get("PRTE_LAUNCHED") == "1"
                and time.monotonic() - self._continued < PRRTE_KILL_SECONDS)

    def _expire(self, signum: int, rank: int) -> None:
        with self._lock:
            if self._ending is None and not self._settled:
                self._end(signum, rank, f"no checkpoint agreed within {self.grace:g} s")

    def _end(self, signum: int, rank: int, why: str) -> None:
        """End the job from a thread of its own (holding the lock)."""
        line = (f"hpcopt: {signal_name(signum)} on rank {rank}: {why}; ending the job "
                f"(exit code {exit_code(signum)})\n")
        self._ending = threading.Thread(target=self._end_job, args=(line, signum, rank),
                                        name="hpcopt-end", daemon=True)
        self._ending.start()

    def _end_job(self, line: str, signum: int, rank: int) -> None:
        """``line`` and MPI_Abort, at once on rank 0 and after the stagger elsewhere, the run
        directory's lock released first (``hpcopt.run.lock.release_held``: the launcher may
        return before this rank has ended, and a requeue started then must find it free).
        While MPI starts (the rest of hpcopt is being imported), first wait for it: under
        Hydra, a rank that exits before the others' MPI_Init completes leaves them waiting for
        ever, and under Open MPI a rank that exits without MPI_Abort while MPI connects its
        ranks once left ``mpirun`` waiting for ever. Where it does not start within the grace
        (imports slowed by the load), the rank ends by the signal its line's exit code names
        (``_die_by``), which the launcher answers by ending the job."""
        running = _mpi_running(self.grace)
        if rank != 0:
            time.sleep(self.stagger)
        # hpcopt.run.lock is loaded where this rank may hold the lock; while it is still being
        # imported (a signal that early) it has no release_held yet, and no lock to release
        release_held = getattr(sys.modules.get("hpcopt.run.lock"), "release_held", None)
        if release_held is not None:
            release_held()
        if not running:
            sys.stderr.write(line)
            sys.stderr.flush()
            _die_by(exit_code(signum) - 128)
        abort_job(line, exit_code(signum))


@contextlib.contextmanager
def handled_by(handler: Callable[[int], None]) -> Iterator[None]:
    """Within: SIGTERM and SIGINT go to ``handler(signum)`` instead of ending the job (or raising
    KeyboardInterrupt), for a command that stops processes of its own first (``sweep --local``).
    It is called from another thread than the main one (which may hold the handler's locks):
    :class:`JobSignals`'s, or one started by the main thread's handler."""
    job = JobSignals.active
    if job is None:
        def start(signum: int, _: Any) -> None:
            threading.Thread(target=handler, args=(signum,), name="hpcopt-signal", daemon=True).start()

        previous = {signum: signal.signal(signum, start) for signum in SIGNALS}
    else:
        job.forward(handler)
    try:
        yield
    finally:
        if job is None:
            for signum, action in previous.items():
                signal.signal(signum, action)
        else:
            job.forward(None)


def launcher_rank() -> int:
    """This process's rank as the launcher announced it (0 if it did not): known before MPI
    starts, and read from any thread without calling MPI."""
    for name in LAUNCHER_RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _die_by(signum: int) -> None:
    """End this process by ``signum``'s default action, from any thread. A launcher reports the
    death as that signal's (Open MPI's ``mpirun`` exits 128 + ``signum``: 143 where the line
    said 143, which a requeue-on-143 script requeues; MPICH's Hydra exits ``signum`` | 9, its
    SIGKILL of the other ranks included) and ends the job; a SIGKILL read as a rank killed
    (137). Python sets handlers only from the main thread, so C's ``signal`` restores the
    default; SIGKILL follows should the process outlive it."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.signal.argtypes, libc.signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
    libc.signal(signum, None)  # SIG_DFL
    os.kill(os.getpid(), signum)
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


def _mpi_running(limit: float) -> bool:
    """Whether MPI runs in this process, waiting up to ``limit`` seconds for it to start."""
    deadline = time.monotonic() + limit
    while True:
        mpi = sys.modules.get("mpi4py.MPI")  # never imported here: MPI_Init stays the main thread's
        try:
            if mpi is not None and mpi.Is_initialized():
                return not mpi.Is_finalized()
        except AttributeError:  # mpi4py.MPI is being imported right now
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
