"""Stop signals at the launcher in a job's first moments, measured from outside
(docs/failures.md, "Launchers")::

    python benchmarks/faults/stop_window.py [--jobs 20] [--double | --one-rank]

Default (Open MPI's ``mpirun``): SIGUSR1 to the launcher at 0.0-1.0 s after its start (spread
evenly over the jobs, 2 or 4 ranks): for each job the exit code (138: a rank, or ``mpirun``
itself, died by SIGUSR1 before hpcopt took it over; 143: hpcopt's stop), hpcopt's lines, and
whether the run directory holds a lock or a checkpoint. ``--double`` (MPICH's ``mpiexec``): two
SIGINTs 0.1-0.5 s apart at a random moment of a run of about 20 s: the exit code, and whether
the trace has its end-of-run record (``summary``). ``--one-rank``: the window of one rank's
start-up alone, without a launcher: SIGUSR1 at 0.0-0.4 s after the exec of ``python -m hpcopt
train`` (killed: before the first line of ``hpcopt/__main__.py`` took it over), next to the
interpreter's own start-up (``python -c pass``, and without ``site``: ``python -S -c pass``).
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


def _one_rank(out: Path, at: float) -> str:
    """SIGUSR1 ``at`` seconds after the exec of a lone ``python -m hpcopt train``: "killed" (it
    died of it), or its exit code and hpcopt's line."""
    process = subprocess.Popen([sys.executable, "-m", "hpcopt", *TRAIN, "--steps", "100000", "--out",
                                str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT, start_new_session=True)  # Popen returns once the exec is done
    time.sleep(at)
    process.send_signal(signal.SIGUSR1)
    try:
        _, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        _kill_tree(process.pid)
        process.wait()
        return "hang"
    if process.returncode == -signal.SIGUSR1:
        return "killed"
    lines = [line[:70] for line in err.splitlines() if line.startswith("hpcopt: ")]
    return f"exit {process.returncode}; {' | '.join(lines)}"


def _start_up(flags: list[str]) -> float:
    """The median wall time of 5 ``python FLAGS -c pass``."""
    times = []
    for _ in range(5):
        start = time.monotonic()
        subprocess.run([sys.executable, *flags, "-c", "pass"], check=True)
        times.append(time.monotonic() - start)
    return sorted(times)[2]


def one_rank(jobs: int, rng: random.Random, work: Path) -> None:
    killed = []
    for i in range(jobs):
        at = 0.4 * (i + rng.random()) / jobs
        outcome = _one_rank(work / f"rank{i}", at)
        killed += [at] if outcome == "killed" else []
        print(f"SIGUSR1 {at:4.2f} s after the exec: {outcome}")
    print(f"killed up to {max(killed, default=0.0):.2f} s after the exec; python -c pass takes "
          f"{_start_up([]):.2f} s, python -S -c pass {_start_up(['-S']):.2f} s (medians of 5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--double", action="store_true", help="two Ctrl-C to MPICH's mpiexec")
    kind.add_argument("--one-rank", action="store_true", help="one rank's start-up, no launcher")
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as work:
        if args.one_rank:
            one_rank(args.jobs, rng, Path(work))
            return
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
                if isinstance(code, int) and code < 0:  # as a shell gives it
                    code = f"{128 - code} (mpirun itself died of it)"
                print(f"{ranks} ranks, SIGUSR1 at {at:4.2f} s: exit {code}, left {left}; {lines}")


if __name__ == "__main__":
    main()
