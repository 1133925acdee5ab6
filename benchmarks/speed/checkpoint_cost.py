"""What a checkpoint costs against a step, and so what ``--checkpoint-minutes M`` costs.

Run under MPI (rank 0 prints)::

    mpiexec -n 4 python benchmarks/speed/checkpoint_cost.py
    mpiexec -n 4 python benchmarks/speed/checkpoint_cost.py --hidden 512,256 --hidden 2048,2048 --rounds 5

Each ``--hidden`` is the default job (MLP on MNIST-5k, PR-SGD with I = 8, batch 32 per rank,
float32) with those hidden layers, run ``--rounds`` times for ``--steps`` steps with a checkpoint
every ``--every`` steps, a trace row every 4 and ``--timeline true``, the models in turn within
each round (so all see about the same load from other programs). Per run, from its trace: a
step's seconds are the trace rows' wall time over their steps, for the rows whose window holds
no checkpoint; a checkpoint's seconds are rank 0's checkpoint spans (the state averaged or
gathered, the file written, fsynced, sealed with its digest and renamed, old ones pruned: what
the run stands still for). Printed: the medians over every run and checkpoint, a checkpoint in
steps, and the share of the wall time that a checkpoint every 10 minutes takes (checkpoint
seconds / 600 s: the time between two checkpoints is the run's, whatever the step).
Checkpoints at a round's end (the ranks hold one model: it is stored once) and mid-round
(every rank's own model is stored too: what a checkpoint by wall time, at any row, mostly is)
are shown apart; with the default ``--every 12`` and I = 8 they alternate.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt import train  # noqa: E402
from hpcopt.comm import Comm  # noqa: E402
from hpcopt.config import build_config  # noqa: E402
from hpcopt.io import data_parallel_checkpoint as ckpt_io  # noqa: E402
from hpcopt.io.timeline import read_timeline  # noqa: E402
from hpcopt.io.trace import read_trace  # noqa: E402
from hpcopt.run.directory import checkpoints  # noqa: E402

PERIOD_SECONDS = 600.0  # the cost is shown for a checkpoint every 10 minutes
KINDS = ("round end", "mid-round")


@dataclass
class Measured:
    """One model's measurements over its runs."""

    step: list[float] = field(default_factory=list)   # seconds per step of clean row windows
    checkpoint: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    stored: dict[str, int] = field(default_factory=dict)  # kind -> bytes of a checkpoint
    parameters: int = 0


def run(options: dict[str, str], out: Path, every: int, measured: Measured) -> None:
    """One run; rank 0 adds its measurements to ``measured``."""
    config = build_config(None, {**options, "progress": "false", "out": str(out), "timeline": "true",
                                 "checkpoint_every": str(every), "keep_checkpoints": "2"})
    comm = Comm()
    try:
        summary, _ = train(config, comm, verbose=False)
    finally:
        comm.free()
    if comm.rank != 0:
        return
    interval = getattr(config.algorithm, "interval", 1)

    def kind(step: int) -> str:
        return KINDS[bool(step % interval)]

    trace = read_trace(out / "trace.h5")
    steps, wall = trace.columns["step"], trace.columns["wall"]
    measured.step += [(wall[i] - wall[i - 1]) / (steps[i] - steps[i - 1]) for i in range(1, trace.rows)
                      if steps[i - 1] % every and steps[i] > steps[i - 1]]  # no checkpoint at its start
    timeline = read_timeline(out / "trace.h5")
    assert timeline is not None
    spans = timeline.spans[(timeline.spans["rank"] == 0)
                           & (timeline.spans["kind"] == timeline.kinds.index(("checkpoint", "checkpoint")))]
    for span in spans:
        measured.checkpoint[kind(int(span["step"]))].append(float(span["duration"]))
    for path in checkpoints(out):
        measured.stored[kind(int(ckpt_io.NAME_PATTERN.match(path.name).group(1)))] = path.stat().st_size
    measured.parameters = summary.parameters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", action="append", default=[], metavar="SIZES",
                        help="hidden layers of a model to measure (repeatable; default: 512,256 and "
                             "2048,2048)")
    parser.add_argument("--steps", type=int, default=72, help="steps per run")
    parser.add_argument("--every", type=int, default=12, help="steps between checkpoints")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each model")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a job option for every run (repeatable), e.g. dataset=digits")
    args = parser.parse_args()
    models = args.hidden or ["512,256", "2048,2048"]
    options = {"steps": str(args.steps), "trace_every": "4", **dict(item.split("=", 1) for item in args.set)}
    if args.every % int(options["trace_every"]) or args.every <= int(options["trace_every"]):
        parser.error("--every must be a multiple of trace_every above it (rows without a checkpoint)")
    probe = Comm()
    rank, size = probe.rank, probe.size
    root = Path(probe.mpi.bcast(tempfile.mkdtemp(prefix="hpcopt-checkpoint-bench-") if rank == 0 else None))
    probe.free()
    run({**options, "hidden": models[0]}, root / "warm-up", args.every, Measured())  # imports, data
    measured = {model: Measured() for model in models}
    for n in range(args.rounds):
        for model in models:
            run({**options, "hidden": model}, root / f"{n}-{model}", args.every, measured[model])
    if rank != 0:
        return
    shutil.rmtree(root, ignore_errors=True)
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    print(f"checkpoint cost: {size} rank(s), {args.rounds} run(s) of each model ({shown}), a "
          f"checkpoint every {args.every} steps; medians (quartiles of the checkpoint seconds)")
    print("| hidden | parameters | step ms | checkpoint | MB | seconds | in steps "
          "| one every 10 min costs |")
    print("|---|---|---|---|---|---|---|---|")
    for model, m in measured.items():
        step = statistics.median(m.step)
        for kind in KINDS:
            if not m.checkpoint[kind]:
                continue
            seconds = statistics.median(m.checkpoint[kind])
            low, high = np.percentile(m.checkpoint[kind], [25, 75])
            print(f"| {model} | {m.parameters:,} | {1e3 * step:.2f} | {kind} | "
                  f"{m.stored.get(kind, 0) / 1e6:.1f} | {seconds:.3f} ({low:.3f} .. {high:.3f}) "
                  f"| {seconds / step:.1f} | {100 * seconds / PERIOD_SECONDS:.3f}% |")


if __name__ == "__main__":
    main()
