"""OSU-style allreduce benchmark: raw mpi4py vs ``hpcopt.comm.Comm.average_`` vs pickled tensors.

Run under MPI (rank 0 prints)::

    mpiexec -n 2 python benchmarks/allreduce.py
    mpiexec -n 4 python benchmarks/allreduce.py --max-bytes 256M --json docs/results/allreduce-4.json

For every message size (``--min-bytes`` .. ``--max-bytes``, by a factor ``--factor``) it times,
median over repetitions after warm-up, the max over ranks of each rank's time:

  raw     ``comm.Allreduce(MPI.IN_PLACE, buf)`` then ``buf /= n`` (one call, unsliced)
  hpcopt  ``Comm.average_(buf)`` (issued in slices of ``ALLREDUCE_SLICE_BYTES``)
  pickle  the same bytes as ~10 separate tensors of an MLP-like layout, each reduced with the
          lowercase, pickle-based ``comm.allreduce(t, op=MPI.SUM)`` and then divided by n

The three are interleaved within each repetition (rotating order) so that machine noise hits
them alike. A barrier precedes each timed call. Bandwidths follow nccl-tests: algbw =
bytes / time, busbw = algbw * 2(n-1)/n.

Repetitions per size: as many rounds as ``--budget`` seconds allow (between ``--min-reps`` and
``--max-reps``), estimated from the slowest rank's warm-up round; ``--reps`` fixes the number.
The pickle path is skipped above ``--pickle-max-bytes`` (64 MB) and the table says so.

A second table sweeps the slice size of a raw sliced Allreduce (no scaling) at the big sizes,
to measure the best value of ``hpcopt.comm.ALLREDUCE_SLICE_BYTES`` instead of guessing it.
Its ``rel`` column is paired: in each round every slice size runs once, each time is divided
by that round's fastest, and the median over rounds is taken, so drifts in machine load cancel.
The load average is printed at start and end; on a shared machine, rerun when it exceeds the
rank count. A full default run takes ~35-60 s at 2 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

# Harmless for MPI itself; keeps any BLAS/OpenMP pool from competing with the other ranks.
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from hpcopt.comm import ALLREDUCE_SLICE_BYTES, Comm  # noqa: E402

KB, MB = 1 << 10, 1 << 20
DEFAULT_SLICES = (256 * KB, 1 * MB, 2 * MB, 4 * MB, 8 * MB, 16 * MB, 0)  # 0 = unsliced
DEFAULT_SWEEP_SIZES = (16 * MB, 32 * MB, 64 * MB)


# -- helpers ---------------------------------------------------------------------------------

def parse_bytes(text: str) -> int:
    """'4096', '4K', '4KB', '16M', '1G' -> bytes (binary units)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": KB, "M": MB, "G": 1 << 30}.get(t[-1:] or "", 1)
    if t[-1:] in ("K", "M", "G"):
        t = t[:-1]
    return int(float(t) * mult)


def fmt_bytes(n: int) -> str:
    if n == 0:
        return "unsliced"
    for unit, size in (("GB", 1 << 30), ("MB", MB), ("KB", KB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def reps_for(round_seconds: float, budget: float, min_reps: int, max_reps: int) -> int:
    """Repetitions that fit ``budget`` seconds, given one warm-up round over all cases."""
    return int(max(min_reps, min(max_reps, budget / max(round_seconds, 1e-9))))


def mlp_layout(n_elems: int) -> list[int]:
    """~10 tensor lengths of an MLP (5 weight matrices + 5 biases) summing to ``n_elems``."""
    if n_elems < 20:
        return [n_elems]
    # Biases ~ a hidden width; weights share the rest like a tapering MLP.
    bias = max(1, min(int(np.sqrt(n_elems / 4)), n_elems // 50))
    biases = [bias, bias, bias, bias, max(1, bias // 10)]
    rest = n_elems - sum(biases)
    shares = (0.20, 0.30, 0.25, 0.20, 0.05)
    weights = [int(rest * s) for s in shares]
    weights[1] += rest - sum(weights)
    sizes: list[int] = []
    for w, b in zip(weights, biases):
        sizes += [w, b]
    assert sum(sizes) == n_elems and all(s > 0 for s in sizes)
    return sizes


class Timer:
    """Barrier, then time one call on this rank; the max over ranks is taken afterwards."""

    def __init__(self, mpi: MPI.Comm) -> None:
        self.mpi = mpi

    def __call__(self, fn) -> float:
        self.mpi.Barrier()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def max_over_ranks(self, times: dict[str, list[float]]) -> dict[str, np.ndarray]:
        out = {}
        for key in sorted(times):  # same order on every rank
            local = np.asarray(times[key], dtype=np.float64)
            self.mpi.Allreduce(MPI.IN_PLACE, local, op=MPI.MAX)
            out[key] = local
        return out


def run_interleaved(timer: Timer, cases: dict[str, callable], reps: int, warmup: int,
                    budget: float, min_reps: int, max_reps: int) -> dict[str, np.ndarray]:
    """Warm each case up, then rounds over all cases in rotating order.

    ``reps`` > 0 fixes the number of rounds; otherwise it is chosen from the slowest rank's
    last warm-up round so that the rounds take about ``budget`` seconds (the same number on
    every rank, since it comes from an allreduce).
    """
    names = list(cases)
    last_round = np.zeros(1)
    for _ in range(max(1, warmup)):
        last_round[0] = sum(timer(cases[name]) for name in names)
    if reps <= 0:
        timer.mpi.Allreduce(MPI.IN_PLACE, last_round, op=MPI.MAX)
        reps = reps_for(float(last_round[0]), budget, min_reps, max_reps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(timer(cases[name]))
    return timer.max_over_ranks(times)


# -- the three paths -------------------------------------------------------------------------

def make_raw(mpi: MPI.Comm, buf: np.ndarray):
    n = mpi.Get_size()

    def raw() -> None:
        mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        np.divide(buf, n, out=buf)  # in place, like average_

    return raw


def make_hpcopt(comm: Comm, buf: np.ndarray):
    def hp() -> None:
        comm.average_(buf)

    return hp


def make_pickle(mpi: MPI.Comm, tensors: list[np.ndarray]):
    n = mpi.Get_size()

    def pick() -> None:
        for i, t in enumerate(tensors):
            summed = mpi.allreduce(t, op=MPI.SUM)
            summed /= n
            tensors[i] = summed

    return pick


def make_sliced(mpi: MPI.Comm, buf: np.ndarray, slice_bytes: int):
    if slice_bytes == 0 or slice_bytes >= buf.nbytes:
        def whole() -> None:
            mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        return whole
    step = max(1, slice_bytes // buf.itemsize)
    views = [buf[i:i + step] for i in range(0, buf.shape[0], step)]

    def sliced() -> None:
        for v in views:
            mpi.Allreduce(MPI.IN_PLACE, v, op=MPI.SUM)

    return sliced


# -- checks ----------------------------------------------------------------------------------

def sanity_check(mpi: MPI.Comm, comm: Comm, dtype: np.dtype) -> None:
    """average_ must equal the mean over ranks (a wrong benchmark is worse than none)."""
    n, rank = mpi.Get_size(), mpi.Get_rank()
    length = (comm.slice_bytes // dtype.itemsize) * 2 + 7  # several slices and a ragged tail
    buf = (np.arange(length) % 97 + rank).astype(dtype)
    expected = (np.arange(length) % 97 + (n - 1) / 2).astype(dtype)
    comm.average_(buf)
    if not np.allclose(buf, expected, rtol=1e-5, atol=1e-5):
        raise SystemExit(f"rank {rank}: average_ gave a wrong result; benchmark aborted")


# -- main ------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--min-bytes", type=parse_bytes, default=4 * KB)
    p.add_argument("--max-bytes", type=parse_bytes, default=64 * MB, help="up to 256M")
    p.add_argument("--factor", type=int, default=2, choices=(2, 4), help="size step")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--reps", type=int, default=0,
                   help="fixed repetitions per size (0: as many as --budget allows)")
    p.add_argument("--budget", type=float, default=2.0,
                   help="seconds of timed rounds per size and table (with 0 --reps)")
    p.add_argument("--min-reps", type=int, default=11)
    p.add_argument("--max-reps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--pickle-max-bytes", type=parse_bytes, default=64 * MB,
                   help="skip the pickle path above this size (slow)")
    p.add_argument("--sweep-sizes", default=",".join(str(s) for s in DEFAULT_SWEEP_SIZES),
                   help="comma list of sizes for the slice sweep ('' to skip)")
    p.add_argument("--slices", default=",".join(str(s) for s in DEFAULT_SLICES),
                   help="comma list of slice sizes; 0 = unsliced")
    p.add_argument("--no-main", action="store_true", help="only the slice sweep")
    p.add_argument("--json", type=Path, default=None, help="also write raw numbers here")
    args = p.parse_args(argv)

    mpi = MPI.COMM_WORLD.Dup()
    n, rank = mpi.Get_size(), mpi.Get_rank()
    dtype = np.dtype(args.dtype)
    comm = Comm()
    say = print if rank == 0 else (lambda *a, **k: None)
    busfactor = 2 * (n - 1) / n

    sanity_check(mpi, comm, dtype)
    t_start = time.perf_counter()

    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.factor

    say(f"# hpcopt allreduce benchmark: {n} rank(s), {dtype.name}, "
        f"{MPI.Get_library_version().splitlines()[0].strip()}, mpi4py {__import__('mpi4py').__version__}")
    load_start = os.getloadavg()
    say(f"# host {platform.node()}, {os.cpu_count()} cpu(s), load average {load_start[0]:.2f} at start; "
        f"Comm.slice_bytes = {fmt_bytes(comm.slice_bytes)}; times = median over reps of max over ranks")

    results: list[dict] = []
    if not args.no_main:
        say("")
        say(f"{'size':>9} {'reps':>4} | {'raw us':>10} {'hpcopt us':>10} {'pickle us':>10} |"
            f" {'raw algbw':>9} {'hp algbw':>9} {'hp busbw':>9} {'pk busbw':>9} |"
            f" {'hp/raw':>6} {'hp/pk':>6}")
        say(f"{'':>9} {'':>4} | {'':>10} {'':>10} {'':>10} |"
            f" {'GB/s':>9} {'GB/s':>9} {'GB/s':>9} {'GB/s':>9} |")
        for nbytes in sizes:
            length = nbytes // dtype.itemsize
            rng = np.random.default_rng(rank)
            buf_raw = rng.random(length, dtype=dtype)
            buf_hp = buf_raw.copy()
            cases = {"raw": make_raw(mpi, buf_raw), "hpcopt": make_hpcopt(comm, buf_hp)}
            pickled = nbytes <= args.pickle_max_bytes
            if pickled:
                tensors = [rng.random(k, dtype=dtype) for k in mlp_layout(length)]
                cases["pickle"] = make_pickle(mpi, tensors)
            times = run_interleaved(Timer(mpi), cases, args.reps, args.warmup,
                                    args.budget, args.min_reps, args.max_reps)
            reps = len(times["raw"])
            med = {k: float(np.median(v)) for k, v in times.items()}
            row = {"bytes": nbytes, "reps": reps, "median_s": med,
                   "all_s": {k: v.tolist() for k, v in times.items()},
                   "n_tensors_pickle": len(mlp_layout(length)) if pickled else None}
            results.append(row)
            gb = lambda t: nbytes / t / 1e9  # noqa: E731
            pk = f"{med['pickle'] * 1e6:10.1f}" if pickled else f"{'skipped':>10}"
            pkbw = f"{gb(med['pickle']) * busfactor:9.2f}" if pickled else f"{'-':>9}"
            hppk = f"{med['hpcopt'] / med['pickle']:6.3f}" if pickled else f"{'-':>6}"
            say(f"{fmt_bytes(nbytes):>9} {reps:>4} | {med['raw'] * 1e6:10.1f} {med['hpcopt'] * 1e6:10.1f} {pk} |"
                f" {gb(med['raw']):9.2f} {gb(med['hpcopt']):9.2f} {gb(med['hpcopt']) * busfactor:9.2f} {pkbw} |"
                f" {med['hpcopt'] / med['raw']:6.3f} {hppk}", flush=True)
            del buf_raw, buf_hp, cases
        if any(r["bytes"] > args.pickle_max_bytes for r in results):
            say(f"# pickle path skipped above {fmt_bytes(args.pickle_max_bytes)} (--pickle-max-bytes)")

    sweep_sizes = [parse_bytes(x) for x in args.sweep_sizes.split(",") if x.strip()]
    sweep_sizes = [s for s in sweep_sizes if s <= args.max_bytes]
    slices = [parse_bytes(x) for x in args.slices.split(",") if x.strip()]
    sweep: list[dict] = []
    score: dict[int, float] = {}
    choice = None
    if sweep_sizes:
        say("")
        say("# slice sweep: raw sliced Allreduce (no scaling). Per cell: median us, busbw GB/s, and")
        say("# rel = median over rounds of time / fastest slice size of that round (paired, so")
        say("# robust to drift). * = lowest rel")
        say(f"{'size':>9} {'reps':>4} | " + " ".join(f"{fmt_bytes(sl):>19}" for sl in slices))
        for nbytes in sweep_sizes:
            length = nbytes // dtype.itemsize
            # Zeros: repeated unscaled sums of anything else would grow to inf (same add speed,
            # but zeros keep the buffer finite and free of denormals whatever the rep count).
            buf = np.zeros(length, dtype=dtype)
            cases = {f"{sl:012d}": make_sliced(mpi, buf, sl) for sl in slices}
            times = run_interleaved(Timer(mpi), cases, args.reps, args.warmup,
                                    3 * args.budget, args.min_reps, args.max_reps)
            reps = len(next(iter(times.values())))
            med = {int(k): float(np.median(v)) for k, v in times.items()}
            table = np.array([times[f"{sl:012d}"] for sl in slices])  # (slices, rounds)
            rel_rounds = table / table.min(axis=0, keepdims=True)
            rel = {sl: float(np.median(rel_rounds[i])) for i, sl in enumerate(slices)}
            best = min(rel, key=rel.get)
            cells = [f"{med[sl] * 1e6:7.0f} {nbytes / med[sl] / 1e9 * busfactor:4.1f} {rel[sl]:4.2f}"
                     + ("*" if sl == best else " ") for sl in slices]
            say(f"{fmt_bytes(nbytes):>9} {reps:>4} | " + " ".join(f"{c:>19}" for c in cells), flush=True)
            sweep.append({"bytes": nbytes, "reps": reps, "median_s": {str(k): v for k, v in med.items()},
                          "rel": {str(k): v for k, v in rel.items()},
                          "all_s": {str(int(k)): v.tolist() for k, v in times.items()},
                          "best_slice_bytes": best})
            del buf, cases
        # Overall choice: the slice size with the lowest geometric mean of rel over sweep sizes.
        score = {sl: float(np.exp(np.mean([np.log(r["rel"][str(sl)]) for r in sweep]))) for sl in slices}
        choice = min(score, key=score.get)
        say("# rel, geometric mean over sweep sizes: "
            + ", ".join(f"{fmt_bytes(sl)} {score[sl]:.3f}" for sl in slices))
        say(f"# best slice size overall: {fmt_bytes(choice)} (hpcopt now uses {fmt_bytes(ALLREDUCE_SLICE_BYTES)})")

    load_end = os.getloadavg()
    say(f"# total {time.perf_counter() - t_start:.1f} s; load average {load_end[0]:.2f} at end "
        f"(above {n} means other work shared the cores: rerun)")
    if args.json is not None and rank == 0:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "ranks": n, "dtype": dtype.name, "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "mpi4py": __import__("mpi4py").__version__, "host": platform.node(), "cpus": os.cpu_count(),
            "loadavg_start": load_start, "loadavg_end": load_end,
            "hpcopt_slice_bytes": comm.slice_bytes, "timing": "median over reps of max over ranks",
            "pickle_max_bytes": args.pickle_max_bytes, "main": results, "slice_sweep": sweep,
            "slice_score": {str(k): v for k, v in score.items()}, "best_slice_bytes": choice,
        }, indent=1))
        say(f"# wrote {args.json}")
    comm.free()
    mpi.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
