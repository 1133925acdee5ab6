"""Work that may crash the process runs in a child Python process.

Some failures cannot be caught in-process: an MPI that is not CUDA-aware dies with SIGSEGV when
handed device memory, and the HDF5 C library can crash on damaged metadata in an untrusted
file. ``run_module`` runs ``python -m MODULE ARGS`` in the environment its caller hands it
(``child_environment``: the caller's own without the MPI launcher's variables, so a child that
initializes MPI does so on its own, as a singleton) and reports how it ended in one line a caller
can put into an error message. This module imports nothing of hpcopt: each caller knows what its
child needs (``hpcopt.comm.staging``, ``hpcopt.run.vetting``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
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


def child_environment(base: Mapping[str, str], variables: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (the caller's environment without the MPI launcher's variables:
    ``hpcopt.comm.mpi_support.singleton_environment``) with ``variables`` added, for a child
    Python that runs hpcopt on its own: this hpcopt first on ``PYTHONPATH``, then ``base``'s
    entries, then those of ``variables`` (the folders of the algorithms a parent registered by
    call: ``hpcopt.algorithms.registration.child_variables``)."""
    env, added = dict(base), dict(variables or {})
    package_parent = str(Path(__file__).resolve().parent.parent)
    paths = (package_parent, env.get("PYTHONPATH"), added.pop("PYTHONPATH", None))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return {**env, **added}


def run_module(module: str, args: list[str], timeout: float, env: Mapping[str, str]) -> ChildResult:
    """Run ``python -m module *args`` in the environment ``env`` (``child_environment``), at
    most ``timeout`` seconds, and say how it ended."""
    try:
        # a session of its own: a stop signal to the job's process groups (Open MPI forwards
        # SIGUSR1 so) is the caller's to handle, not a crash of the child reading a file
        done = subprocess.run([sys.executable, "-m", module, *args], env=dict(env),
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
