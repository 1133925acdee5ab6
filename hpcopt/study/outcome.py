"""How a study's task ended, read from its exit status and its run's trace: finished, stopped or
failed, and a note.

The exit codes are hpcopt's (docs/failures.md, "Exit codes"); ``sweep --local`` and ``collect``
read them alike:

- 0: finished; 5 (``--on-rank-loss continue``): finished on the survivors of a lost rank;
- 143 (SIGTERM: a checkpoint was written) and 130 (SIGINT): stopped;
- anything else: failed; 6: a rank was lost and the survivors could not go on.

An exit code is not enough to call a run finished: only the end-of-run record in its trace is
(the summary the run writes after its final evaluation). MPICH's Hydra can exit 0 after a double
Ctrl-C with the run unfinished, so a task that exited 0 or 5 whose trace lacks that record
failed, and its note says so.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from ..errors import EXIT_CONTINUED, EXIT_NOT_CONTINUED

FINISHED, STOPPED, FAILED = "finished", "stopped", "failed"
#: ``collect``'s states beyond the exit code's: a run trained on another number of ranks than its
#: task asks for, and a task that ended without recording its exit (killed, or its node died).
WRONG, INTERRUPTED = "wrong", "interrupted"
#: What a run lacks when its trace holds no end-of-run record (``ended``'s ``lacks``).
NO_END_RECORD = "its trace has no end-of-run record"
#: The stop signals' exit codes (128 + the signal) and names.
STOP_SIGNALS = {128 + signal.SIGTERM: "SIGTERM", 128 + signal.SIGINT: "SIGINT"}
#: What the exit codes of ``--on-rank-loss continue`` say, in a note.
MEANINGS = {EXIT_CONTINUED: "finished on the survivors of a lost rank",
            EXIT_NOT_CONTINUED: "a rank was lost and the survivors could not go on"}


def ended(code: int, lacks: Callable[[], str]) -> tuple[str, str]:
    """(state, note) of a task that exited ``code``: the note is "" for 0, else it starts with
    ``exit CODE`` and says what the code means where hpcopt gives it one. ``lacks()`` says what
    the run lacks to have finished ("" when its trace holds the end-of-run record, else e.g.
    ``NO_END_RECORD``); it is asked only where the code says finished, and a run that lacks
    something failed: "exit 0, but its trace has no end-of-run record"."""
    if code in STOP_SIGNALS:
        return STOPPED, f"exit {code} ({STOP_SIGNALS[code]})"
    note = f"exit {code}: {MEANINGS[code]}" if code in MEANINGS else f"exit {code}"
    if code not in (0, EXIT_CONTINUED):
        return FAILED, note
    missing = lacks()
    if missing:
        return FAILED, f"{note}, but {missing}"
    return FINISHED, "" if code == 0 else note
