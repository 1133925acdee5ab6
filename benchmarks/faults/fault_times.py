"""How fast each injected fault ends a job, and what it costs: the table of
docs/results/reliability.md. Launches real ``mpiexec`` jobs (2 ranks) from the repository root::

    python benchmarks/faults/fault_times.py [--repeats 3] [--pipeline]

For each fault of tests/faults/test_failures.py (and SIGTERM to the launcher): the exit code,
the median seconds from the fault (its announcement on stderr, or the signal) to the end of
the job, the newest complete checkpoint left, and the steps completed after it (the work to
redo: a fault in step K follows K - 1 completed steps, a kill in the checkpoint of tick K
follows K). ``--pipeline``: the faults of tests/faults/test_pipeline_failures.py instead (PPRS
on 2 stages; steps are iterations).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt.io import pipeline_checkpoint  # noqa: E402
from hpcopt.io.data_parallel_checkpoint import read_checkpoint  # noqa: E402
from tests.faults import test_failures, test_pipeline_failures  # noqa: E402
from tests.faults.jobs import SMALL, STEPS, run_job  # noqa: E402


def fault_step(flags: list[str]) -> int | None:
    """The step (or checkpoint tick) at which ``--debug-fail-at`` fires."""
    return int(flags[flags.index("--debug-fail-at") + 1].split(":")[1]) if "--debug-fail-at" in flags else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pipeline", action="store_true", help="the pipeline run's faults")
    args = parser.parse_args()
    if args.pipeline:
        base, steps, faults = test_pipeline_failures.PIPELINE, test_pipeline_failures.ITERATIONS, \
            test_pipeline_failures.FAULTS
        newest_tick = lambda out: pipeline_checkpoint.read(out, 2).tick  # noqa: E731
    else:
        base, steps, faults = SMALL, STEPS, test_failures.FAULTS
        newest_tick = lambda out: read_checkpoint(out).tick  # noqa: E731
    cases = {name: (["train", *base, "--steps", str(steps), *flags], None) for name, (flags, *_) in faults.items()}
    cases["sigterm"] = (["train", *base, "--steps", "100000", "--progress", "true"], 0.5)
    print(f"{'fault':<20} {'exit':>5} {'s to exit (median)':>19} {'newest checkpoint':>18} {'steps to redo':>14}")
    for name, (command, sigterm) in cases.items():
        seconds, codes, ticks, lost = [], set(), set(), set()
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as directory:
                out = Path(directory) / "run"
                job = run_job([*command, "--out", str(out)], sigterm_after=sigterm)
                seconds.append(job.after_fault)
                codes.add(job.returncode)
                tick = newest_tick(out)
                ticks.add(tick)
                step = fault_step(command)  # the fault fires in step K (a checkpoint: at tick K)
                done = tick if step is None else step if name == "kill-in-checkpoint" else step - 1
                lost.add(done - tick)
        show = lambda values: "/".join(str(v) for v in sorted(values))  # noqa: E731
        print(f"{name:<20} {show(codes):>5} {statistics.median(seconds):19.2f} "
              f"{show(ticks):>18} {show(lost):>14}")


if __name__ == "__main__":
    main()
