"""Launching hpcopt jobs from a benchmark script: ``mpiexec -n N python -m hpcopt ...``, a
benchmark's own MPI part (``mpiexec -n N python benchmarks/KIND/SCRIPT ...``), and one training
run with its trace kept for a rerun (a grid of them is a study: ``study.py``)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: The checkout: the children run here, with it first on their path.
ROOT = Path(__file__).resolve().parents[2]


def _run(command: list[str], timeout: float | None) -> str:
    """Run ``command`` in the checkout with it first on the path; its standard output. A failed
    job ends the benchmark with the command and its error output."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def add_mpiexec_option(parser: argparse.ArgumentParser) -> None:
    """--mpiexec: the launcher of every job the benchmark starts."""
    parser.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec",
                        help="the MPI launcher (default: mpiexec on the PATH)")


def flag_args(flags: dict[str, object]) -> list[str]:
    """``{"lr": 0.1, "steps": 8}`` as ``["--lr", "0.1", "--steps", "8"]``."""
    return [item for key, value in flags.items() for item in (f"--{key}", str(value))]


def run_hpcopt(ranks: int, *args: str, mpiexec: str = "mpiexec", timeout: float | None = None) -> str:
    """Run ``mpiexec -n ranks python -m hpcopt ARGS``; its standard output."""
    return _run([mpiexec, "-n", str(ranks), sys.executable, "-m", "hpcopt", *args], timeout)


def run_script(ranks: int, script: str | Path, *args: str, mpiexec: str = "mpiexec",
               timeout: float | None = None) -> str:
    """Run ``mpiexec -n ranks python SCRIPT ARGS`` (the MPI part of a benchmark that the same
    script, run without mpiexec, drives: pass its ``__file__``); its standard output."""
    return _run([mpiexec, "-n", str(ranks), sys.executable, str(Path(script).resolve()), *args], timeout)


def train_run(ranks: int, out: Path, flags: dict[str, object], reuse: bool = True,
              mpiexec: str = "mpiexec") -> Path:
    """``mpiexec -n ranks python -m hpcopt train --KEY VALUE ... --out OUT``, unless ``reuse`` and
    OUT already holds a finished trace; returns OUT (the run directory)."""
    from hpcopt.io.trace import read_trace

    trace = out / "trace.h5"
    if reuse and trace.exists() and read_trace(trace).summary:
        print(f"{out.name}: done before, kept", flush=True)
        return out
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    run_hpcopt(ranks, "train", *flag_args({**flags, "out": out}), mpiexec=mpiexec)
    print(f"{out.name}: {time.perf_counter() - start:.0f} s", flush=True)
    return out
