"""Stop signals at the launcher in a job's first moments, measured from outside
(docs/failures.md, "Launchers")::

    python benchmarks/faults/stop_window.py [--jobs 20] [--double]

Default (Open MPI's ``mpirun``): SIGUSR1 to the launcher at 0.0-1.0 s after its start (spread
evenly over the jobs, 2 or 4 ranks): for each job the exit code (138: a rank, or ``mpirun``
itself, died by SIGUSR1 before hpcopt took it over; 143: hpcopt's stop), hpcopt's lines, and
whether the run directory holds a lock or a checkpoint. ``--double`` (MPICH's ``mpiexec``): two
SIGINTs 0.1-0.5 s apart at a random moment of a run of about 20 s: the exit code, and whether
the trace has its end-of-run record (``summary``).
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.faults.jobs import ROOT, _kill_tree  # noqa: E402

TRAIN = ["train", "--dataset", "digits", "--hidden", "16", "--checkpoint-every", "8"]


def _job(ranks: int, out: Path, steps: int, signals: list[float]) -> tuple[int | str, str]:
    """Launch, send ``signals`` (seconds after the start; SIGUSR1 for one, SIGINT for two)."""
    signum = signal.SIGUSR1 if len(signals) == 1 else signal.SIGINT
    log = out.with_suffix(".log")
    with open(log, "w") as sink:
        start = time.monotonic()
        process = subprocess.Popen(["mpiexec", "-n", str(ranks), sys.executable, "-m", "hpcopt", *TRAIN,
                                    "--steps", str(steps), "--out", str(out)], stdout=sink,
                                   stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        for when in signals:
            time.sleep(max(0.0, start + when - time.monotonic()))
            if process.poll() is None:
                process.send_signal(signum)
        try:
            code: int | str = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            _kill_tree(process.pid)
            process.wait()
            code = "hang"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("hpcopt: ")]
    return code, " | ".join(line[:70] for line in lines)


def _finished(out: Path) -> str:
    trace = out / "trace.h5"
    if not trace.exists():
        return "no trace"
    with h5py.File(trace, "r") as f:
        return "end-of-run record" if "summary" in f else "no end-of-run record"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--double", action="store_true", help="two Ctrl-C to MPICH's mpiexec")
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.jobs):
            out = Path(work) / f"run{i}"
            ranks = rng.choice([2, 4])
            if args.double:
                first = rng.choice([rng.uniform(0.0, 1.0), rng.uniform(0.0, 20.0)])
                code, lines = _job(ranks, out, 3000, [first, first + rng.uniform(0.1, 0.5)])
                print(f"{ranks} ranks, Ctrl-C at {first:5.2f} s: exit {code}, {_finished(out)}; {lines}")
            else:
                at = (i + rng.random()) / args.jobs
                code, lines = _job(ranks, out, 100_000, [at])
                left = [path.name for path in (out / "hpcopt.lock", *out.glob("checkpoints/*.h5"))
                        if path.exists()] or "nothing"
                print(f"{ranks} ranks, SIGUSR1 at {at:4.2f} s: exit {code}, left {left}; {lines}")


if __name__ == "__main__":
    main()
