"""The CUDA-aware MPI self-test, run in a child process: ``python -m hpcopt.comm.gpu_selftest``.

It initializes MPI on its own (a singleton: ``hpcopt.comm.staging`` starts it without the launcher's
variables) and hands MPI a device buffer, the way ``Comm`` does on the straight-through path:
an ``Allreduce`` from one device buffer into another (a copy on one rank, which an MPI that
is not CUDA-aware performs with a plain ``memcpy`` on device addresses, and crashes) and a
``Sendrecv`` to itself. It prints ``ok`` and exits 0 when the values arrive intact. Running it
in a child keeps a segmentation fault away from the training process.

``--memory host`` and ``--memory invalid`` exercise the harness without a GPU: the buffers
expose ``__cuda_array_interface__`` over host memory (which MPI reads fine) or over an address
nobody may read (which crashes MPI like a device address does in a library that is not
CUDA-aware).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

VALUES = 8
INVALID_ADDRESS = 4096  # inside the never-mapped first pages of a process


class HostInterface:
    """A view of host memory that offers MPI only ``__cuda_array_interface__`` (at ``address``,
    normally that of ``owner``, which it keeps alive)."""

    def __init__(self, owner: np.ndarray, address: int) -> None:
        self.owner, self.address, self.size = owner, address, owner.size

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.size,), "typestr": "<f8", "data": (self.address, False),
                "version": 3, "strides": None, "stream": None}


def _buffers(memory: str, device: int) -> tuple[Any, Any, Any]:
    """(source, target, a function returning the target's values on the host)."""
    source_values = np.arange(1.0, VALUES + 1.0)
    if memory == "cuda":
        import cupy

        cupy.cuda.Device(device).use()
        source, target = cupy.asarray(source_values), cupy.zeros(VALUES)
        cupy.cuda.get_current_stream().synchronize()
        return source, target, lambda: cupy.asnumpy(target)
    host_source, host_target = source_values, np.zeros(VALUES)
    address = host_source.ctypes.data if memory == "host" else INVALID_ADDRESS
    return (HostInterface(host_source, address),
            HostInterface(host_target, host_target.ctypes.data), lambda: host_target.copy())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcopt.comm.gpu_selftest")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index")
    parser.add_argument("--memory", choices=("cuda", "host", "invalid"), default="cuda")
    args = parser.parse_args(argv)
    from mpi4py import MPI

    expected = np.arange(1.0, VALUES + 1.0)
    source, target, values = _buffers(args.memory, args.device)
    comm = MPI.COMM_SELF
    comm.Allreduce(source, target, op=MPI.SUM)
    if not np.array_equal(values(), expected):
        print(f"Allreduce delivered {values().tolist()}, expected {expected.tolist()}", file=sys.stderr)
        return 1
    _, target, values = _buffers(args.memory, args.device)
    comm.Sendrecv(source, dest=0, sendtag=7, recvbuf=target, source=0, recvtag=7)
    if not np.array_equal(values(), expected):
        print(f"Sendrecv delivered {values().tolist()}, expected {expected.tolist()}", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
