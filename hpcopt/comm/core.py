"""The one object that moves bytes between ranks, and counts every call, byte and second.

``Comm`` wraps a ``Dup()`` of a communicator (COMM_WORLD by default) so hpcopt's traffic never
mixes with the user's. Every operation takes a ``label`` (what the traffic is for: "average",
"eval", ...) and ``comm.stats`` holds calls, bytes and seconds per (operation, label). There is
no attribute pass-through: the raw communicator is ``comm.mpi``, so uncounted traffic is easy
to find. A trailing ``_`` means the buffer is updated in place.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

from ..backend import CPU, Backend
from ..errors import HpcoptError
from .progress import MPICH_ASYNC, CommThread, Posted, hidden_fraction
from .progress import describe as describe_progress
from .shm import SHM_AVERAGE_MIN_BYTES, ShmAverager, shm_supported
from .staging import DeviceTransport, transport_for

T = TypeVar("T")

#: Largest piece handed to one MPI_Allreduce by ``average_``/``allreduce_``, in bytes.
#: MPICH's single Allreduce loses bandwidth above ~16 MB on shared memory (2-3x slower at
#: 32-64 MB); slices keep it near its peak. Measured with benchmarks/speed/allreduce.py (slice sweep,
#: 2 ranks, one per core): 2 MB best, 1 and 4 MB within 5-8%, unsliced 2x slower.
ALLREDUCE_SLICE_BYTES = 2 << 20

#: How ``Comm.average_`` averages: "mpi" (sliced MPI Allreduce), "shm" (node-local shared
#: memory + inter-node allreduce, hpcopt/comm/shm.py) or "auto" (shm from
#: SHM_AVERAGE_MIN_BYTES up when every node holds several ranks, else mpi).
AVERAGING_MODES = ("auto", "mpi", "shm")

#: The counter of a non-blocking reduction's seconds in flight, from its post to its completion
#: (``Comm.complete``; no calls, no bytes: those are its operation's). They overlap computation,
#: so ``CommStats.totals`` and the trace leave them out of the seconds spent communicating.
IN_FLIGHT = "in_flight"
#: The counter of a reduction's own seconds in MPI, from its post to its completion, where the
#: communication thread measures them (``--comm-progress comm-thread``; no calls, no bytes); with
#: the seconds held, the fraction of it hidden (``hpcopt.comm.progress.hidden_fraction``).
OWN = "own"
#: The label of the group averages of two-level rounds (``hpcopt.algorithms.groups``), which a
#: run's summary reports on a line of their own.
GROUP_LABEL = "group_average"
#: The counters whose seconds overlap computation: no rank spent them communicating.
UNSPENT = (IN_FLIGHT, OWN)

#: ``Comm._groups``' keys of the node's Comm (``Comm.node_group``) and the leaders' (``Comm.node_leaders``).
NODE = "node"
LEADERS = "leaders"
#: ``Comm._groups``' key of the rails' Comm (``Comm.node_rails``).
RAILS = "rails"


@dataclass
class OpCounter:
    """Calls, payload bytes and wall seconds of one (operation, label) pair; of its calls and
    bytes, those on a communicator within one node (``Comm.in_node``: shared memory, no network)."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0
    in_node_calls: int = 0
    in_node_bytes: int = 0

    @property
    def across_bytes(self) -> int:
        """The bytes of calls on communicators that span nodes."""
        return self.bytes - self.in_node_bytes


@dataclass
class CommStats:
    """Counters per (operation, label); ``totals()`` sums them over operations or labels."""

    counters: dict[tuple[str, str], OpCounter] = field(default_factory=dict)
    #: Delay mode (``--network-delay``): seconds to sleep after each call, from (op, bytes,
    #: the ranks it spans, 0 = the world's); the sleep counts in the call's seconds, so the run
    #: shows the modelled network live.
    delay: Callable[[str, int, int], float] | None = None
    #: label -> the ranks its calls span, for the labels of a group's calls (``Comm.group``);
    #: every other label spans the world. The cost model reads it; ``reset`` keeps it.
    ranks: dict[str, int] = field(default_factory=dict)
    #: label -> how many communicators carry its calls at once through each node's link, for
    #: the labels of the rails' calls (``Comm.node_rails``: K rails share one link); every other
    #: label has one. The cost model reads it; ``reset`` keeps it.
    rails: dict[str, int] = field(default_factory=dict)
    #: With ``--timeline``: told (op, label, seconds) of each call once it is counted, the call
    #: having ended just now (``hpcopt.run.recorder.Recorder.communicated``); not of the seconds
    #: in flight (IN_FLIGHT), which overlap the computation.
    spans: Callable[[str, str, float], None] | None = None

    def record(self, op: str, label: str, nbytes: int, seconds: float, in_node: bool = False) -> None:
        """One call; ``in_node``: on a communicator within one node."""
        if self.delay is not None:
            extra = self.delay(op, nbytes * self.rails.get(label, 1), self.ranks.get(label, 0))
            if extra > 0:
                time.sleep(extra)
                seconds += extra
        self._add(op, label, 1, nbytes, seconds, in_node)

    def record_overlapped(self, op: str, label: str, nbytes: int, held: float, hidden: float,
                          in_node: bool = False) -> None:
        """One completed non-blocking call: ``held`` seconds this rank spent in its post and
        its wait, ``hidden`` the seconds between them (computation it overlapped); its seconds
        in flight (both) go to (IN_FLIGHT, label). Delay mode sleeps the modelled seconds that
        ``hidden`` does not cover."""
        if self.delay is not None:
            extra = self.delay(op, nbytes, self.ranks.get(label, 0)) - hidden
            if extra > 0:
                time.sleep(extra)
                held += extra
        self._add(op, label, 1, nbytes, held, in_node)
        self._add(IN_FLIGHT, label, 0, 0, held + hidden, in_node)

    def record_own(self, label: str, seconds: float, in_node: bool = False) -> None:
        """A completed reduction's own seconds in MPI (under (OWN, label))."""
        self._add(OWN, label, 0, 0, seconds, in_node)

    def _add(self, op: str, label: str, calls: int, nbytes: int, seconds: float, in_node: bool) -> None:
        counter = self.counters.get((op, label))
        if counter is None:
            counter = self.counters[(op, label)] = OpCounter()
        counter.calls += calls
        counter.bytes += nbytes
        counter.seconds += seconds
        if in_node:
            counter.in_node_calls += calls
            counter.in_node_bytes += nbytes
        if self.spans is not None and op not in UNSPENT:
            self.spans(op, label, seconds)

    def totals(self, label: str | None = None, op: str | None = None) -> OpCounter:
        """Sum over all counters matching ``label`` and ``op`` (None matches anything; its
        seconds leave out those in flight, IN_FLIGHT and OWN, unless ``op`` names it)."""
        total = OpCounter()
        for (o, lab), c in self.counters.items():
            if (label is None or lab == label) and (op is None or o == op):
                total.calls += c.calls
                total.bytes += c.bytes
                total.seconds += c.seconds if o not in UNSPENT or op == o else 0.0
                total.in_node_calls += c.in_node_calls
                total.in_node_bytes += c.in_node_bytes
        return total

    def labels(self) -> list[str]:
        return sorted({label for _, label in self.counters})

    def hidden_fraction(self) -> float:
        """Of the own seconds of the reductions the communication thread moved on (OWN), the
        fraction hidden: 1 - the seconds held in them / their own seconds (NaN: none yet)."""
        own = [(label, c.seconds) for (op, label), c in self.counters.items() if op == OWN]
        held = sum(self.counters[("iallreduce", label)].seconds for label, _ in own)
        return hidden_fraction(held, sum(seconds for _, seconds in own))

    def as_rows(self) -> list[tuple[str, str, int, int, float]]:
        """(op, label, calls, bytes, seconds) sorted by op and label."""
        return [(o, lab, c.calls, c.bytes, c.seconds) for (o, lab), c in sorted(self.counters.items())]

    def stored_rows(self) -> list[tuple[str, str, int, int, float, int, int]]:
        """``as_rows`` with each counter's in-node calls and bytes: what a checkpoint stores."""
        return [(o, lab, c.calls, c.bytes, c.seconds, c.in_node_calls, c.in_node_bytes)
                for (o, lab), c in sorted(self.counters.items())]

    def reset(self) -> None:
        self.counters.clear()


class Stages(Protocol):
    """A reduction made of several MPI calls, one in flight at a time (``node_reduce.RailsSum``):
    ``advance`` completes the call in flight and posts the next, ``Wait`` the rest."""

    nbytes: int

    def advance(self) -> None: ...

    def Wait(self) -> None: ...  # noqa: N802 - as MPI.Request's, which ``Comm.complete`` calls


#: Makes the ``Stages`` of a sum over ranks: (comm, send, recv, label) -> Stages.
StagesMaker = Callable[["Comm", np.ndarray, np.ndarray, str], Stages]


@dataclass
class Reduction:
    """A non-blocking allreduce in flight (``Comm.iallreduce``), to finish with ``Comm.complete``."""

    request: MPI.Request | Posted | Stages  # Posted: handed to the communication thread
    label: str
    nbytes: int
    posted: float        # time.perf_counter() when it was posted
    post_seconds: float  # how long posting it took


def _slices(n: int, itemsize: int, slice_bytes: int) -> Iterator[slice]:
    step = max(1, slice_bytes // itemsize)
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


class Comm:
    """Counted collectives and point-to-point calls on flat buffers.

    NumPy buffers go to MPI as they are. Device (CuPy) buffers go after a stream
    synchronization, straight through or staged via pinned host memory (``transport``,
    hpcopt/comm/staging.py); counters are the same on both paths and include the staging copies' time.
    """

    def __init__(self, mpi_comm: MPI.Comm | None = None, backend: Backend = CPU,
                 slice_bytes: int = ALLREDUCE_SLICE_BYTES, averaging: str = "auto") -> None:
        self.mpi: MPI.Comm = (mpi_comm if mpi_comm is not None else MPI.COMM_WORLD).Dup()
        self._rank, self._size = self.mpi.Get_rank(), self.mpi.Get_size()
        #: (this rank's rank on its node, the ranks on its node), in this communicator's order.
        self.node_place = node_layout(self.mpi)
        #: Whether every rank of this communicator is on this rank's node (the same answer on
        #: every rank): its calls' bytes never reach the network, and are counted as in-node.
        self.in_node = self.node_place[1] == self._size
        self._rails: int | None = None
        self.backend = backend
        self.slice_bytes = slice_bytes
        self.averaging = averaging
        #: The shared-memory averager, made on the first average_ that may use it (collective);
        #: tests may set one beforehand (e.g. ``ShmAverager(c.mpi, ranks_per_node=2)``).
        self.averager: ShmAverager | None = None
        self.stats = CommStats()
        #: How device (non-NumPy) buffers reach MPI (hpcopt/comm/staging.py): decided on first use
        #: for ``backend``, or set beforehand (``staging.prepare_gpu``, tests).
        self.transport: DeviceTransport | None = None
        self._scalar = np.zeros(1, dtype=np.float64)
        self._groups: dict[int | str, Comm | None] = {}
        #: The thread that moves ``iallreduce``'s reductions on (``start_comm_thread``), or None:
        #: MPI's own progress.
        self.comm_thread: CommThread | None = None

    def start_comm_thread(self) -> None:
        """Hand every later ``iallreduce`` to a communication thread of its own
        (``hpcopt.comm.progress``; collective, MPI_THREAD_MULTIPLE)."""
        if self.comm_thread is None:
            self.comm_thread = CommThread(self.mpi)

    def stop_comm_thread(self) -> None:
        """End the communication thread, if any (collective: its communicator is freed)."""
        if self.comm_thread is not None:
            self.comm_thread.free()
            self.comm_thread = None

    @property
    def averaging(self) -> str:
        """How ``average_`` averages: "auto", "mpi" or "shm" (``AVERAGING_MODES``)."""
        return self._averaging

    @averaging.setter
    def averaging(self, mode: str) -> None:
        if mode not in AVERAGING_MODES:
            raise ValueError(f"averaging must be one of {AVERAGING_MODES}, got {mode!r}")
        self._averaging = mode
        #: Smaller buffers take the plain path without asking ``_averager_for``: one comparison
        #: on the hot path of small averages.
        self._shm_from_bytes = (math.inf if mode == "mpi" or (mode == "auto" and self._size == 1)
                                else SHM_AVERAGE_MIN_BYTES if mode == "auto" else 0)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def group(self, size: int, label: str) -> Comm:
        """The Comm of this rank's group, for calls on ``label``: the ``size`` consecutive ranks
        with this rank's ``rank // size`` (``size`` must divide the world). Made on the first
        call (collective), freed with this Comm; it has this Comm's backend and averaging mode
        (so its shared-memory path stays within the group) and counts into this Comm's stats,
        where ``stats.ranks`` notes that ``label`` spans ``size`` ranks."""
        if size not in self._groups and (size < 1 or self._size % size):
            raise ValueError(f"a group of {size} ranks does not divide {self._size} ranks")
        group = self._sub(size, lambda: self.mpi.Split(self._rank // size, self._rank), label)
        assert group is not None
        return group

    def node_group(self, label: str) -> Comm:
        """The Comm of this rank's node (a shared-memory split, ranks in this Comm's order), for
        calls on ``label``; made, freed and counted as ``group``'s."""
        group = self._sub(NODE, lambda: self.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=self._rank), label)
        assert group is not None
        return group

    def node_leaders(self, label: str) -> Comm | None:
        """The Comm of the nodes' first ranks (one a node, in this Comm's order) on those ranks,
        None on the others, for calls on ``label``; made, freed and counted as ``group``'s."""
        def split() -> MPI.Comm:
            first = node_layout(self.mpi)[0] == 0
            return self.mpi.Split(0 if first else MPI.UNDEFINED, self._rank)
        return self._sub(LEADERS, split, label)

    def node_rails(self, label: str) -> Comm | None:
        """The Comm of rail s, the ranks that are rank s of their node (one a node, in this
        Comm's order), for s below K, the fewest ranks a node has (``rails``); None on the
        other ranks (a node's ranks from K up). Made, freed and counted as ``group``'s;
        ``stats.rails`` notes that K rails carry ``label`` at once, sharing each node's link
        (rail 0 holds ``node_leaders``' ranks)."""
        rails = self.rails()
        rail = self._sub(RAILS, lambda: self.mpi.Split(
            self.node_place[0] if self.node_place[0] < rails else MPI.UNDEFINED, self._rank), label)
        self.stats.rails[label] = rails
        return rail

    def rails(self) -> int:
        """K, the fewest ranks a node of this Comm has (collective on the first call)."""
        if self._rails is None:
            self._rails = int(self.mpi.allreduce(self.node_place[1], op=MPI.MIN))
        return self._rails

    def _record(self, op: str, label: str, nbytes: int, start: float) -> None:
        """One call of ``op`` on ``label`` begun at ``start`` (``time.perf_counter``), counted
        in-node where this communicator lies within one node."""
        self.stats.record(op, label, nbytes, time.perf_counter() - start, self.in_node)

    def _sub(self, key: int | str, split: Callable[[], MPI.Comm], label: str) -> Comm | None:
        """The sub-Comm cached under ``key``, made from the communicator ``split`` returns (None
        where it returns no communicator)."""
        if key not in self._groups:
            made = split()
            self._groups[key] = None if made == MPI.COMM_NULL else \
                Comm(made, self.backend, self.slice_bytes, self.averaging)
            if made != MPI.COMM_NULL:
                made.Free()
        group = self._groups[key]
        if group is None:
            return None
        group.backend, group.averaging = self.backend, self.averaging
        group.transport = self.transport  # device buffers reach MPI as they do here
        self.stats.ranks[label] = group.size
        group.stats = self.stats  # the same counters, whatever this Comm's stats are now
        return group

    def free(self) -> None:
        """Release the groups, the shared-memory averager and the duplicated communicator
        (idempotent)."""
        for group in self._groups.values():
            if group is not None:
                group.free()
        self._groups.clear()
        self.stop_comm_thread()
        if self.averager is not None:
            self.averager.free()
            self.averager = None
        if self.mpi != MPI.COMM_NULL:
            self.mpi.Free()

    # -- collectives on flat buffers -------------------------------------------------------

    def allreduce_(self, buf: Any, op: MPI.Op = MPI.SUM, label: str = "other") -> Any:
        """In-place allreduce of a contiguous buffer, issued in slices of at most ``slice_bytes``."""
        start = time.perf_counter()
        if isinstance(buf, np.ndarray):  # the common case first: it runs every few microseconds
            self._allreduce_sliced(buf, op)
        else:
            self.backend.synchronize()
            with self._transport().inplace(buf, True, True) as target:
                self._allreduce_sliced(target, op)
        self._record("allreduce", label, buf.nbytes, start)
        return buf

    def _allreduce_sliced(self, buf: Any, op: MPI.Op) -> None:
        if buf.nbytes <= self.slice_bytes:
            self.mpi.Allreduce(MPI.IN_PLACE, buf, op=op)
        else:
            flat = buf.reshape(-1)  # a view: slices of any-shaped contiguous buffers
            for s in _slices(flat.size, flat.itemsize, self.slice_bytes):
                self.mpi.Allreduce(MPI.IN_PLACE, flat[s], op=op)

    def average_(self, buf: Any, label: str = "average") -> Any:
        """``buf <- (1/N) sum_i buf_i`` in place: one counted allreduce and one in-place scale.

        Counted as one ("allreduce", label) call of ``buf.nbytes`` whichever path runs; every
        rank ends with bitwise identical values on both paths.
        """
        averager = None if buf.nbytes < self._shm_from_bytes else self._averager_for(buf)
        if averager is None:
            self.allreduce_(buf, MPI.SUM, label)
            if self._size > 1:
                buf /= self._size
            return buf
        start = time.perf_counter()
        self.backend.synchronize()
        averager.average_(buf)
        self._record("allreduce", label, buf.nbytes, start)
        return buf

    def node_average_(self, buf: Any, label: str) -> Any:
        """``buf <- `` the mean over this rank's node: ``node_group(label).average_(buf)``, the
        same bits and the same count, done in place in this Comm's shared-memory window where
        ``buf`` is an array ``shared_like`` handed out and the node's average takes the
        shared-memory path (no copy into the node's own window and back;
        ``ShmAverager.average_node_``). Collective over the node."""
        node = self.node_group(label)
        if self.averager is not None and node.averaging_path(buf) == "shm":
            start = time.perf_counter()
            if self.averager.average_node_(buf):
                node._record("allreduce", label, buf.nbytes, start)
                return buf
        return node.average_(buf, label)

    def averaging_path(self, buf: Any) -> str:
        """The path ``average_`` takes for ``buf``: "shm" or "mpi" (``--averaging auto``
        resolved; collective, the same answer on every rank)."""
        averager = None if buf.nbytes < self._shm_from_bytes else self._averager_for(buf)
        return "mpi" if averager is None else "shm"

    def _averager_for(self, buf: Any) -> ShmAverager | None:
        """The shared-memory averager if ``buf`` should take that path (same answer on all ranks)."""
        mode = self.averaging  # cheapest tests first: this runs before every small average_
        if mode == "mpi" or (mode == "auto" and buf.nbytes < SHM_AVERAGE_MIN_BYTES):
            return None
        if not shm_supported(buf) or (mode == "auto" and self.size == 1):
            return None
        if self.averager is None:
            self.averager = ShmAverager(self.mpi)
        if mode == "auto" and not self.averager.worthwhile:
            return None
        return self.averager

    def shared_like(self, x: Any) -> Any:
        """``x``'s values in a new array in node-shared memory when ``average_`` would take the
        shared-memory path for it and every node's shared-memory file system has room for it
        (``ShmAverager.has_room``), else ``x`` itself (collective; the same answer on every rank).

        ``average_`` of the returned array (that very object, the model's flat vector) then
        reduces it in place, with no copy into or out of a window (hpcopt/comm/shm.py,
        ``ShmAverager.shared_empty``); the result is bitwise the same. Its memory is released
        by ``free`` when nothing views it any more, else when the process ends.
        """
        averager = None if x.nbytes < self._shm_from_bytes else self._averager_for(x)
        if averager is None or not averager.in_place or not averager.has_room(x.nbytes):
            return x
        shared = averager.shared_empty(x.shape, x.dtype)
        np.copyto(shared, x)
        return shared

    def bcast_(self, buf: Any, root: int = 0, label: str = "bcast") -> Any:
        """Overwrite ``buf`` on every rank with root's copy."""
        start = time.perf_counter()
        self.backend.synchronize()
        root_rank = self.rank == root
        with self._mpi_buffer(buf, send=root_rank, receive=not root_rank) as target:
            self.mpi.Bcast(target, root=root)
        self._record("bcast", label, buf.nbytes, start)
        return buf

    def allreduce_scalar(self, value: float, op: MPI.Op = MPI.SUM, label: str = "scalar") -> float:
        """Reduce one float over ranks (through a preallocated float64 buffer)."""
        self._scalar[0] = value
        self.allreduce_(self._scalar, op, label)
        return float(self._scalar[0])

    def allreduce_host_(self, values: np.ndarray, op: MPI.Op = MPI.SUM, label: str = "scalar") -> np.ndarray:
        """Reduce a small host array of statistics in place (one call for many scalars)."""
        start = time.perf_counter()
        self.mpi.Allreduce(MPI.IN_PLACE, values, op=op)
        self._record("allreduce", label, values.nbytes, start)
        return values

    def allgather(self, values: np.ndarray, label: str) -> np.ndarray:
        """Every rank's small host vector ``values``, stacked (N, k) on every rank."""
        start = time.perf_counter()
        everyone = np.empty((self._size, values.size), dtype=values.dtype)
        self.mpi.Allgather(values, everyone)
        self._record("allgather", label, values.nbytes, start)
        return everyone

    def allgatherv(self, values: np.ndarray, counts: Sequence[int], label: str) -> np.ndarray:
        """Every rank's 1-D host array ``values`` (``counts[r]`` elements from rank r) concatenated
        in rank order on every rank; counted as an allgather of this rank's bytes."""
        start = time.perf_counter()
        everyone = np.empty(int(sum(counts)), dtype=values.dtype)
        self.mpi.Allgatherv(values, [everyone, list(counts)])
        self._record("allgather", label, values.nbytes, start)
        return everyone

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int],
                  label: str) -> np.ndarray:
        """Rank r's part of every rank's 1-D host array ``send`` (cut into ``send_counts``
        elements per rank in rank order), concatenated in rank order (``recv_counts`` from each);
        counted as one ("alltoall", label) call of the bytes this rank sends."""
        start = time.perf_counter()
        received = np.empty(int(sum(recv_counts)), dtype=send.dtype)
        self.mpi.Alltoallv([send, list(send_counts)], [received, list(recv_counts)])
        self._record("alltoall", label, send.nbytes, start)
        return received

    def iallgather(self, values: np.ndarray, label: str) -> tuple[MPI.Request, np.ndarray]:
        """Start an ``allgather``: the request (complete it with ``waitall``) and the (N, k)
        array it fills; counted when posted."""
        start = time.perf_counter()
        everyone = np.empty((self._size, values.size), dtype=values.dtype)
        request = self.mpi.Iallgather(values, everyone)
        self._record("iallgather", label, values.nbytes, start)
        return request, everyone

    def iallreduce(self, send: np.ndarray, recv: np.ndarray, label: str,
                   op: MPI.Op = MPI.SUM, stages: StagesMaker | None = None) -> Reduction:
        """Start ``recv <- sum_i send_i`` over ranks (host arrays of one size; neither may be
        written, nor ``recv`` read, until ``complete``). Counted when completed. With ``stages``
        (a sum) on several nodes, the reduction by stages it makes (the node-aware path of
        hpcopt/comm/node_reduce.py), moved on by ``advance``."""
        start = time.perf_counter()
        if stages is not None and not self.in_node:
            made = stages(self, send, recv, label)
            return Reduction(made, label, made.nbytes, start, time.perf_counter() - start)
        request = (self.mpi.Iallreduce(send, recv, op=op) if self.comm_thread is None
                   else self.comm_thread.post(send, recv, op))
        return Reduction(request, label, send.nbytes, start, time.perf_counter() - start)

    def advance(self, reduction: Reduction) -> None:
        """Complete the stage in flight of a reduction by stages (``iallreduce``'s ``stages``)
        and post its next one (collective: in the same order on every rank); nothing for one
        MPI call."""
        advance = getattr(reduction.request, "advance", None)
        if advance is not None:
            advance()

    def complete(self, reduction: Reduction) -> None:
        """Wait for ``reduction``: one ("iallreduce", label) call of its bytes, whose seconds
        are its post's and this wait's (the seconds this rank was held), and its seconds in
        flight, from the post to now, under (IN_FLIGHT, label); where the communication thread
        moved it on, its own seconds in MPI under (OWN, label)."""
        start = time.perf_counter()
        request = reduction.request
        if isinstance(request, Posted):
            assert self.comm_thread is not None
            self.comm_thread.wait(request)
        else:
            request.Wait()
        held = reduction.post_seconds + time.perf_counter() - start
        hidden = start - reduction.posted - reduction.post_seconds
        self.stats.record_overlapped("iallreduce", reduction.label, reduction.nbytes, held, hidden,
                                     self.in_node)
        if isinstance(request, Posted):
            self.stats.record_own(reduction.label, request.own_seconds, self.in_node)

    def gather(self, values: np.ndarray, label: str, root: int = 0) -> np.ndarray | None:
        """Every rank's small host vector ``values`` stacked (N, k) on ``root``; None elsewhere."""
        start = time.perf_counter()
        everyone = np.empty((self._size, values.size), dtype=values.dtype) if self._rank == root else None
        self.mpi.Gather(values, everyone, root=root)
        self._record("gather", label, values.nbytes, start)
        return everyone

    def gatherv(self, values: np.ndarray, counts: np.ndarray | None, label: str,
                root: int = 0) -> np.ndarray | None:
        """Every rank's 1-D host array ``values`` (lengths may differ) concatenated in rank order
        on ``root``, which passes every rank's length (``counts``); None elsewhere."""
        start = time.perf_counter()
        everyone = None
        if self._rank == root:
            assert counts is not None, "the root passes every rank's length"
            everyone = np.empty(int(counts.sum()), dtype=values.dtype)
            displacements = np.concatenate([[0], np.cumsum(counts)[:-1]])
            self.mpi.Gatherv(values, [everyone, counts, displacements, from_numpy_dtype(values.dtype)],
                             root=root)
        else:
            self.mpi.Gatherv(values, None, root=root)
        self._record("gather", label, values.nbytes, start)
        return everyone

    def barrier(self, label: str = "barrier") -> None:
        start = time.perf_counter()
        self.mpi.Barrier()
        self._record("barrier", label, 0, start)

    def agree(self, flag: int, label: str = "agree") -> int:
        """ULFM's fault-tolerant agreement (``MPIX_Comm_agree``, Open MPI's ULFM only): the
        bitwise AND of ``flag`` over the ranks, the same on every rank; where a rank was lost,
        its error (``hpcopt.comm.ulfm``) on every survivor alike."""
        start = time.perf_counter()
        value = int(self.mpi.Agree(flag))
        self._record("agree", label, 0, start)
        return value

    def agree_errors(self, message: str | None, label: str = "preflight") -> list[tuple[int, str]]:
        """Every rank's error message (or None), gathered on every rank: (rank, message) pairs.

        Lets all ranks leave together, with the same exit code, when any of them found a
        problem before training starts. Buffer collectives, no pickle (``gather_texts``).
        """
        start = time.perf_counter()
        messages = gather_texts(self.mpi, message)
        self._record("allgather", label, 0, start)
        return [(r, m) for r, m in enumerate(messages) if m is not None]

    # -- point to point --------------------------------------------------------------------

    def isend(self, buf: Any, dest: int, tag: int, label: str = "p2p") -> MPI.Request:
        """Non-blocking send of a contiguous buffer (counted when posted)."""
        start = time.perf_counter()
        self.backend.synchronize()
        if isinstance(buf, np.ndarray):
            request = self.mpi.Isend(buf, dest=dest, tag=tag)
        else:
            request = self._transport().isend(self.mpi, buf, dest, tag)
        self._record("send", label, buf.nbytes, start)
        return request

    def irecv_(self, buf: Any, source: int, tag: int, label: str = "p2p") -> MPI.Request:
        """Non-blocking receive into a preallocated buffer (counted when posted; a staged device
        buffer is filled by ``waitall``)."""
        start = time.perf_counter()
        if isinstance(buf, np.ndarray):
            request = self.mpi.Irecv(buf, source=source, tag=tag)
        else:
            self.backend.synchronize()
            request = self._transport().irecv(self.mpi, buf, source, tag)
        self._record("recv", label, buf.nbytes, start)
        return request

    def waitall(self, requests: Sequence[MPI.Request], label: str = "p2p") -> None:
        """Complete requests; the time spent waiting is counted under ('wait', label)."""
        start = time.perf_counter()
        requests = list(requests)
        MPI.Request.Waitall(requests)
        if self.transport is not None:
            self.transport.complete(requests)
        self._record("wait", label, 0, start)

    # -- device buffers ---------------------------------------------------------------------

    def _transport(self) -> DeviceTransport:
        """The transport for the current backend (decided again if the backend changed)."""
        if self.transport is None or self.transport.backend != self.backend:
            self.transport = transport_for(self.backend)
        return self.transport

    def _mpi_buffer(self, buf: Any, send: bool = True,
                    receive: bool = True) -> AbstractContextManager[Any]:
        """What an in-place MPI call on ``buf`` should be given: a host array itself; a device
        buffer itself or, staged, its host copy (hpcopt/comm/staging.py)."""
        if isinstance(buf, np.ndarray):
            return nullcontext(buf)
        return self._transport().inplace(buf, send, receive)


def node_layout(mpi_comm: MPI.Comm) -> tuple[int, int]:
    """(rank on this node, ranks on this node), from a shared-memory split of ``mpi_comm``."""
    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def progress_mode(comm: Comm | None = None) -> str:
    """How a non-blocking collective moves on between this rank's MPI calls: "comm-thread" where
    ``comm``'s communication thread moves its reductions on (``hpcopt.comm.progress``), "thread"
    with MPICH's asynchronous progress (``MPIR_CVAR_ASYNC_PROGRESS=1`` under
    MPI_THREAD_MULTIPLE), else "calls" (only inside MPI calls: a reduction posted and waited for
    with none between moves in its wait)."""
    if comm is not None and comm.comm_thread is not None:
        return describe_progress("comm-thread")
    on = os.environ.get(MPICH_ASYNC, "").strip().lower() in ("1", "true", "yes", "on")
    return "thread" if on and MPI.Query_thread() >= MPI.THREAD_MULTIPLE else "calls"


def gather_texts(mpi_comm: MPI.Comm, text: str | None) -> list[str | None]:
    """Every rank's ``text`` (or None), in rank order on every rank (collective): the lengths
    (-1 for None) by an Allgather, then the UTF-8 bytes by an Allgatherv. Fixed-size buffers and
    no pickle: a peer's bytes are never unpickled, and under ULFM a collective that a lost rank
    broke raises an MPI error (``hpcopt.comm.ulfm``) instead of a bad pickle's."""
    data = np.frombuffer(text.encode(), dtype=np.uint8) if text is not None else np.empty(0, np.uint8)
    lengths = np.empty(mpi_comm.Get_size(), dtype=np.int64)
    mpi_comm.Allgather(np.array([data.size if text is not None else -1], dtype=np.int64), lengths)
    counts = np.maximum(lengths, 0)
    everyone = np.empty(int(counts.sum()), dtype=np.uint8)
    mpi_comm.Allgatherv(data, [everyone, counts.tolist()])
    ends = np.cumsum(counts)
    return [None if length < 0 else everyone[end - length:end].tobytes().decode(errors="replace")
            for length, end in zip(lengths.tolist(), ends.tolist())]


def gather_ints(mpi_comm: MPI.Comm, value: int) -> list[int]:
    """Every rank's ``value``, in rank order on every rank (collective, a buffer Allgather)."""
    everyone = np.empty(mpi_comm.Get_size(), dtype=np.int64)
    mpi_comm.Allgather(np.array([value], dtype=np.int64), everyone)
    return everyone.tolist()


def node_indices(mpi_comm: MPI.Comm) -> tuple[int, ...]:
    """Per rank of ``mpi_comm``, the index of its node (nodes numbered in the order of their
    lowest rank), from a shared-memory split (collective)."""
    rank = mpi_comm.Get_rank()
    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        first = np.array([rank], dtype=np.int64)
        local.Allreduce(MPI.IN_PLACE, first, op=MPI.MIN)
        lowest = gather_ints(mpi_comm, int(first[0]))
    finally:
        local.Free()
    order = {first: index for index, first in enumerate(sorted(set(lowest)))}
    return tuple(order[first] for first in lowest)


def agreed(build: Callable[[], T], comm: Comm, label: str = "preflight") -> T:
    """Run ``build`` on every rank; if it raised HpcoptError on any rank, raise it on all ranks.

    Used around set-up work that has no collective inside (parsing, loading, building), so that
    a problem found on one rank (a file missing on one node) ends every rank together with
    exit code 2 instead of leaving the others waiting in the first collective. The agreement
    (an allgather) is counted on ``label``.
    """
    message, result = None, None
    try:
        result = build()
    except HpcoptError as exc:
        message = str(exc)
    errors = comm.agree_errors(message, label)
    if errors:
        rank, text = errors[0]
        everyone_agrees = len(errors) == comm.size and all(m == text for _, m in errors)
        raise HpcoptError(text if everyone_agrees else f"rank {rank}: {text}", everywhere=True)
    return result  # type: ignore[return-value]


def prepare_progress(mode: str, comm: Comm) -> None:
    """Make ``mode`` real on ``comm`` (collective): MPICH's progress thread must be on already
    (HpcoptError on every rank otherwise, naming why); the communication thread is started."""
    if mode == "calls":
        return
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise HpcoptError(f"--comm-progress {mode} needs an MPI library with MPI_THREAD_MULTIPLE",
                          everywhere=True)
    if mode == "mpich-thread":
        if not MPI.Get_library_version().startswith("MPICH"):
            raise HpcoptError("--comm-progress mpich-thread needs MPICH (this MPI is "
                              f"{MPI.Get_library_version().split(chr(10))[0].strip()}); "
                              "use --comm-progress comm-thread", everywhere=True)
        if progress_mode() != "thread":
            raise HpcoptError(f"--comm-progress mpich-thread: MPI started without its progress thread "
                              f"({MPICH_ASYNC}=1 is read only as MPI starts): give the option on the "
                              f"hpcopt command line, or set {MPICH_ASYNC}=1 in the job's environment",
                              everywhere=True)
        return
    comm.start_comm_thread()
