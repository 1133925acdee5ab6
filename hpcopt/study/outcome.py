"""How a study's task ended, read from its exit status: finished, stopped or failed, and a note.

The exit codes are hpcopt's (docs/failures.md, "Exit codes"); ``sweep --local`` and ``collect``
read them alike:

- 0: finished; 5 (``--on-rank-loss continue``): finished on the survivors of a lost rank;
- 143 (SIGTERM: a checkpoint was written) and 130 (SIGINT): stopped;
- anything else: failed; 6: a rank was lost and the survivors could not go on.
"""

from __future__ import annotations

import signal

from ..errors import EXIT_CONTINUED, EXIT_NOT_CONTINUED

FINISHED, STOPPED, FAILED = "finished", "stopped", "failed"
#: The stop signals' exit codes (128 + the signal) and names.
STOP_SIGNALS = {128 + signal.SIGTERM: "SIGTERM", 128 + signal.SIGINT: "SIGINT"}
#: What the exit codes of ``--on-rank-loss continue`` say, in a note.
MEANINGS = {EXIT_CONTINUED: "finished on the survivors of a lost rank",
            EXIT_NOT_CONTINUED: "a rank was lost and the survivors could not go on"}


def ended(code: int) -> tuple[str, str]:
    """(state, note) of a task that exited ``code``: the note is "" for 0, else it starts with
    ``exit CODE`` and says what the code means where hpcopt gives it one."""
    if code == 0:
        return FINISHED, ""
    if code in STOP_SIGNALS:
        return STOPPED, f"exit {code} ({STOP_SIGNALS[code]})"
    note = f"exit {code}: {MEANINGS[code]}" if code in MEANINGS else f"exit {code}"
    return (FINISHED if code == EXIT_CONTINUED else FAILED), note
