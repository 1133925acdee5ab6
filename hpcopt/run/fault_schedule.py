"""Scheduled faults and stragglers: ``--fault RANK:STEP`` and ``--straggler RANK:FACTOR[,...]``.

Training options (``[run] fault``, ``[run] straggler``), so a study can sweep them as axes: the
same schedule replays on every algorithm, and recovery and heterogeneity are compared on equal
terms (docs/studies.md). RANK is a rank of the job as it started; STEP counts a rank's local
steps from 1 (for the data-parallel algorithms a clock tick is a step).

- ``--straggler R:F`` (``MIN_FACTOR`` <= F < 1; a comma list for several ranks): rank R runs at
  F times its speed. After each step's gradient it sleeps (1/F - 1) times the seconds that gradient took
  it, so its compute takes 1/F as long. The sleep is proportional to the measured gradient time,
  not to a fixed model time: "0.6x" then means the same for any model, batch or device without
  the user knowing a step's time, and the ratio holds on a loaded machine where a fixed sleep
  would be a different share of a step from run to run. Which rank, which steps and the ratio
  replay exactly; the seconds follow the machine. The sleep changes no number: losses and
  models are bitwise those of the run without it. F is bounded below (``MIN_FACTOR``: at most
  99 sleeps of a gradient's time each step), and the sleep ends at a stop signal (SIGTERM,
  SIGINT, SIGUSR1 on the command line; SIGTERM and Ctrl-C under the Python API:
  ``hpcopt.run.signals``), after which the rank sleeps no more: the run reaches its next row and
  stops at a checkpoint as any other does.
- ``--fault R:K``: rank R is killed by SIGKILL (as ``kill -9`` would) at the start of its K-th
  step, before its gradient: the job ends as for any lost rank (docs/failures.md), and a
  requeue resumes it from its newest checkpoint (so a checkpoint must come before step K).
  A fault fires once per run: just before the kill, rank R writes ``OUT/fault.json`` (run id,
  rank, step, time); a run of the same run id that finds that record does not fire it again
  (a resume goes on past step K; a restart, when the kill came before the first checkpoint,
  too), and rank 0 adds the time of the resumed job's first step and the tick it resumed from.
  ``hpcopt collect`` reads it: steps redone since the checkpoint (K - 1 - tick) and seconds
  from the kill to the resumed job's first step.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HpcoptError

#: The record of a fired fault in the run directory.
RECORD = "fault.json"
RECORD_KIND = "fault record"
#: Largest fault record read (one holds about 200 bytes).
MAX_RECORD_BYTES = 1 << 12

Oracle = Callable[[Any, Any], Any]
#: The slowest straggler: 1/100 of its speed (longer sleeps model a lost rank, not a slow one).
MIN_FACTOR = 0.01
#: Seconds between two looks at the stop signals while a straggler sleeps.
SLEEP_SLICE = 0.05


def _pairs(text: str, flag: str, form: str) -> list[tuple[int, str]]:
    """``A:B[,A:B...]`` as (int A, text B) pairs; HpcoptError naming ``flag`` and ``form``."""
    pairs = []
    for part in text.split(","):
        rank, sep, value = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            pairs.append((int(rank), value.strip()))
        except ValueError:
            raise HpcoptError(f"{flag} takes {form}, got {text!r}") from None
        if pairs[-1][0] < 0:
            raise HpcoptError(f"{flag}: RANK must be >= 0, got {text!r}")
    return pairs


def parse_stragglers(text: str) -> dict[int, float]:
    """``--straggler``: ``RANK:FACTOR[,RANK:FACTOR...]`` (MIN_FACTOR <= FACTOR < 1, each rank once)
    as rank -> factor; "" for none. HpcoptError for anything else."""
    if not text:
        return {}
    form = (f"RANK:FACTOR[,RANK:FACTOR...] with {MIN_FACTOR:g} <= FACTOR < 1 (e.g. 1:0.6: rank 1 at "
            "0.6x speed)")
    factors: dict[int, float] = {}
    for rank, value in _pairs(text, "--straggler", form):
        try:
            factor = float(value)
        except ValueError:
            raise HpcoptError(f"--straggler takes {form}, got {text!r}") from None
        if not MIN_FACTOR <= factor < 1:
            raise HpcoptError(f"--straggler: FACTOR must be >= {MIN_FACTOR:g} and < 1 (the rank's "
                              f"share of its speed), got {value} in {text!r}")
        if rank in factors:
            raise HpcoptError(f"--straggler names rank {rank} twice in {text!r}")
        factors[rank] = factor
    return factors


def parse_fault(text: str) -> tuple[int, int] | None:
    """``--fault``: ``RANK:STEP`` (STEP >= 1) as (rank, step); "" for none (None)."""
    if not text:
        return None
    form = "RANK:STEP (e.g. 2:300: rank 2 is killed at its step 300)"
    pairs = _pairs(text, "--fault", form)
    if len(pairs) != 1:
        raise HpcoptError(f"--fault takes one RANK:STEP, got {text!r}")
    [(rank, value)] = pairs
    try:
        step = int(value)
    except ValueError:
        raise HpcoptError(f"--fault takes {form}, got {text!r}") from None
    if step < 1:
        raise HpcoptError(f"--fault: STEP counts a rank's steps from 1, got {text!r}")
    return rank, step


def stop_received() -> bool:
    """Whether this rank received a stop signal: SIGTERM, SIGINT or SIGUSR1 under the command
    line's ``JobSignals``, or the training loop's stop flag (the Python API's SIGTERM; its Ctrl-C
    is a KeyboardInterrupt, which ends a sleep by itself). The runner stops at the next row, and
    a straggler sleeps no more."""
    from .signals import SIGNALS, JobSignals, StopSignal

    job, loop = JobSignals.active, StopSignal.current
    return (job is not None and any(signum in SIGNALS for signum in job.received)
            or loop is not None and loop.raised != 0)


def check_schedule(run: Any, pipeline: bool) -> None:
    """The config's checks of ``[run] fault`` and ``straggler`` (``run``: its RunConfig; whether the
    algorithm is a pipeline's): they parse, apply to the data-parallel algorithms, and a fault has
    a checkpoint before it to resume from (unless the survivors go on: ``on_rank_loss
    continue``)."""
    fault, stragglers = parse_fault(run.fault), parse_stragglers(run.straggler)
    if pipeline and (fault or stragglers):
        raise HpcoptError("fault and straggler apply only to the data-parallel algorithms")
    if fault is not None and run.on_rank_loss != "continue" and not 0 < run.checkpoint_every < fault[1]:
        raise HpcoptError(f"--fault {run.fault}: the job ends at the fault and is resumed from its "
                          f"newest checkpoint: pass --checkpoint-every C with 0 < C < {fault[1]}")


def check_ranks(run: Any, size: int, resumed: bool = False) -> None:
    """HpcoptError unless every rank the schedule of ``run`` (its RunConfig) names is one of
    ``size`` ranks. A resumed job may have fewer ranks than its fault names: the fault fired
    (that is why it resumes), or the job has no such rank to kill."""
    fault = parse_fault(run.fault)
    named = [("--straggler", rank) for rank in parse_stragglers(run.straggler)]
    named += [("--fault", fault[0])] if fault is not None and not resumed else []
    for flag, rank in named:
        if rank >= size:
            raise HpcoptError(f"{flag} names rank {rank}, and the job has {size} rank(s) "
                              f"(0 to {size - 1})")


def check_reached(run: Any, steps_of: Callable[[int], int], size: int) -> None:
    """HpcoptError unless the fault of ``run`` (its RunConfig) comes within its rank's steps
    (``steps_of(rank)``, in a job of ``size`` ranks): a fault past the run's end never fires, and
    the run would pass for a faulted one."""
    fault = parse_fault(run.fault)
    if fault is None or fault[0] >= size:  # a resumed job without the rank: check_ranks
        return
    rank, step = fault
    steps = steps_of(rank)
    if step > steps:
        raise HpcoptError(f"--fault {run.fault}: rank {rank} runs {steps} steps, so its step {step} "
                          f"never comes: choose a STEP up to {steps}, or a longer run")


@dataclass(frozen=True)
class FaultRecord:
    """``OUT/fault.json``: the fault that fired, and when the job that resumed it began."""

    run_id: str
    rank: int
    step: int
    killed_at: float                  # seconds since the epoch
    resumed_at: float | None = None   # the first step of the job that resumed it
    resumed_from: int | None = None   # the tick that job resumed from (0: restarted)

    def steps_redone(self) -> int | None:
        """Steps the resumed job did again: those after its checkpoint, up to the kill."""
        return None if self.resumed_from is None else max(self.step - 1 - self.resumed_from, 0)

    def recovery_seconds(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.killed_at


def read_record(out: Path) -> FaultRecord | None:
    """The run directory's fault record; None when there is none; HpcoptError (one line) for one
    that is no regular file, too large or malformed (a file is data: checked field by field)."""
    from ..io.safe_files import read_bounded

    path = out / RECORD
    try:
        data = json.loads(read_bounded(path, RECORD_KIND, MAX_RECORD_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise HpcoptError(f"{path}: not a fault record ({exc})") from None
    kinds = {"run_id": (str,), "rank": (int,), "step": (int,), "killed_at": (int, float),
             "resumed_at": (int, float, type(None)), "resumed_from": (int, type(None))}
    needed = {"run_id", "rank", "step", "killed_at"}
    if (not isinstance(data, dict) or set(data) - set(kinds) or needed - set(data)
            or any(isinstance(v, bool) or not isinstance(v, kinds[k]) for k, v in data.items())
            or not all(math.isfinite(v) for v in data.values() if isinstance(v, float))):
        raise HpcoptError(f"{path}: not a fault record (fields {', '.join(kinds)})")
    return FaultRecord(**data)


def _write_record(out: Path, record: FaultRecord) -> None:
    from dataclasses import asdict

    from ..io.safe_files import write_replacing

    write_replacing(out / RECORD, json.dumps(asdict(record)) + "\n", RECORD_KIND)


class Schedule:
    """This rank's part of the run's fault and straggler schedule (``run``: the RunConfig)."""

    def __init__(self, run: Any, rank: int, synchronize: Callable[[], None] = lambda: None,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.rank, self.synchronize, self.stopping = rank, synchronize, stopping
        self.factor = parse_stragglers(run.straggler).get(rank)
        self.fault = parse_fault(run.fault)
        self.out: Path | None = None
        self.run_id = ""
        self.record: FaultRecord | None = None  # a fault of this run that fired before this job
        self.resumed_from = 0  # the tick this job started from
        self.first_step = True

    @property
    def armed(self) -> bool:
        """Whether this rank kills itself at its fault's step in this job."""
        return self.fault is not None and self.fault[0] == self.rank and self.record is None

    def begin(self, out: Path | None, run_id: str, resumed_tick: int | None) -> None:
        """At the job's start: the run directory and id, the tick a resume starts from (None: a new
        run); a fault of this run that fired already is not fired again."""
        self.out, self.run_id = out, run_id
        record = read_record(out) if out is not None and self.fault is not None else None
        if record is not None and record.run_id == run_id and (record.rank, record.step) == self.fault:
            self.record = record
        self.resumed_from = resumed_tick or 0

    def wrap(self, oracle: Oracle, steps_done: Callable[[], int]) -> Oracle:
        """``oracle`` with this rank's schedule: the fault before the gradient of its step, the
        straggler's sleep after each gradient; ``oracle`` itself when the schedule is empty."""
        if self.factor is None and self.fault is None:
            return oracle
        sleep_per_second = 1 / self.factor - 1 if self.factor is not None else 0.0

        def scheduled(x: Any, grad: Any) -> Any:
            if self.first_step:
                self._first_step()
            if self.armed and steps_done() + 1 == self.fault[1]:  # type: ignore[index]
                self._kill(steps_done() + 1)
            if not sleep_per_second:
                return oracle(x, grad)
            start = time.perf_counter()
            loss = oracle(x, grad)
            self.synchronize()  # a GPU's kernels have ended: their time is the step's compute
            self._sleep(sleep_per_second * (time.perf_counter() - start))
            return loss

        return scheduled

    def _sleep(self, seconds: float) -> None:
        """A straggler's sleep, in slices of ``SLEEP_SLICE`` seconds: none once ``stopping()``."""
        deadline = time.monotonic() + seconds
        while not self.stopping() and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, SLEEP_SLICE))

    def _first_step(self) -> None:
        """Rank 0, at the first step of a job that continues a fired fault: when it began."""
        self.first_step = False
        record = self.record
        if self.rank == 0 and record is not None and record.resumed_at is None and self.out is not None:
            self.record = FaultRecord(record.run_id, record.rank, record.step, record.killed_at,
                                      time.time(), self.resumed_from)
            _write_record(self.out, self.record)

    def _kill(self, step: int) -> None:
        """Record the fault (so it fires once per run), say so in one line, and SIGKILL this rank."""
        if self.out is not None:
            try:
                _write_record(self.out, FaultRecord(self.run_id, self.rank, step, time.time()))
            except (OSError, HpcoptError) as exc:  # the kill still comes: it is the schedule
                sys.stderr.write(f"hpcopt: --fault: cannot write {self.out / RECORD}: {exc}\n")
        sys.stderr.write(f"hpcopt: --fault: killing rank {self.rank} (SIGKILL) at its step {step}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

