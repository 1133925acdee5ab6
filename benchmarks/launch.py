"""Launching hpcopt jobs from a benchmark script: ``mpiexec -n N python -m hpcopt ...``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_hpcopt(ranks: int, *args: str, mpiexec: str = "mpiexec", timeout: float | None = None) -> str:
    """Run ``mpiexec -n ranks python -m hpcopt ARGS`` with this checkout first on the path; its
    standard output. A failed job ends the benchmark with the command and its error output."""
    return run_python(ranks, "-m", "hpcopt", *args, mpiexec=mpiexec, timeout=timeout)


def run_python(ranks: int, *args: str, mpiexec: str = "mpiexec", timeout: float | None = None) -> str:
    """``mpiexec -n ranks python ARGS`` (a script and its arguments, or ``-m module ...``) as
    ``run_hpcopt`` runs it; its standard output."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    command = [mpiexec, "-n", str(ranks), sys.executable, *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout
