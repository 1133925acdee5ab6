"""A rank lost at a chosen moment of a ``--on-rank-loss continue`` job (Open MPI's ULFM), and
what the job must do then: recover (exit 5) or end every survivor in one line with exit 6.

Each moment names the call on whose entry the rank is lost (the Nth call of a function, with
that label where one is given: a kill landing inside the collective that call makes), how it is
lost (``kill``: SIGKILL, as ``kill -9``; ``exit``: ``os._exit(1)``, which MPI does not report;
``stop``: SIGSTOP, a rank that no longer answers, as behind a cut link), and what the job ends
in where the lost rank is not rank 0 (``recovers``) and where it is. ``start`` is no call: its
rank is killed from outside 0.3 s after the job's processes appear, while MPI starts. The
patch runs ``hpcopt.cli.main`` after wrapping the call (``code``); the loss announces itself
with the debug faults' line (``tests.faults.jobs.INJECTED``), from which a job's end is timed.
Used by tests/faults/test_rank_loss.py and benchmarks/faults/rank_loss_moments.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Moment:
    """Where and how a rank is lost, and whether the survivors go on from it."""

    where: str            # what the page and the test say
    call: str = ""        # module.Class.method or module.function ("" for start)
    nth: int = 1          # its Nth call on the lost rank (with ``label``, if given)
    label: str = ""       # only calls with this label count
    how: str = "kill"     # kill, exit or stop
    recovers: bool = False  # where a rank other than 0 is lost: the survivors go on (exit 5)


MOMENTS = {
    "start": Moment("while MPI starts (kill -9 0.3 s after the processes appear)"),
    "set-up": Moment("in a set-up agreement (building the run)", "hpcopt.comm.core.Comm.agree_errors", 4),
    "set-up, exited": Moment("before the trace exists, by os._exit(1)", "hpcopt.run.runner.open_trace",
                             how="exit"),
    "step": Moment("in a step, mid-round (step 14)", "hpcopt.run.data_parallel.DataParallelSession.step",
                   14, recovers=True),
    "trace row": Moment("in a trace row's reduction (it carries the stop agreement)",
                        "hpcopt.comm.core.Comm.waitall", 3, "trace", recovers=True),
    "checkpoint": Moment("in a checkpoint's agreement", "hpcopt.comm.core.Comm.agree_errors", 2,
                         "checkpoint", recovers=True),
    "checkpoint gather": Moment("in a checkpoint's gather", "hpcopt.comm.core.Comm.gather", 2,
                                "checkpoint", recovers=True),
    "step, exited": Moment("in a step, by os._exit(1)", "hpcopt.run.data_parallel.DataParallelSession.step",
                           10, how="exit"),
    "step, stopped": Moment("in a step, by SIGSTOP", "hpcopt.run.data_parallel.DataParallelSession.step",
                            10, how="stop"),
    "summary": Moment("after the last step, in the summary",
                      "hpcopt.run.data_parallel.DataParallelSession.summarize", recovers=True),
    "end": Moment("after the last step, in the end agreement", "hpcopt.comm.core.Comm.agree"),
    "end, stopped": Moment("after the last step, by SIGSTOP", "hpcopt.comm.core.Comm.agree", how="stop"),
}

PATCH = """
import importlib
import os
import signal
import sys

from mpi4py import MPI

RANK, CALL, NTH, LABEL, HOW = {rank}, {call!r}, {nth}, {label!r}, {how!r}
path, _, name = CALL.rpartition(".")
try:
    owner = importlib.import_module(path)
except ImportError:
    path, _, cls = path.rpartition(".")
    owner = getattr(importlib.import_module(path), cls)
original, calls = getattr(owner, name), [0]


def lost(*args, **kwargs):
    label = kwargs.get("label", args[-1] if args and isinstance(args[-1], str) else "")
    if MPI.COMM_WORLD.Get_rank() == RANK and (not LABEL or label == LABEL):
        calls[0] += 1
        if calls[0] == NTH:
            sys.stderr.write(f"hpcopt: debug: injecting {{HOW}} on rank {{RANK}} at {{CALL}} call {{NTH}}\\n")
            sys.stderr.flush()
            if HOW == "exit":
                os._exit(1)
            os.kill(os.getpid(), signal.SIGSTOP if HOW == "stop" else signal.SIGKILL)
    return original(*args, **kwargs)


setattr(owner, name, lost)
from hpcopt.cli import main

sys.exit(main({argv!r}))
"""


def code(moment: Moment, rank: int, argv: list[str]) -> str:
    """Python code that runs ``hpcopt`` with ``argv`` and loses ``rank`` at ``moment``."""
    return PATCH.format(rank=rank, call=moment.call, nth=moment.nth, label=moment.label,
                        how=moment.how, argv=argv)


def expected(moment: Moment, rank: int) -> int:
    """The exit code the survivors end with: 5 where they go on, else 6."""
    return 5 if moment.recovers and rank != 0 else 6
