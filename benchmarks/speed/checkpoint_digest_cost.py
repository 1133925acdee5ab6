"""What the content digest costs: writing and reading a ~50 MB checkpoint with and without it.
The table of docs/results/reliability.md::

    python benchmarks/speed/checkpoint_digest_cost.py [--repeats 7] [--mb 50] [--ranks 4]

The checkpoint is a consistent synthetic one of a run on ``--ranks`` ranks taken mid-round with
momentum (float32: the averaged model twice, flat and by layer, and every rank's model and
momentum), sized to about ``--mb`` MB. Modes, alternating in every repeat so both see the same
load: ``digest`` (as hpcopt writes and reads) and ``none`` (the same code with sealing a no-op,
and reading checking only the format: the cost before the digest). Reported: median seconds of
a write (``write_checkpoint``, fsync included), of one rank's read (``read_checkpoint`` for rank
0 of N: what each rank does on resume) and of a read of every rank's rows, and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt.config import build_config  # noqa: E402
from hpcopt.flat import ParamLayout  # noqa: E402
from hpcopt.io import check_format  # noqa: E402
from hpcopt.io import data_parallel_checkpoint as ckpt_io  # noqa: E402
from hpcopt.io.data_parallel_checkpoint import Checkpoint, read_checkpoint, write_checkpoint  # noqa: E402


def synthetic(megabytes: float, ranks: int) -> Checkpoint:
    """A consistent float32 checkpoint of about ``megabytes`` MB (2 + 2N vectors of d)."""
    d = int(megabytes * 1e6 / 4 / (2 + 2 * ranks))
    config = build_config(None, {"momentum": "0.9", "steps": "10"})
    layout = ParamLayout.of(w=(d - 10,), b=(10,))
    rng = np.random.default_rng(0)
    rows = {"x": rng.standard_normal((ranks, d), dtype=np.float32),
            "momentum": rng.standard_normal((ranks, d), dtype=np.float32)}
    return Checkpoint(
        config=config, world_size=ranks, tick=5, run_id="abc", trace_rows=2, wall_seconds=1.5,
        layout=layout, model=rows["x"].mean(axis=0),
        counters=np.array([[5, 1, 1]] * ranks, dtype=np.int64),
        sampler=np.array([[0, 5, 32, 1000, 0, r] for r in range(ranks)], dtype=np.int64),
        window=np.array([[1.25, 2.0]] * ranks), comm=[("allreduce", "average", 1, 48, 0.01)],
        rows=rows)


def without_digest() -> Callable[[], None]:
    """Make sealing a no-op and reading check the format only; returns the undo."""
    seal, check_sealed = ckpt_io.seal, ckpt_io.check_sealed
    ckpt_io.seal = lambda f: None  # type: ignore[assignment]
    ckpt_io.check_sealed = lambda f, path, name, version, kind: check_format(  # type: ignore[assignment]
        f.attrs, path, name, version, kind)

    def undo() -> None:
        ckpt_io.seal, ckpt_io.check_sealed = seal, check_sealed
    return undo


def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    ckpt = synthetic(args.mb, args.ranks)
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for repeat in range(args.repeats):
            for mode in (("digest", "none") if repeat % 2 == 0 else ("none", "digest")):
                undo = without_digest() if mode == "none" else (lambda: None)
                try:
                    path = Path(directory) / f"{mode}" / "step-000000005.h5"
                    times.setdefault((mode, "write"), []).append(timed(lambda: write_checkpoint(path, ckpt)))
                    times.setdefault((mode, "read one rank"), []).append(
                        timed(lambda: read_checkpoint(path, 0, args.ranks)))
                    times.setdefault((mode, "read all ranks"), []).append(timed(lambda: read_checkpoint(path)))
                finally:
                    undo()
        size = path.stat().st_size
    print(f"checkpoint: {size / 1e6:.1f} MB ({args.ranks} ranks, float32), {args.repeats} repeats, medians")
    print(f"{'operation':<16} {'no digest (s)':>14} {'digest (s)':>11} {'ratio':>7}")
    for operation in ("write", "read one rank", "read all ranks"):
        base = statistics.median(times[("none", operation)])
        with_digest = statistics.median(times[("digest", operation)])
        print(f"{operation:<16} {base:14.3f} {with_digest:11.3f} {with_digest / base:7.2f}")


if __name__ == "__main__":
    main()
