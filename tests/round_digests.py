"""Digests of the final state of a matrix of data-parallel configurations: the guard of a
refactor of the rounds. Record them with the code before the change, compare after::

    mpiexec -n 2 python -m tests.round_digests record digests.json
    mpiexec -n 2 python -m tests.round_digests compare digests.json

Every declared state field of every rank (``hpcopt.algorithms.state``: the model, per-rank
vectors, shared arrays, counters) is hashed, in float32 and float64 runs; any changed bit is
a difference. Float results depend on the machine's kernels as well as on the code (another
CPU's BLAS kernels and numpy SIMD loops round differently: docs/formats.md, "Across
machines"), so digests compare only with digests of the same kind of machine: the file's
entries are keyed by the world size and by ``machine()``, and one file serves 1 and 2 ranks
and several kinds of machine; a comparison on a kind of machine not recorded says so.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_info

from hpcopt import train
from hpcopt.algorithms import state as fields
from hpcopt.comm import Comm
from hpcopt.config import build_config

DILOCO = {"outer_optimizer": "nesterov", "outer_lr": "0.7", "outer_momentum": "0.9",
          "inner_optimizer": "adamw", "lr": "0.01"}
#: name -> [algorithm] and run overrides; each one a configuration users have today
MATRIX: dict[str, dict[str, str]] = {
    "prsgd": {},
    "prsgd-momentum-nesterov": {"momentum": "0.9", "nesterov": "true", "weight_decay": "1e-3"},
    "prsgd-momentum-average": {"momentum": "0.9", "momentum_policy": "average"},
    "prsgd-momentum-reset-step": {"momentum": "0.5", "momentum_policy": "reset", "schedule": "step",
                                  "milestones": "6", "decay": "0.5"},
    "prsgd-sqrt-nt": {"schedule": "sqrt_nt", "lr": "1.0"},
    "prsgd-outer-sgd": {"outer_optimizer": "sgd", "outer_lr": "1.2", "outer_momentum": "0.5"},
    "prsgd-outer-sgd-plain": {"outer_optimizer": "sgd", "outer_lr": "0.9"},
    "prsgd-slowmo-adamw": {"outer_optimizer": "slowmo", "outer_lr": "0.9", "outer_momentum": "0.6",
                           "inner_optimizer": "adamw", "lr": "0.01", "momentum_policy": "average",
                           "second_moment_policy": "reset"},
    "diloco": {"algorithm": "diloco"},
    "diloco-partial": {"algorithm": "diloco", "steps": "9"},
    "slowmo": {"algorithm": "slowmo", "slow_momentum": "0.6", "slow_lr": "0.9"},
    "prsgd-local-steps": {**DILOCO, "local_steps": "RANKS", "interval": "3", "steps": "12"},
    "prsgd-wire-bfloat16": {"wire": "bfloat16"},
    "prsgd-wire-int8-nesterov": {**DILOCO, "wire": "int8"},
    "prsgd-groups": {"group_size": "1", "group_interval": "2", "momentum": "0.9"},
    "prsgd-groups-node": {"group_size": "node", "group_interval": "2", **DILOCO},
    "prsgd-interval-1": {"interval": "1"},
    "stream-diloco": {**DILOCO, "fragments": "3", "overlap": "1", "interval": "6"},
    "stream-mix": {"fragments": "2", "fragment_mix": "0.5", "momentum": "0.9", "steps": "13"},
    "stream-slowmo": {"algorithm": "slowmo", "slow_momentum": "0.6", "slow_lr": "0.9",
                      "fragments": "4", "overlap": "3", "fragment_mix": "0.7", "schedule": "step",
                      "milestones": "7", "decay": "0.5", "steps": "15"},
    "stream-outer-sgd": {"outer_optimizer": "sgd", "outer_lr": "1.1", "outer_momentum": "0.5",
                         "overlap": "2", "steps": "11"},
    "celgc": {"algorithm": "celgc", "gamma": "0.05", "momentum": "0.9"},
    "celgc-diloco": {"algorithm": "celgc", "gamma": "0.004", **DILOCO},
    "celgc-participation": {"algorithm": "celgc", "gamma": "0.05", "participation": "0.5",
                            "momentum": "0.9", "momentum_policy": "average"},
    "celgc-global": {"algorithm": "celgc", "gamma": "0.05", "clip_norm": "global"},
    "naive-clip": {"algorithm": "naive_clip", "gamma": "0.05", "inner_optimizer": "adamw",
                   "lr": "0.01"},
    "prsgd-muon": {"inner_optimizer": "muon", "momentum": "0.9", "nesterov": "true",
                   "weight_decay": "1e-3", "lr": "0.02"},
    "prsgd-fedadam": {"outer_optimizer": "fedadam", "outer_lr": "2", "inner_optimizer": "adamw",
                      "lr": "0.01", "second_moment_policy": "reset"},
    "float32-diloco": {**DILOCO, "dtype": "float32"},
    "float32-stream": {"fragments": "2", "overlap": "1", "dtype": "float32", **DILOCO},
}


def config_of(name: str, size: int):
    base = dict(dataset="digits", hidden="12", batch_size="8", steps="14", dtype="float64",
                lr="0.1", interval="4", progress="false", seed="3")
    base.update(MATRIX[name])
    if base.get("algorithm") == "naive_clip":
        del base["interval"]
    if base.get("local_steps") == "RANKS":
        base["local_steps"] = ",".join(str(2 + r % 3) for r in range(size))
    return build_config(None, base)


def digest(state) -> dict[str, str]:
    """Field name -> sha256 of its bytes (a number: of its repr), over every declared field
    but scratch."""
    kinds = (fields.MODEL, fields.VECTOR, fields.SHARED, fields.COUNTER, fields.SCALAR, fields.FLAG)
    found = {}
    for name in fields.fields_of(state, *kinds):
        value = getattr(state, name)
        if value is None:
            continue
        data = np.asarray(value).tobytes() if hasattr(value, "dtype") else repr(value).encode()
        found[name] = hashlib.sha256(data).hexdigest()[:16]
    return found


def machine() -> str:
    """What decides the float results besides the code: numpy's version and SIMD loops, each
    BLAS with its version and the kernels it picked for this CPU."""
    from numpy._core._multiarray_umath import (  # what numpy.show_runtime reads
        __cpu_dispatch__,
        __cpu_features__,
    )

    simd = ",".join(name for name in __cpu_dispatch__ if __cpu_features__[name])
    blas = [f"{lib.get('internal_api')} {lib.get('version')} {lib.get('architecture')}"
            for lib in threadpool_info() if lib.get("user_api") == "blas"]
    return f"numpy {np.__version__} [{simd}], {', '.join(blas) or 'no BLAS found'}"


def run_matrix(comm: Comm) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    for name in MATRIX:
        _, state = train(config_of(name, comm.size), comm, verbose=False)
        results[name] = {"ranks": comm.mpi.gather(digest(state), root=0)}
    return results


def main(argv: list[str]) -> int:
    mode, path = argv
    comm = Comm(MPI.COMM_WORLD)
    results = run_matrix(comm)
    if comm.rank != 0:
        return 0
    file = Path(path)
    key = f"{comm.size} ranks on {machine()}"
    if mode == "record":
        stored = json.loads(file.read_text()) if file.exists() else {}
        stored[key] = results
        file.write_text(json.dumps(stored, indent=1, sort_keys=True))
        print(f"recorded {len(results)} configurations at {key}")
        return 0
    stored = json.loads(file.read_text())
    if key not in stored:
        print(f"no digests for {key} in {file} (recorded: {'; '.join(stored) or 'none'}): record "
              "them here with the code before the change")
        return 1
    expected = stored[key]
    differ = [name for name in MATRIX if expected.get(name) != results[name]]
    missing = [name for name in MATRIX if name not in expected]
    for name in differ:
        print(f"DIFFERS {name}: {expected.get(name)} != {results[name]}")
    print(f"{len(MATRIX) - len(differ)} of {len(MATRIX)} configurations bitwise equal at {key}"
          f"{f' ({len(missing)} not recorded)' if missing else ''}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
