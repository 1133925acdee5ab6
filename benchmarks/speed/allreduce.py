"""OSU-style allreduce benchmark: raw MPI Allreduce vs ``Comm.average_`` (mpi, shm, auto) vs pickle.

Run under MPI (rank 0 prints)::

    mpiexec -n 2 python benchmarks/speed/allreduce.py --max-bytes 256M
    mpiexec -n 4 python benchmarks/speed/allreduce.py --max-bytes 256M --fake-node-size 2 \
        --json docs/results/allreduce-4.json

For every message size (``--min-bytes`` .. ``--max-bytes``, by a factor ``--factor``) it times,
median over repetitions after warm-up, the max over ranks of each rank's time, for:

  copy1   rank 0 alone copies the buffer (``np.copyto``): the machine's memory-copy bandwidth,
          the ceiling of any averaging that has to read and write the whole buffer
  copyN   every rank copies its buffer at the same time (memory bandwidth shared by all ranks)
  raw     ``comm.Allreduce(MPI.IN_PLACE, buf)`` then ``buf /= n`` (one call, unsliced)
  slX     the same issued in slices of X bytes (``--main-slices``; only where X < size)
  mpi     ``Comm(averaging="mpi").average_(buf)`` (slices of ``ALLREDUCE_SLICE_BYTES``)
  shm     ``Comm(averaging="shm").average_(buf)``: node-local shared-memory averaging
          (hpcopt/comm/shm.py)
  auto    ``Comm(averaging="auto").average_(buf)``: what hpcopt does by default
  ownK    with ``--fake-node-size K``: the shm path on fake nodes of K ranks, the node sums
  leadK   allreduced across nodes by every slice owner (own) or by node leaders only (lead)
  pickle  the same bytes as ~10 separate tensors of an MLP-like layout, each reduced with the
          lowercase, pickle-based ``comm.allreduce(t, op=MPI.SUM)`` and then divided by n

All cases are interleaved within each repetition (in a random order, the same on every rank)
so that machine noise hits them alike. A barrier precedes each timed call. Bandwidths follow nccl-tests: algbw =
bytes / time, busbw = algbw * 2(n-1)/n. Ratios are paired: the median over repetitions of
the ratio of two times of the same repetition ("x" = speed-up, higher is better); "best plain" is
the plain MPI case (raw, slX, mpi) with the lowest median at that size; auto/mpi compares the
default with what ``Comm.average_`` did before the shm path (below the threshold both run the same
code, so it shows the noise; raw also lacks Comm's counters, worth ~0.5 us per call). The targets of the
shared-memory path are checked at the end (at 32 and 64 MB: shm >= 2x raw, >= 1.3x the best
sliced Allreduce, >= 0.5x copy1; at every size: auto >= 0.95x the best plain), and the crossover
size (smallest size from which shm beats the best plain at every larger size) is printed: that is
what ``hpcopt.comm.shm.SHM_AVERAGE_MIN_BYTES`` should be.

Repetitions per size: as many rounds as ``--budget`` seconds allow (between ``--min-reps`` and
``--max-reps``), estimated from the slowest rank's warm-up round; ``--reps`` fixes the number.
The pickle path is skipped above ``--pickle-max-bytes`` (64 MB) and the table says so.

Two sweeps follow (paired ``rel`` columns: in each round every variant runs once, each time is
divided by that round's fastest, and the median over rounds is taken, so drifts in machine load
cancel):
- the slice size of a raw sliced Allreduce (no scaling), to measure the best value of
  ``hpcopt.comm.ALLREDUCE_SLICE_BYTES``;
- the chunk size of the shared-memory path (``--chunks``), to measure the best value of
  ``hpcopt.comm.shm.SHM_CHUNK_BYTES``.
The load average is printed at start and end; on a shared machine, rerun when it exceeds the
rank count. So is the bandwidth of a hand-off through a shared window (node rank 0 writes, then
rank 0 itself or rank 1 reads): averaging over 2 ranks moves about one buffer per rank between
the cores, so when the cross-core rate is low (a VM whose virtual cores the host placed far
apart) neither MPI nor the shared-memory path can go faster, and their ratio shrinks towards 1.
A full run to 256 MB takes about a minute at 2 ranks, three at 4.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402
from hpcopt.bench.common import KB, MB, fmt_bytes, parse_bytes  # noqa: E402
from hpcopt.comm import ALLREDUCE_SLICE_BYTES, Comm  # noqa: E402
from hpcopt.comm.mpi_support import mpi_library  # noqa: E402
from hpcopt.comm.shm import SHM_AVERAGE_MIN_BYTES, SHM_CHUNK_BYTES, ShmAverager  # noqa: E402

DEFAULT_SLICES = (256 * KB, 1 * MB, 2 * MB, 4 * MB, 8 * MB, 16 * MB, 0)  # 0 = unsliced
DEFAULT_SWEEP_SIZES = (16 * MB, 32 * MB, 64 * MB)
DEFAULT_MAIN_SLICES = (1 * MB, 2 * MB, 4 * MB)
DEFAULT_CHUNKS = (256 * KB, 512 * KB, 1 * MB, 2 * MB, 4 * MB, 8 * MB)
DEFAULT_CHUNK_SWEEP_SIZES = (4 * MB, 32 * MB, 64 * MB)
TARGET_SIZES = (32 * MB, 64 * MB)
PLAIN = ("raw", "mpi")  # + every "sl..." case


# -- helpers ---------------------------------------------------------------------------------

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
    """Warm each case up, then rounds over all cases, each round in a fresh random order.

    The order is the same on every rank (seeded by the round number). A random order rather than
    a rotation: a rotation keeps every case right after the same neighbour, and what the
    previous call leaves behind (cache contents, how far apart the ranks leave it) then biases
    the comparison. ``reps`` > 0 fixes the number of rounds; otherwise it is chosen from the
    slowest rank's last warm-up round so that the rounds take about ``budget`` seconds (the same
    number on every rank, since it comes from an allreduce).
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
        for i in np.random.default_rng(r).permutation(len(names)):
            times[names[i]].append(timer(cases[names[i]]))
    return timer.max_over_ranks(times)


# -- the paths -------------------------------------------------------------------------------

def make_raw(mpi: MPI.Comm, buf: np.ndarray):
    n = float(mpi.Get_size())  # a float: numpy divides by a Python int ~1 us slower

    def raw() -> None:
        mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        np.divide(buf, n, out=buf)  # in place, like average_

    return raw


def make_sliced_average(mpi: MPI.Comm, buf: np.ndarray, slice_bytes: int):
    n = float(mpi.Get_size())
    step = max(1, slice_bytes // buf.itemsize)
    views = [buf[i:i + step] for i in range(0, buf.shape[0], step)]

    def sliced() -> None:
        for v in views:
            mpi.Allreduce(MPI.IN_PLACE, v, op=MPI.SUM)
        np.divide(buf, n, out=buf)

    return sliced


def make_average(comm: Comm, buf: np.ndarray):
    def average() -> None:
        comm.average_(buf)

    return average


def aligned_empty(length: int, dtype: np.dtype, align: int = 64) -> np.ndarray:
    """An uninitialised array whose data start on an ``align``-byte boundary.

    For the copy ceiling: glibc 2.36's memcpy on this AMD EPYC (``rep movsb`` below ~512 KB) runs
    at ~2.4 GB/s instead of ~30 GB/s when the destination is 16 bytes off a 64-byte boundary and
    the source is not, which numpy's own allocations can produce; the ceiling should measure the
    memory, not that.
    """
    raw = np.empty(length * dtype.itemsize + align, dtype=np.uint8)
    skip = (-raw.__array_interface__["data"][0]) % align
    return raw[skip:skip + length * dtype.itemsize].view(dtype)


def make_copy(rank: int, src: np.ndarray, dst: np.ndarray, everyone: bool):
    def copy() -> None:
        if everyone or rank == 0:
            np.copyto(dst, src)

    return copy


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


def paired(times: dict[str, np.ndarray], a: str, b: str) -> float:
    """Median over rounds of time(a) / time(b): > 1 means b is faster than a by that factor."""
    return float(np.median(times[a] / times[b]))


def sweep_table(say, mpi: MPI.Comm, title: list[str], sizes: list[int], variants: list[int],
                make, args, budget: float, busfactor: float) -> list[dict]:
    """Paired sweep over ``variants`` (slice or chunk sizes) at each size; prints and returns rows."""
    dtype = np.dtype(args.dtype)
    rows: list[dict] = []
    for line in title:
        say(line)
    say(f"{'size':>9} {'reps':>4} | " + " ".join(f"{fmt_bytes(v) if v else 'unsliced':>19}" for v in variants))
    for nbytes in sizes:
        length = nbytes // dtype.itemsize
        # Zeros: repeated unscaled sums of anything else would grow to inf (same add speed,
        # but zeros keep the buffer finite and free of denormals whatever the rep count).
        buf = np.zeros(length, dtype=dtype)
        cases = {f"{v:012d}": make(buf, v) for v in variants}
        times = run_interleaved(Timer(mpi), cases, args.reps, args.warmup,
                                budget, args.min_reps, args.max_reps)
        reps = len(next(iter(times.values())))
        med = {v: float(np.median(times[f"{v:012d}"])) for v in variants}
        table = np.array([times[f"{v:012d}"] for v in variants])  # (variants, rounds)
        rel_rounds = table / table.min(axis=0, keepdims=True)
        rel = {v: float(np.median(rel_rounds[i])) for i, v in enumerate(variants)}
        best = min(rel, key=rel.get)
        cells = [f"{med[v] * 1e6:7.0f} {nbytes / med[v] / 1e9 * busfactor:4.1f} {rel[v]:4.2f}"
                 + ("*" if v == best else " ") for v in variants]
        say(f"{fmt_bytes(nbytes):>9} {reps:>4} | " + " ".join(f"{c:>19}" for c in cells), flush=True)
        rows.append({"bytes": nbytes, "reps": reps, "median_s": {str(k): v for k, v in med.items()},
                     "rel": {str(k): v for k, v in rel.items()},
                     "all_s": {str(int(k)): v.tolist() for k, v in times.items()},
                     "best": best})
        del buf, cases
    return rows


def geometric_choice(rows: list[dict], variants: list[int]) -> tuple[dict[int, float], int | None]:
    """Geometric mean of rel over sizes per variant, and the variant with the lowest one."""
    if not rows:
        return {}, None
    score = {v: float(np.exp(np.mean([np.log(r["rel"][str(v)]) for r in rows]))) for v in variants}
    return score, min(score, key=score.get)


def cross_core_bandwidth(mpi: MPI.Comm, chunk: int = 1 * MB, chunks: int = 64,
                         reps: int = 5) -> tuple[float, float]:
    """(local, cross) GB/s of a hand-off through a shared-memory window: node rank 0 writes a
    1 MB piece (into one of 2 slots), a barrier, a rank reads it, a barrier; read by rank 0
    itself (local) or by node rank 1 (cross-core: the lines move between cores, and back to
    rank 0's cache when it overwrites the slot). Two ranks averaging in shared memory hand
    about one buffer per rank across like this, so the cross rate bounds them; on a VM it
    depends on where the host puts the virtual cores. (0, 0) with one rank per node.
    """
    node = mpi.Split_type(MPI.COMM_TYPE_SHARED)
    rank = node.Get_rank()
    win = MPI.Win.Allocate_shared(2 * chunk if rank == 0 else 0, 1, comm=node)
    try:
        if node.Get_size() < 2:
            return 0.0, 0.0
        slots = np.frombuffer(win.Shared_query(0)[0], dtype=np.float32).reshape(2, -1)
        src, dst = np.ones(slots.shape[1], np.float32), np.empty(slots.shape[1], np.float32)
        seconds = np.zeros((reps, 2))
        for r in range(reps):
            for reader in (0, 1):
                node.Barrier()
                start = time.perf_counter()
                for i in range(chunks):
                    if rank == 0:
                        np.copyto(slots[i % 2], src)
                    node.Barrier()
                    if rank == reader:
                        np.add(slots[i % 2], 0.0, out=dst)
                    node.Barrier()
                seconds[r, reader] = time.perf_counter() - start
        node.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
        return tuple(chunk * chunks / np.median(seconds, axis=0) / 1e9)  # type: ignore[return-value]
    finally:
        win.Free()
        node.Free()


# -- checks ----------------------------------------------------------------------------------

def sanity_check(mpi: MPI.Comm, comms: dict[str, Comm], dtype: np.dtype) -> None:
    """Every averaging path must equal the mean over ranks (a wrong benchmark is worse than none)."""
    n, rank = mpi.Get_size(), mpi.Get_rank()
    for name, comm in comms.items():
        for length in (comm.slice_bytes // dtype.itemsize * 2 + 7, 1001):  # slices, ragged tail
            buf = (np.arange(length) % 97 + rank).astype(dtype)
            expected = (np.arange(length) % 97 + (n - 1) / 2).astype(dtype)
            comm.average_(buf)
            if not np.allclose(buf, expected, rtol=1e-5, atol=1e-5):
                raise SystemExit(f"rank {rank}: average_ ({name}) gave a wrong result; benchmark aborted")


# -- main ------------------------------------------------------------------------------------

def byte_list(text: str) -> list[int]:
    return [parse_bytes(x) for x in text.split(",") if x.strip()]


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
                   help="skip the pickle path above this size (slow; 0: never run it)")
    p.add_argument("--main-slices", default=",".join(str(s) for s in DEFAULT_MAIN_SLICES),
                   help="comma list of slice sizes of the raw sliced Allreduce in the main table")
    p.add_argument("--fake-node-size", type=int, default=0,
                   help="also time the shm path on fake nodes of this many ranks, node sums "
                        "allreduced by all slice owners (ownK) and by node leaders only (leadK)")
    p.add_argument("--sweep-sizes", default=",".join(str(s) for s in DEFAULT_SWEEP_SIZES),
                   help="comma list of sizes for the slice sweep ('' to skip)")
    p.add_argument("--slices", default=",".join(str(s) for s in DEFAULT_SLICES),
                   help="comma list of slice sizes; 0 = unsliced")
    p.add_argument("--chunk-sweep-sizes", default=",".join(str(s) for s in DEFAULT_CHUNK_SWEEP_SIZES),
                   help="comma list of sizes for the shm chunk sweep ('' to skip)")
    p.add_argument("--chunks", default=",".join(str(s) for s in DEFAULT_CHUNKS),
                   help="comma list of chunk sizes of the shm path")
    p.add_argument("--no-main", action="store_true", help="only the sweeps")
    p.add_argument("--json", type=Path, default=None, help="also write raw numbers here")
    args = p.parse_args(argv)

    mpi = MPI.COMM_WORLD.Dup()
    n, rank = mpi.Get_size(), mpi.Get_rank()
    dtype = np.dtype(args.dtype)
    comms = {mode: Comm(averaging=mode) for mode in ("mpi", "shm", "auto")}
    fake = args.fake_node_size
    if fake:
        for inter in ("owners", "leaders"):
            c = comms[f"{ {'owners': 'own', 'leaders': 'lead'}[inter]}{fake}"] = Comm(averaging="shm")
            c.averager = ShmAverager(c.mpi, ranks_per_node=fake, inter=inter)
    say = print if rank == 0 else (lambda *a, **k: None)
    busfactor = 2 * (n - 1) / n

    sanity_check(mpi, comms, dtype)
    t_start = time.perf_counter()

    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.factor
    main_slices = byte_list(args.main_slices)

    say(f"# hpcopt allreduce benchmark: {n} rank(s), {dtype.name}, "
        f"{mpi_library()}, mpi4py {__import__('mpi4py').__version__}")
    load_start = os.getloadavg()
    shm = comms["shm"].averager
    say(f"# host {platform.node()}, {os.cpu_count()} cpu(s), load average {load_start[0]:.2f} at start; "
        f"Comm.slice_bytes = {fmt_bytes(comms['mpi'].slice_bytes)}; times = median over reps of max over ranks")
    xcore = cross_core_bandwidth(mpi)
    if xcore[1] > 0:
        say(f"# hand-off through a shared window (rank 0 writes 1 MB, a rank reads it): {xcore[0]:.1f} GB/s "
            f"read by rank 0 itself, {xcore[1]:.1f} GB/s by rank 1 (cross-core)")
    say(f"# shm path: {shm.nodes} node(s) of {shm.min_node_size}..{shm.max_node_size} rank(s), "
        f"chunks of {fmt_bytes(SHM_CHUNK_BYTES)}; auto takes it from {fmt_bytes(SHM_AVERAGE_MIN_BYTES)} up"
        + (f"; fake nodes of {fake} rank(s) for own{fake}/lead{fake}" if fake else ""))

    results: list[dict] = []
    checks: list[str] = []
    crossover = None
    if not args.no_main:
        extra = [f"own{fake}", f"lead{fake}"] if fake else []
        bw_names = ["copy1", "copyN", "raw", "sl*", "mpi", "shm", "auto", *extra, "pickle"]
        say("")
        say("# algbw GB/s per case (sl* = best sliced raw Allreduce: its slice size follows);"
            " x = paired speed-up;")
        say("# xcore = cross-core hand-off GB/s through a shared window, measured right after the row")
        say(f"{'size':>9} {'reps':>4} | " + " ".join(f"{nm:>7}" for nm in bw_names) + f" {'sl*':>5} |"
            f" {'shm/raw':>7} {'shm/sl*':>7} {'shm/cp1':>7} {'auto/bp':>7} {'auto/mpi':>8}"
            + (f" {'own/lead':>8}" if fake else "") + f" {'xcore':>6}")
        for nbytes in sizes:
            length = nbytes // dtype.itemsize
            rng = np.random.default_rng(rank)
            buf = rng.random(length, dtype=dtype)  # one buffer for every averaging case
            src, dst = aligned_empty(length, dtype), aligned_empty(length, dtype)
            src[:] = buf
            dst[:] = 0  # touch every page before timing
            cases = {"copy1": make_copy(rank, src, dst, False), "copyN": make_copy(rank, src, dst, True),
                     "raw": make_raw(mpi, buf)}
            sliced_names = []
            for sl in main_slices:
                if 0 < sl < nbytes:
                    sliced_names.append(f"sl{fmt_bytes(sl).replace(' ', '')}")
                    cases[sliced_names[-1]] = make_sliced_average(mpi, buf, sl)
            for name, comm in comms.items():
                cases[name] = make_average(comm, buf)
            pickled = nbytes <= args.pickle_max_bytes
            if pickled:
                tensors = [rng.random(k, dtype=dtype) for k in mlp_layout(length)]
                cases["pickle"] = make_pickle(mpi, tensors)
            times = run_interleaved(Timer(mpi), cases, args.reps, args.warmup,
                                    args.budget, args.min_reps, args.max_reps)
            reps = len(times["raw"])
            med = {k: float(np.median(v)) for k, v in times.items()}
            best_sliced = min(sliced_names, key=med.get) if sliced_names else "raw"
            best_plain = min([*PLAIN, *sliced_names], key=med.get)
            ratios = {"shm/raw": paired(times, "raw", "shm"), "shm/sliced": paired(times, best_sliced, "shm"),
                      "shm/copy1": paired(times, "copy1", "shm"),
                      "shm/best_plain": paired(times, best_plain, "shm"),
                      "auto/best_plain": paired(times, best_plain, "auto"),
                      "auto/mpi": paired(times, "mpi", "auto")}
            if fake:
                ratios["own/lead"] = paired(times, f"lead{fake}", f"own{fake}")
            row = {"bytes": nbytes, "reps": reps, "median_s": med, "best_sliced": best_sliced,
                   "best_plain": best_plain, "ratios": ratios,
                   "all_s": {k: v.tolist() for k, v in times.items()},
                   "n_tensors_pickle": len(mlp_layout(length)) if pickled else None}
            row["handoff_gbps_after"] = cross_core_bandwidth(mpi, reps=3)
            results.append(row)
            gb = {k: nbytes / t / 1e9 for k, t in med.items()}
            gb["sl*"] = gb[best_sliced] if sliced_names else float("nan")
            cells = [f"{gb[nm]:7.2f}" if nm in gb and not np.isnan(gb[nm]) else f"{'-':>7}" for nm in bw_names]
            slname = best_sliced[2:] if sliced_names else "-"
            say(f"{fmt_bytes(nbytes):>9} {reps:>4} | " + " ".join(cells) + f" {slname:>5} |"
                f" {ratios['shm/raw']:6.2f}x {ratios['shm/sliced']:6.2f}x {ratios['shm/copy1']:6.2f}x"
                f" {ratios['auto/best_plain']:6.2f}x {ratios['auto/mpi']:7.2f}x" + (f" {ratios['own/lead']:7.2f}x" if fake else "")
                + f" {row['handoff_gbps_after'][1]:6.1f}", flush=True)
            del buf, src, dst, cases
        if args.pickle_max_bytes <= 0:
            say("# pickle path not run (--pickle-max-bytes 0)")
        elif any(r["bytes"] > args.pickle_max_bytes for r in results):
            say(f"# pickle path skipped above {fmt_bytes(args.pickle_max_bytes)} (--pickle-max-bytes)")

        # Crossover: the smallest size from which shm beats the best plain Allreduce at every size.
        faster = [r["ratios"]["shm/best_plain"] > 1.0 for r in results]
        for i in range(len(results)):
            if all(faster[i:]):
                crossover = results[i]["bytes"]
                break
        say(f"# crossover: shm faster than the best plain Allreduce from "
            f"{fmt_bytes(crossover) if crossover else 'no size'} up (shm/best-plain: "
            + ", ".join(f"{fmt_bytes(r['bytes'])} {r['ratios']['shm/best_plain']:.2f}" for r in results)
            + f"); hpcopt's SHM_AVERAGE_MIN_BYTES = {fmt_bytes(SHM_AVERAGE_MIN_BYTES)}")
        for r in results:
            ok = r["ratios"]["auto/best_plain"] >= 0.95
            if not ok or r["bytes"] in TARGET_SIZES:
                checks.append(f"{fmt_bytes(r['bytes'])}: auto {r['ratios']['auto/best_plain']:.2f}x best plain "
                              f"({r['best_plain']}) {'>=' if ok else '<'} 0.95 {'ok' if ok else 'MISSED'}"
                              f" (auto {r['ratios']['auto/mpi']:.2f}x Comm mpi)")
            if r["bytes"] in TARGET_SIZES and n == 2:
                for key, goal in (("shm/raw", 2.0), ("shm/sliced", 1.3), ("shm/copy1", 0.5)):
                    got = r["ratios"][key]
                    checks.append(f"{fmt_bytes(r['bytes'])}: {key} {got:.2f}x (goal {goal}x) "
                                  f"{'ok' if got >= goal else 'MISSED'}")
        if n != 2:
            checks.append("32/64 MB speed-up goals are for 2 ranks: not checked here")
        elif not any(r["bytes"] in TARGET_SIZES for r in results):
            checks.append("32/64 MB not in this run")
        say("# targets: " + "; ".join(checks))

    slices = byte_list(args.slices)
    sweep_sizes = [s for s in byte_list(args.sweep_sizes) if s <= args.max_bytes]
    sweep = []
    if sweep_sizes:
        say("")
        sweep = sweep_table(say, mpi, [
            "# slice sweep: raw sliced Allreduce (no scaling). Per cell: median us, busbw GB/s, and",
            "# rel = median over rounds of time / fastest slice size of that round (paired, so",
            "# robust to drift). * = lowest rel"], sweep_sizes, slices,
            lambda buf, sl: make_sliced(mpi, buf, sl), args, 3 * args.budget, busfactor)
    score, choice = geometric_choice(sweep, slices)
    if choice is not None:
        say("# rel, geometric mean over sweep sizes: "
            + ", ".join(f"{fmt_bytes(sl)} {score[sl]:.3f}" for sl in slices))
        say(f"# best slice size overall: {fmt_bytes(choice)} (hpcopt now uses {fmt_bytes(ALLREDUCE_SLICE_BYTES)})")

    chunks = byte_list(args.chunks)
    chunk_sizes = [s for s in byte_list(args.chunk_sweep_sizes) if s <= args.max_bytes]
    chunk_sweep = []
    averagers: dict[int, ShmAverager] = {}
    if chunk_sizes and chunks:
        averagers = {ch: ShmAverager(mpi, chunk_bytes=ch) for ch in chunks}
        say("")
        chunk_sweep = sweep_table(say, mpi, [
            "# chunk sweep: shm averaging (ShmAverager.average_) per chunk size. Per cell: median us,",
            "# busbw GB/s, paired rel as above. * = lowest rel"], chunk_sizes, chunks,
            lambda buf, ch: (lambda: averagers[ch].average_(buf)), args, 2 * args.budget, busfactor)
    chunk_score, chunk_choice = geometric_choice(chunk_sweep, chunks)
    if chunk_choice is not None:
        say("# rel, geometric mean over sweep sizes: "
            + ", ".join(f"{fmt_bytes(ch)} {chunk_score[ch]:.3f}" for ch in chunks))
        say(f"# best chunk size overall: {fmt_bytes(chunk_choice)} (hpcopt now uses {fmt_bytes(SHM_CHUNK_BYTES)})")

    load_end = os.getloadavg()
    say(f"# total {time.perf_counter() - t_start:.1f} s; load average {load_end[0]:.2f} at end "
        f"(above {n} means other work shared the cores: rerun)")
    if args.json is not None and rank == 0:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "ranks": n, "dtype": dtype.name, "mpi": mpi_library(),
            "mpi4py": __import__("mpi4py").__version__, "host": platform.node(), "cpus": os.cpu_count(),
            "loadavg_start": load_start, "loadavg_end": load_end,
            "handoff_gbps": {"local": xcore[0], "cross_core": xcore[1]},
            "hpcopt_slice_bytes": ALLREDUCE_SLICE_BYTES, "shm_chunk_bytes": SHM_CHUNK_BYTES,
            "shm_average_min_bytes": SHM_AVERAGE_MIN_BYTES, "fake_node_size": fake,
            "timing": "median over reps of max over ranks", "pickle_max_bytes": args.pickle_max_bytes,
            "main": results, "crossover_bytes": crossover, "targets": checks,
            "slice_sweep": sweep, "slice_score": {str(k): v for k, v in score.items()},
            "best_slice_bytes": choice, "chunk_sweep": chunk_sweep,
            "chunk_score": {str(k): v for k, v in chunk_score.items()}, "best_chunk_bytes": chunk_choice,
        }, indent=1))
        say(f"# wrote {args.json}")
    for a in averagers.values():
        a.free()
    for c in comms.values():
        c.free()
    mpi.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
