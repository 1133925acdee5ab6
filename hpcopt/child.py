"""Work that may crash the process runs in a child Python process.

Some failures cannot be caught in-process: an MPI that is not CUDA-aware dies with SIGSEGV when
handed device memory, and the HDF5 C library can crash on damaged metadata in an untrusted
file. ``run_module`` runs ``python -m MODULE ARGS`` started without the MPI launcher's
variables (so if it initializes MPI, it does so on its own, as a singleton) and reports how it
ended in one line a caller can put into an error message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChildResult:
    """How the child ended: its exit status (None if it timed out), the signal that killed it
    (e.g. "SIGSEGV"), and its last line of output, stderr after stdout (or what happened)."""

    returncode: int | None
    signal: str | None
    message: str

    @property
    def ok(self) -> bool:
        """Exited 0 with ``ok`` as its last line."""
        return self.returncode == 0 and self.message == "ok"


def child_environment() -> dict[str, str]:
    """This process's environment without the MPI launcher's variables, with this hpcopt
    first on ``PYTHONPATH``: for a child Python that runs hpcopt on its own. The algorithms
    registered by call here are named to it, with the folders that import their modules after
    the others on ``PYTHONPATH`` (``hpcopt.algorithms.registration``)."""
    from .algorithms.registration import child_variables
    from .comm.mpi_support import singleton_environment  # hpcopt.comm imports this module

    package_parent = str(Path(__file__).resolve().parent.parent)
    env = singleton_environment()
    registered = child_variables()
    paths = (package_parent, env.get("PYTHONPATH"), registered.pop("PYTHONPATH", None))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return {**env, **registered}


def run_module(module: str, args: list[str], timeout: float) -> ChildResult:
    """Run ``python -m module *args``, at most ``timeout`` seconds, and say how it ended."""
    try:
        # a session of its own: a stop signal to the job's process groups (Open MPI forwards
        # SIGUSR1 so) is the caller's to handle, not a crash of the child reading a file
        done = subprocess.run([sys.executable, "-m", module, *args], env=child_environment(),
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return ChildResult(None, None, f"did not finish within {timeout:g} s")
    name = None
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
    ok_line = done.stdout.strip().splitlines()[-1:] == ["ok"]
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return ChildResult(done.returncode, name, "ok" if ok_line else (lines[-1] if lines else ""))
