"""Device buffers and MPI: straight through to a CUDA-aware MPI, or staged through host memory.

An MPI library that is not CUDA-aware treats a device address as a host address and crashes
(or, worse, reads garbage), and no library says reliably whether it is CUDA-aware. The path
for device buffers is chosen once per process and backend (``transport_for``):

1. ``HPCOPT_GPU_AWARE_MPI=1`` (straight through) or ``=0`` (staged), if the user set it;
2. otherwise ``MPIX_Query_cuda_support()`` in the MPI library mpi4py loaded (MPICH, Open MPI):
   1 means straight through, 0 staged;
3. a library without that query: staged (always correct, only slower).

With ``HPCOPT_GPU_SELFTEST=1`` a straight-through choice is first checked by
``hpcopt.comm.gpu_selftest`` in a child process (a device-buffer ``Allreduce`` and ``Sendrecv``), so
a wrong override ends the run with a ``HpcoptError`` naming the cause instead of a segmentation
fault in the middle of training.

Staging (``DeviceTransport`` with ``staged``): a collective on a device buffer copies it into a
pinned host buffer, runs MPI on that, and copies the result back: one copy each way per call,
through one host buffer per (length, dtype), allocated on first use and reused by every later
round. Non-blocking sends and receives take pinned buffers from a pool; ``Comm.waitall``
returns them (after copying a received message to the device). Host (NumPy) buffers always go
to MPI directly. The caller synchronizes the device stream before any of this.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from ..backend import Backend, get_backend
from ..child import child_environment, run_module
from ..errors import HpcoptError
from .mpi_support import cuda_aware_mpi, singleton_environment

if TYPE_CHECKING:  # core.py imports this module
    from .core import Comm

AWARE_VARIABLE = "HPCOPT_GPU_AWARE_MPI"
SELFTEST_VARIABLE = "HPCOPT_GPU_SELFTEST"

#: Seconds the self-test may take (start-up of Python, MPI and CUDA included).
SELFTEST_TIMEOUT = 120.0

SelfTest = Callable[[int], "str | None"]


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool | None:
    """The 0/1 variable ``name``: True, False, or None when unset or empty (HpcoptError otherwise)."""
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return None
    if text not in ("0", "1"):
        raise HpcoptError(f"{name} must be 0 or 1, got {text!r}")
    return text == "1"


@dataclass(frozen=True)
class PathChoice:
    """How device buffers reach MPI, and why."""

    staged: bool
    why: str

    def describe(self) -> str:
        path = "staged through pinned host memory" if self.staged else "passed straight to MPI"
        return f"{path}: {self.why}"


def choose_path(query: bool | None, query_why: str, override: bool | None) -> PathChoice:
    """The decision rule of the module docstring: the override, else the library's answer,
    else staging."""
    if override is not None:
        return PathChoice(not override, f"{AWARE_VARIABLE}={int(override)}")
    if query is None:
        return PathChoice(True, f"{query_why}; set {AWARE_VARIABLE}=1 if it is CUDA-aware")
    return PathChoice(not query, query_why)


def run_selftest(device: int, memory: str = "cuda", timeout: float = SELFTEST_TIMEOUT) -> str | None:
    """Run ``hpcopt.comm.gpu_selftest`` on ``device`` in a child process that initializes MPI on its
    own (it reads no config: no algorithm registered here is named to it); None when it passed,
    else what went wrong (one line)."""
    result = run_module("hpcopt.comm.gpu_selftest", ["--device", str(device), "--memory", memory],
                        timeout, child_environment(singleton_environment()))
    if result.ok:
        return None
    if result.signal:
        return f"crashed the test process ({result.signal})"
    if result.returncode is None:
        return result.message
    detail = f": {result.message}" if result.message else ""
    return f"failed (exit status {result.returncode}){detail}"


class DeviceTransport:
    """Hands a backend's device buffers to MPI, straight through or staged (module docstring).

    ``counts`` tells what staging did: host buffers allocated, copies to the host and back.
    """

    def __init__(self, backend: Backend, choice: PathChoice) -> None:
        self.backend, self.choice = backend, choice
        self.counts = {"allocations": 0, "to_host": 0, "to_device": 0}
        self._collective: dict[tuple[int, str], np.ndarray] = {}
        self._pool: dict[tuple[int, str], list[np.ndarray]] = {}
        self._pending: dict[int, tuple[MPI.Request, np.ndarray, Any]] = {}

    @property
    def staged(self) -> bool:
        return self.choice.staged

    def _allocate(self, buf: Any) -> np.ndarray:
        self.counts["allocations"] += 1
        return self.backend.empty_pinned(buf.size, buf.dtype)

    def _to_host(self, buf: Any, host: np.ndarray) -> np.ndarray:
        self.counts["to_host"] += 1
        return self.backend.copy_to_host_(buf, host)

    def _to_device(self, buf: Any, host: np.ndarray) -> None:
        self.counts["to_device"] += 1
        self.backend.copy_from_host_(buf, host)

    @contextmanager
    def inplace(self, buf: Any, send: bool = True, receive: bool = True) -> Iterator[Any]:
        """The buffer an in-place MPI operation on ``buf`` should use: ``buf`` itself, or (staged)
        the host buffer of its length and dtype, filled from ``buf`` when ``send`` and copied
        back into ``buf`` afterwards when ``receive``."""
        if not self.staged:
            yield buf
            return
        key = (buf.size, buf.dtype.str)
        host = self._collective.get(key)
        if host is None:
            host = self._collective[key] = self._allocate(buf)
        if send:
            self._to_host(buf, host)
        yield host
        if receive:
            self._to_device(buf, host)

    def _checkout(self, buf: Any) -> np.ndarray:
        free = self._pool.get((buf.size, buf.dtype.str))
        return free.pop() if free else self._allocate(buf)

    def isend(self, mpi: MPI.Comm, buf: Any, dest: int, tag: int) -> MPI.Request:
        """``Isend`` of a device buffer (staged: of a host copy, kept until ``complete``)."""
        if not self.staged:
            return mpi.Isend(buf, dest=dest, tag=tag)
        host = self._to_host(buf, self._checkout(buf))
        request = mpi.Isend(host, dest=dest, tag=tag)
        self._pending[id(request)] = (request, host, None)
        return request

    def irecv(self, mpi: MPI.Comm, buf: Any, source: int, tag: int) -> MPI.Request:
        """``Irecv`` into a device buffer (staged: into a host buffer, copied over by ``complete``)."""
        if not self.staged:
            return mpi.Irecv(buf, source=source, tag=tag)
        host = self._checkout(buf)
        request = mpi.Irecv(host, source=source, tag=tag)
        self._pending[id(request)] = (request, host, buf)
        return request

    def complete(self, requests: Sequence[MPI.Request]) -> None:
        """After the requests finished: copy staged receives to their device buffers and return
        the host buffers to the pool."""
        for request in requests:
            entry = self._pending.pop(id(request), None)
            if entry is None:
                continue
            _, host, target = entry
            if target is not None:
                self._to_device(target, host)
            self._pool.setdefault((host.size, host.dtype.str), []).append(host)


HOST_PATH = PathChoice(False, "host memory")


def transport_for(backend: Backend, environ: Mapping[str, str] | None = None,
                  selftest: SelfTest | None = None) -> DeviceTransport:
    """Decide how ``backend``'s buffers reach MPI (the module docstring's rules); HpcoptError for
    a malformed variable, or when the self-test refutes a straight-through choice."""
    if not backend.is_gpu:
        return DeviceTransport(backend, HOST_PATH)
    override = env_flag(AWARE_VARIABLE, environ)
    query, query_why = cuda_aware_mpi() if override is None else (None, "")
    choice = choose_path(query, query_why, override)
    if not choice.staged and env_flag(SELFTEST_VARIABLE, environ):
        failure = (selftest or run_selftest)(backend.device)
        if failure is not None:
            raise HpcoptError(
                f"{choice.why} says MPI can read GPU memory, but the self-test "
                f"({SELFTEST_VARIABLE}=1) refutes it: MPI on device buffers {failure}. "
                f"This MPI is not CUDA-aware here: set {AWARE_VARIABLE}=0 to stage through host memory")
        choice = PathChoice(False, f"{choice.why}; self-test passed")
    return DeviceTransport(backend, choice)


def gpu_report(local_rank: int, environ: Mapping[str, str] | None = None,
               selftest: SelfTest | None = None) -> tuple[str, str]:
    """For ``hpcopt info``: (which GPU this rank would use, or why none; how device buffers
    would reach MPI and why, with the self-test's verdict when ``HPCOPT_GPU_SELFTEST=1``)."""
    query, query_why = cuda_aware_mpi()
    choice = choose_path(query, query_why, env_flag(AWARE_VARIABLE, environ))
    try:
        backend = get_backend("gpu", local_rank)
    except HpcoptError as exc:
        return f"none: {exc}", choice.describe()
    count = backend.xp.cuda.runtime.getDeviceCount()
    gpu = f"device {backend.device} of {count} (node-local rank {local_rank})"
    if not choice.staged and env_flag(SELFTEST_VARIABLE, environ):
        failure = (selftest or run_selftest)(backend.device)
        verdict = ("self-test passed" if failure is None else
                   f"SELF-TEST FAILED: MPI on device buffers {failure}; set {AWARE_VARIABLE}=0")
        choice = PathChoice(False, f"{choice.why}; {verdict}")
    return gpu, choice.describe()


def prepare_gpu(comm: Comm, local_rank: int) -> None:
    """Select this rank's GPU (by node-local rank) and decide how its buffers reach MPI, before
    anything touches the device (run inside ``agreed`` so every rank stops on a problem)."""
    comm.backend = get_backend("gpu", local_rank)
    comm.transport = transport_for(comm.backend)


__all__ = ["AWARE_VARIABLE", "SELFTEST_VARIABLE", "PathChoice", "choose_path", "env_flag",
           "run_selftest", "DeviceTransport", "transport_for", "gpu_report", "prepare_gpu", "HOST_PATH"]
