"""How ``hpcopt sweep`` scales with the points of a grid: the table "hpcopt sweep at scale" of
docs/results/reliability.md::

    python benchmarks/speed/sweep_scale.py [--points 1000 10000 100000] [--repeats 3]

For each size, a sweep file of one grid of that many seeds (``[sweep] seed = [0, 1, ...]``),
run as a user runs it (``python -m hpcopt sweep FILE``, a process of its own), ``--dry-run``
and writing the study, alternating, ``--repeats`` times each: the median seconds, and the
microseconds per point beyond the first size's time (the start-up: Python, MPI, hpcopt's
imports), flat when the time is linear in the points. Each written study is
then checked: its manifest reads back with one task per seed, in order, every run directory
named after its seed, and the array script runs tasks 0 to N-1.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common.sections import replace_section  # noqa: E402
from hpcopt.study.layout import read_manifest  # noqa: E402

PAGE = ROOT / "docs" / "results" / "reliability.md"
HEADER = ("points", "--dry-run s (median)", "writing s (median)",
          "writing: µs per point beyond the first row", "study")


def sweep_file(points: int) -> str:
    return (f"[job]\nname = \"s\"\n[train]\ndataset = \"digits\"\nsteps = 4\n"
            f"[sweep]\nseed = {list(range(points))}\n")


def timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def checked(study: Path, points: int) -> str:
    """"correct", or what is wrong with the study directory of ``points`` seeds."""
    entries = read_manifest(study)
    if [e.index for e in entries] != list(range(points)):
        return "wrong task indices"
    names = [f"s-n1-s{i}" for i in range(points)] if points > 1 else ["s-n1"]  # one task: no seed named
    if [e.run.name for e in entries] != names or any(e.args[-2:] != ("--seed", str(i))
                                                     for i, e in enumerate(entries)):
        return "a task without its seed"
    if f"--array={'0-' if points > 1 else ''}{points - 1}\n" not in (study / "array-n1.sh").read_text():
        return "the array does not cover the tasks"
    return "correct"


def measure(points: int, repeats: int, work: Path) -> tuple[float, float, str]:
    """Median seconds of ``--dry-run`` and of writing the study; whether the study is correct."""
    spec = work / f"sweep-{points}.toml"
    spec.write_text(sweep_file(points))
    hpcopt = [sys.executable, "-m", "hpcopt", "sweep", spec.name]
    dry, write = [], []
    for repeat in range(repeats):
        dry.append(timed([*hpcopt, "--out", f"dry-{points}", "--dry-run"], work))
        write.append(timed([*hpcopt, "--out", f"study-{points}-{repeat}"], work))
    return statistics.median(dry), statistics.median(write), checked(work / f"study-{points}-0", points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, nargs="+", default=[1, 1000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---:|" * (len(HEADER) - 1) + "---|"]
    print("\n".join(lines), flush=True)
    first: tuple[int, float] | None = None
    with tempfile.TemporaryDirectory() as directory:
        for points in args.points:
            dry, write, outcome = measure(points, args.repeats, Path(directory))
            beyond = (f"{(write - first[1]) / (points - first[0]) * 1e6:.0f}"
                      if first and points > first[0] else "-")
            first = first or (points, write)
            row = f"| {points:,} | {dry:.2f} | {write:.2f} | {beyond} | {outcome} |"
            print(row, flush=True)
            lines.append(row)
    command = "python benchmarks/speed/sweep_scale.py " + " ".join(
        ["--points", *map(str, args.points), "--repeats", str(args.repeats)])
    replace_section(PAGE, "sweep-scale", f"`{command}`:\n\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
