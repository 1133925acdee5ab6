"""Launching hpcopt jobs from a benchmark script: ``mpiexec -n N python -m hpcopt ...``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_hpcopt(ranks: int, *args: str, mpiexec: str = "mpiexec", timeout: float | None = None) -> str:
    """Run ``mpiexec -n ranks python -m hpcopt ARGS`` with this checkout first on the path; its
    standard output. A failed job ends the benchmark with the command and its error output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "hpcopt", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def train_run(out: Path, ranks: int, flags: dict[str, object], mpiexec: str = "mpiexec") -> Path:
    """``hpcopt train --KEY VALUE ... --out OUT`` on ``ranks`` ranks, unless ``OUT/trace.h5``
    already holds a finished run (one with its summary), which is kept; returns ``out``."""
    from hpcopt.io.trace import read_trace

    trace = out / "trace.h5"
    if trace.exists() and read_trace(trace).summary:
        print(f"{out.name}: done before, kept", flush=True)
        return out
    shutil.rmtree(out, ignore_errors=True)  # a run that did not finish
    start = time.perf_counter()
    run_hpcopt(ranks, "train", *(item for key, value in {**flags, "out": out}.items()
                                 for item in (f"--{key}", str(value))), mpiexec=mpiexec)
    print(f"{out.name}: {time.perf_counter() - start:.0f} s", flush=True)
    return out
