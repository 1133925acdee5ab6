"""GPU benchmark: MLP training-step throughput on GPU against CPU, and averaging bandwidth on
device buffers against the same bytes in host memory.

    python benchmarks/speed/gpu.py --part throughput --out DIR
    mpiexec -n 2 python benchmarks/speed/gpu.py --part averaging --out DIR
    python benchmarks/speed/gpu.py --part throughput --dry-run      # no GPU: checks the script only

throughput  PR-SGD local steps (minibatch gradient of the default MLP, 784-512-256-10, float32,
            on random data, plus the momentum update; no averaging) for each ``--batches`` size.
            The CPU uses every core of the node (BLAS threads). Each repetition times CPU and GPU
            once (order alternating), each for about ``--rep-seconds``, ending with a stream
            synchronization. Reported: median samples/s over repetitions and the paired ratio
            (median over repetitions of GPU rate / CPU rate).
averaging   ``Comm.average_`` of float32 buffers of ``--sizes`` bytes, every rank at once:
            ``host``      a NumPy buffer through the same sliced MPI Allreduce (the baseline),
            ``staged``    a CuPy buffer staged through pinned host memory (one copy each way),
            ``straight``  a CuPy buffer handed to MPI directly; only when hpcopt's rule says the
                          MPI is CUDA-aware (``HPCOPT_GPU_AWARE_MPI``, ``MPIX_Query_cuda_support``),
            ``copies``    the staging copies alone (device to pinned host and back, no MPI).
            In every repetition each case runs once, in a random order that is the same on every
            rank, after a barrier; a repetition's time is the slowest rank's. Reported: median
            time, bandwidth (bytes / time) and the paired ratio host time / case time (> 1:
            faster than host).

``--dry-run`` puts NumPy in CuPy's place (no GPU needed): the tables then compare the CPU with
itself and mean nothing; it only shows that the script runs. Results go to
``DIR/gpu-<part>.json`` and ``DIR/gpu-<part>.md`` (rank 0), and are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402
from hpcopt.algorithms.local_sgd import LocalSGD  # noqa: E402
from hpcopt.backend import CPU, Backend, get_backend  # noqa: E402
from hpcopt.comm import Comm, node_layout  # noqa: E402
from hpcopt.data.sampler import MinibatchSampler  # noqa: E402
from hpcopt.errors import HpcoptError  # noqa: E402
from hpcopt.comm.mpi_support import cuda_aware_mpi, mpi_library  # noqa: E402
from hpcopt.nn import mlp  # noqa: E402
from hpcopt.problems.classification import ClassificationProblem  # noqa: E402
from hpcopt.rng import stream  # noqa: E402
from hpcopt.comm.staging import (AWARE_VARIABLE, DeviceTransport, PathChoice, choose_path,  # noqa: E402
                            env_flag)
from hpcopt.run.threads import configure_threads  # noqa: E402

MB = 1 << 20
INPUTS, HIDDEN, CLASSES = 784, (512, 256), 10


# -- throughput ---------------------------------------------------------------------------------

def training_steps(backend: Backend, batch: int) -> Callable[[int], None]:
    """A function running k PR-SGD local steps of the MLP on ``backend`` (synchronized at the end)."""
    rng = np.random.default_rng(0)
    n = max(16 * batch, 4096)
    features = rng.random((n, INPUTS), dtype=np.float32)
    labels = rng.integers(0, CLASSES, n)
    model = mlp(INPUTS, HIDDEN, CLASSES)
    x0 = np.zeros(model.layout.size)
    model.init(x0, stream(0, "init"))
    problem = ClassificationProblem(model, backend.asarray(features), backend.asarray(labels),
                                    MinibatchSampler(np.arange(n), batch, 0, 0), backend)
    algorithm = LocalSGD(lr=0.01, interval=1 << 30, momentum=0.9)
    comm = Comm(MPI.COMM_SELF, backend=backend)
    state = algorithm.init(backend.asarray(x0, np.float32), comm)

    def run(steps: int) -> None:
        for _ in range(steps):
            algorithm.step(state, problem.oracle, comm)
        backend.synchronize()

    return run


def throughput(device: Backend, batches: list[int], reps: int, rep_seconds: float) -> dict[str, Any]:
    threads = configure_threads(1)
    rows = []
    for batch in batches:
        runners = {"cpu": training_steps(CPU, batch), "gpu": training_steps(device, batch)}
        steps = {}
        for name, run in runners.items():
            run(3)  # warm-up: allocations, kernels compiled and cached
            start = time.perf_counter()
            run(5)
            per_step = (time.perf_counter() - start) / 5
            steps[name] = int(min(2000, max(5, rep_seconds / per_step)))
        rates: dict[str, list[float]] = {"cpu": [], "gpu": []}
        for r in range(reps):
            for name in (("cpu", "gpu") if r % 2 == 0 else ("gpu", "cpu")):
                start = time.perf_counter()
                runners[name](steps[name])
                rates[name].append(steps[name] * batch / (time.perf_counter() - start))
        ratio = statistics.median(g / c for g, c in zip(rates["gpu"], rates["cpu"]))
        rows.append({"batch": batch, "steps": steps, "rates": rates, "gpu_over_cpu": ratio,
                     "cpu_samples_per_s": statistics.median(rates["cpu"]),
                     "gpu_samples_per_s": statistics.median(rates["gpu"])})
    layers = "-".join(map(str, (INPUTS, *HIDDEN, CLASSES)))
    return {"threads": threads.describe(), "model": f"mlp {layers} float32, momentum 0.9",
            "rows": rows}


def throughput_table(result: dict[str, Any]) -> list[str]:
    lines = [f"MLP training steps ({result['model']}); CPU: {result['threads']}", "",
             "| batch | CPU samples/s | GPU samples/s | GPU/CPU (paired median) |",
             "|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['batch']} | {row['cpu_samples_per_s']:,.0f} | "
                     f"{row['gpu_samples_per_s']:,.0f} | {row['gpu_over_cpu']:.2f} |")
    return lines


# -- averaging ------------------------------------------------------------------------------------

def averaging(device: Backend, sizes: list[int], budget: float, min_reps: int,
              max_reps: int) -> dict[str, Any]:
    query, why = cuda_aware_mpi()
    choice = choose_path(query, why, env_flag(AWARE_VARIABLE))
    host_comm = Comm(averaging="mpi")
    comms = {"staged": Comm(backend=device, averaging="mpi")}
    comms["staged"].transport = DeviceTransport(device, PathChoice(True, "benchmark"))
    if not choice.staged:
        comms["straight"] = Comm(backend=device, averaging="mpi")
        comms["straight"].transport = DeviceTransport(device, PathChoice(False, "benchmark"))
    mpi = host_comm.mpi
    rows = []
    for size in sizes:
        n = size // 4
        host = np.ones(n, dtype=np.float32)
        buffers = {name: device.xp.ones(n, dtype=np.float32) for name in comms}
        pinned = device.empty_pinned(n, np.float32)
        copy_source = device.xp.ones(n, dtype=np.float32)

        def copies() -> None:
            device.copy_to_host_(copy_source, pinned)
            device.copy_from_host_(copy_source, pinned)

        cases: dict[str, Callable[[], Any]] = {"host": lambda: host_comm.average_(host)}
        for name, comm in comms.items():
            cases[name] = (lambda c=comm, b=buffers[name]: (c.average_(b), device.synchronize()))
        cases["copies"] = copies
        names = list(cases)
        warm = []
        for name in names:  # warm-up: the staging buffers are allocated here
            cases[name]()
            start = time.perf_counter()
            cases[name]()
            warm.append(time.perf_counter() - start)
        slowest = mpi.allreduce(sum(warm), op=MPI.MAX)
        reps = int(max(min_reps, min(max_reps, budget / max(slowest, 1e-9))))
        times = np.zeros((reps, len(names)))
        for r in range(reps):
            for j in np.random.default_rng(r).permutation(len(names)):
                mpi.Barrier()
                start = time.perf_counter()
                cases[names[j]]()
                times[r, j] = time.perf_counter() - start
        mpi.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
        base = times[:, names.index("host")]
        row = {"bytes": size, "reps": reps, "cases": {}}
        for j, name in enumerate(names):
            median = float(np.median(times[:, j]))
            row["cases"][name] = {"median_s": median, "gb_per_s": size / median / 1e9,
                                  "host_over_case": float(np.median(base / times[:, j]))}
        rows.append(row)
    ranks = mpi.Get_size()
    for comm in (host_comm, *comms.values()):
        comm.free()
    return {"ranks": ranks, "ranks_per_node": node_layout(MPI.COMM_WORLD)[1],
            "path_rule": choice.describe(),
            "straight": ("measured" if not choice.staged
                         else "not measured (MPI not known to be CUDA-aware)"),
            "rows": rows}


def averaging_table(result: dict[str, Any]) -> list[str]:
    names = list(result["rows"][0]["cases"]) if result["rows"] else []
    lines = [f"Comm.average_ on {result['ranks']} rank(s), float32; device buffers by hpcopt's rule: "
             f"{result['path_rule']}; straight through: {result['straight']}", "",
             "| size | reps | " + " | ".join(f"{n} ms | {n} GB/s | host/{n}" for n in names) + " |",
             "|---|---|" + "---|---|---|" * len(names)]
    for row in result["rows"]:
        cells = []
        for name in names:
            case = row["cases"][name]
            cells.append(f"{case['median_s'] * 1e3:.3f} | {case['gb_per_s']:.2f} | "
                         f"{case['host_over_case']:.2f}")
        lines.append(f"| {row['bytes'] // MB} MB | {row['reps']} | " + " | ".join(cells) + " |")
    return lines


# -- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/speed/gpu.py", description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("throughput", "averaging"), required=True)
    parser.add_argument("--out", type=Path, help="directory for gpu-<part>.json and .md")
    parser.add_argument("--dry-run", action="store_true", help="NumPy in CuPy's place (no GPU)")
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256, 2048])
    parser.add_argument("--reps", type=int, default=5, help="throughput repetitions")
    parser.add_argument("--rep-seconds", type=float, default=0.4)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--budget", type=float, default=6.0, help="averaging seconds per size")
    parser.add_argument("--min-reps", type=int, default=5)
    parser.add_argument("--max-reps", type=int, default=50)
    args = parser.parse_args(argv)
    rank = MPI.COMM_WORLD.Get_rank()
    try:
        device = CPU if args.dry_run else get_backend("gpu", node_layout(MPI.COMM_WORLD)[0])
    except HpcoptError as exc:
        if rank == 0:
            print(f"benchmarks/speed/gpu.py: {exc}", file=sys.stderr)
        return 2
    if args.part == "throughput":
        if MPI.COMM_WORLD.Get_size() != 1:
            raise SystemExit("benchmarks/speed/gpu.py: --part throughput runs on one rank")
        result, table = throughput(device, args.batches, args.reps, args.rep_seconds), throughput_table
    else:
        result, table = averaging(device, [s * MB for s in args.sizes_mb], args.budget,
                                  args.min_reps, args.max_reps), averaging_table
    if rank != 0:
        return 0
    gpu_name = "none (dry run: NumPy stands in for CuPy)"
    if device.is_gpu:
        properties = device.xp.cuda.runtime.getDeviceProperties(device.device)
        name = properties["name"]
        gpu_name = name.decode() if isinstance(name, bytes) else str(name)
    result.update(part=args.part, dry_run=args.dry_run, gpu=gpu_name,
                  mpi=mpi_library(),
                  created=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    dry = "  (DRY RUN: numbers mean nothing)" if args.dry_run else ""
    lines = [f"# benchmarks/speed/gpu.py --part {args.part}{dry}",
             f"GPU: {gpu_name}; MPI: {result['mpi']}; {result['created']}", "", *table(result)]
    print("\n".join(lines), flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"gpu-{args.part}.json").write_text(json.dumps(result, indent=1))
        (args.out / f"gpu-{args.part}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
