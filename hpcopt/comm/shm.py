"""Averaging at memory speed: node-local shared-memory reduction plus an inter-node allreduce.

``ShmAverager.average_(buf)`` computes ``buf <- (1/N) sum_i buf_i`` over the N ranks of a
communicator, like ``Allreduce(IN_PLACE, buf)`` followed by ``buf /= N``, but the ranks of one
node (a shared-memory split of the communicator) meet in an MPI-3 shared-memory window instead of
sending each other messages:

1. copy-in: every rank copies its buffer into its own row of the window (``k`` rows, one per
   rank of the node), except the slice it reduces itself, which it reads straight from its buffer;
2. reduce-scatter in place: the node's ``p`` slice owners each sum one column slice of the
   window over the rows, always in the order row 0, 1, ..., k-1, into a result area. The order is
   fixed, so the sum does not depend on which rank computed it: every rank ends with the same bits;
3. inter-node: with several nodes, the summed slices are added up across nodes with MPI, either by
   every slice owner on its own slice (``inter="owners"``: one allreduce per owner, over one rank
   per node) or by each node's leader on the whole result (``inter="leaders"``);
4. copy-back: every rank writes ``result / N`` into its buffer.

The ranks synchronize only with the window's own primitives: ``Win_sync`` + a barrier on the
node communicator + ``Win_sync`` (the MPI-3 "unified model" recipe inside one ``Lock_all``
epoch). There is no polling in Python, so a rank that arrives late simply makes the others wait.

The buffer is processed in chunks of at most ``chunk_bytes`` so that a chunk's trip through the
window (copy-in, reduce, copy-back) happens while it is still in the last-level cache: per rank,
main memory then sees about one read and one write of the buffer, like a ``memcpy`` (measured:
~0.95x the bandwidth of every rank copying its buffer at the same time). The stages are
pipelined over chunks so that a chunk costs one barrier, not three: in phase ``t`` a rank copies
chunk ``t`` in, reduces chunk ``t-1`` and copies chunk ``t-D`` back (``D`` = 2, or 3 when node
leaders do the inter-node step in a stage of its own); the window holds 2 input slots and ``D``
result slots, so no stage ever writes what another rank may still be reading. The copy-back is
the division itself (``np.divide(result, N, out=buf)``), not a ``memcpy``: glibc 2.36's memcpy
on this AMD EPYC runs ~10x slower below 512 KB when the destination (numpy's buffer, 16 bytes
off a 64-byte boundary) is misaligned and the source (the window) is not.

Buffers that do not divide into ``k`` or ``p`` parts are fine (slices are cut at cache-line
boundaries, the last ones may be shorter or empty). Nodes of different sizes are fine too: the
inter-node slicing uses the smallest node's rank count, so every node cuts its chunks the same
way.

In place, for buffers that already live in shared memory: ``shared_empty`` hands out arrays
whose memory is this rank's row of a node-shared window of their own (one row per node rank),
and ``average_`` of such an array (the very object handed out) skips steps 1 and 4's copies:
after one barrier every slice owner sums its slice of the ``k`` rows in place into row 0 (row
0, 1, ..., k-1, chunk by chunk so that it stays in cache), allreduces it across nodes
(``inter="owners"``), divides it by N there and copies it into the other rows' slices; one more
barrier and every rank's array holds the average. Per rank, main memory sees one read and one
write of the buffer and no copy through a window; the slices, the summation order and the
correctly rounded division (a multiplication by 1/N where N is a power of two: the same bits)
are those of the copying path, so the bits are the same too. With ``inter="leaders"`` such
arrays take the copying path.

Windows left open at exit: an averager never freed (e.g. that of ``hpcopt.train`` on a ``Comm``
of its own, whose model the caller keeps), and the windows ``free`` kept for live arrays, are
freed when the interpreter exits, in the order the averagers were made (the same on every
rank), before mpi4py's ``MPI_Finalize``: MPICH's OFI netmod cannot close its fabric under an open
window, and the job failed at exit (exit code 15) after a finished run.

Testing on one machine: ``ranks_per_node=k`` fakes nodes of ``k`` ranks by splitting the
communicator by ``rank // k`` (all of them still share memory), so the inter-node step runs.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

#: Buffers below this size are averaged with plain MPI ``Allreduce`` by ``Comm(averaging="auto")``.
#: Measured with benchmarks/speed/allreduce.py (its "crossover" line; 2-core AMD EPYC VM, MPICH 5.0.2,
#: float32; docs/results/allreduce.md): shm / best plain Allreduce, over 7 runs at 2 ranks, was
#: 0.68-0.89 at 16 KB, 0.84-1.08 at 64 KB, 1.13-1.27 at 128 KB, 1.24-2.23 at 256 KB; at 4 ranks
#: 0.69-0.92 at 16 KB, 0.91-1.14 at 64 KB, 1.24-1.26 at 128 KB. The crossover is ~64 KB (fixed
#: cost: 2 barriers + ~6 numpy calls); 128 KB is the first size at which shm won in every run.
SHM_AVERAGE_MIN_BYTES = 128 << 10

#: Largest piece of the buffer that goes through the window at once, in bytes: small enough
#: that a chunk's 2 k + D window slots stay in the last-level cache (32 MB here), large enough
#: that the per-chunk barrier and numpy calls (~16 us) stay small. Chunk sweep of
#: benchmarks/speed/allreduce.py at 32 and 64 MB (paired rel, lower is better), 2 ranks over 3 runs:
#: 256 KB 1.10-1.26, 512 KB 1.00-1.12, 1 MB 1.00-1.07, 2 MB 1.05-1.17, 4 MB 1.09-1.67; 4 ranks:
#: 512 KB 1.01-1.09, 1 MB 1.00-1.02, 2 MB 1.10-1.13.
SHM_CHUNK_BYTES = 1 << 20
#: The chunk where the averager spans nodes: each chunk's inter-node step is one blocking allreduce
#: per owner, and the link idles between them (the pipeline's barrier, the in-node sums of the
#: next chunk). 16 MB allreduces, 2 nodes x 2 ranks on 2 shared cores, 1 Gbit/s emulated links,
#: load 13-18 (docs/results/clusters.md, "Across the nodes"): the link carried 0.26-0.33 of a
#: raw TCP stream's rate with 1 MB chunks, 0.73-0.82 with 4 MB, 0.77-0.79 with 16 MB, 0.08-0.31
#: with 256 KB. Per element the sums are those of any chunk size (the rows in a fixed order, then
#: the nodes' allreduce), so the bits are the same.
SHM_CHUNK_BYTES_ACROSS_NODES = 4 << 20

INTER_MODES = ("owners", "leaders")

_LINE = 64  # bytes: slices start on cache-line boundaries, so owners never share a line
_PAGE = 4096  # bytes: the rows of a shared array start on page boundaries

#: The file system that holds node-shared windows (MPICH and Open MPI map a file there): a
#: tmpfs, sized by the system (half the memory by default, 64 MB in a default Docker container).
SHM_DIRECTORY = "/dev/shm"


def shm_free_bytes(directory: str = SHM_DIRECTORY) -> float:
    """Bytes free for windows in ``directory`` (infinite where it does not exist)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return math.inf
    return float(stat.f_bavail * stat.f_frsize)


def shm_supported(buf: Any) -> bool:
    """Whether ``buf`` can take the shared-memory path: a C-contiguous numpy float array."""
    return (isinstance(buf, np.ndarray) and buf.flags.c_contiguous and buf.size > 0
            and buf.dtype.kind == "f" and buf.dtype.isnative)


@dataclass(frozen=True)
class _Chunk:
    start: int                 # position of the chunk in the flat buffer
    stop: int
    lo: int                    # this rank's reduce slice, relative to start (lo == hi: none)
    hi: int
    head: np.ndarray           # copy-in targets: this rank's row of the chunk, without its own
    tail: np.ndarray           # reduce slice (read straight from the buffer instead)
    rows: tuple                # every rank's row over the reduce slice (None at this rank)
    part: np.ndarray | None    # this rank's slice of the result (None: no reduce slice here)
    inter: np.ndarray | None   # what this rank allreduces across nodes (None: nothing)
    result: np.ndarray         # the whole result of the chunk (copy-back source)


@dataclass(frozen=True)
class _Shared:
    """An array handed out by ``shared_empty``, and how ``average_`` reduces it in place."""

    win: MPI.Win
    root: np.ndarray           # the window's whole memory (bytes); every row is a view of it
    array: np.ndarray          # this rank's row, as handed out
    slices: tuple              # per reduce slice of this rank: every rank's row over it, row 0
                               # first


#: Averagers not freed yet, in the order they were made (collectively: the same on every rank).
_UNFREED: dict[int, ShmAverager] = {}


class ShmAverager:
    """Node-local shared-memory averaging with an inter-node MPI step (see the module docstring).

    Creating one is collective over ``mpi``; so are ``average_``, ``shared_empty`` and ``free``.
    The copying path's window is allocated on the first ``average_`` (``2 k + D`` slots of
    ``chunk_bytes``, a few MB) and reused for every buffer size and dtype; the chunk plan (views
    into the window) is built once per (length, dtype) and cached. Each ``shared_empty`` array
    has a window of its own.
    """

    def __init__(self, mpi: MPI.Comm, *, ranks_per_node: int | None = None, inter: str = "owners",
                 chunk_bytes: int | None = None) -> None:
        if inter not in INTER_MODES:
            raise ValueError(f"inter must be one of {INTER_MODES}, got {inter!r}")
        if chunk_bytes is not None and chunk_bytes < _LINE:
            raise ValueError(f"chunk_bytes must be at least {_LINE}, got {chunk_bytes}")
        if ranks_per_node is not None and ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
        self.mpi = mpi
        self.size = mpi.Get_size()
        rank = mpi.Get_rank()
        if ranks_per_node is None:
            self.node = mpi.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        else:  # fake nodes for testing; a sub-split of the real node keeps them shareable
            shared = mpi.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
            self.node = shared.Split(color=rank // ranks_per_node, key=rank)
            shared.Free()
        self.node_rank = self.node.Get_rank()
        self.node_size = self.node.Get_size()
        counts = np.array([self.node_size, -self.node_size, self.node_rank == 0], dtype=np.int64)
        mpi.Allreduce(MPI.IN_PLACE, counts[:2], op=MPI.MIN)
        mpi.Allreduce(MPI.IN_PLACE, counts[2:], op=MPI.SUM)
        self.min_node_size, self.max_node_size, self.nodes = int(counts[0]), int(-counts[1]), int(counts[2])
        self.inter_mode = inter
        if chunk_bytes is None:
            chunk_bytes = SHM_CHUNK_BYTES if self.nodes == 1 else SHM_CHUNK_BYTES_ACROSS_NODES
        self.chunk_bytes = chunk_bytes
        self._row_bytes = chunk_bytes // _LINE * _LINE  # every window slot starts on a cache line

        k = self.node_size
        if self.nodes == 1:
            self.parts, self.stages, color = k, 2, MPI.UNDEFINED
        elif inter == "owners":
            # one slice per owner; every node cuts the same number of slices
            self.parts, self.stages = self.min_node_size, 2
            color = self.node_rank if self.node_rank < self.parts else MPI.UNDEFINED
        else:
            self.parts, self.stages = k, 3
            color = 0 if self.node_rank == 0 else MPI.UNDEFINED
        self.inter = mpi.Split(color, key=rank)  # one rank per node, or COMM_NULL
        self.win: MPI.Win | None = None
        self._mem: np.ndarray | None = None
        self._plans: dict[tuple[int, np.dtype], tuple[_Chunk, ...]] = {}
        self._shared: dict[int, _Shared] = {}  # id of an array shared_empty handed out -> it
        self._kept: list[MPI.Win] = []  # windows free() left to a live array: freed at exit
        #: Whether arrays from ``shared_empty`` are averaged in place (else they are copied).
        self.in_place = self.nodes == 1 or inter == "owners"
        _UNFREED[id(self)] = self

    @property
    def worthwhile(self) -> bool:
        """Whether every node holds several ranks (else plain Allreduce does as well or better)."""
        return self.min_node_size >= 2

    # -- set-up ----------------------------------------------------------------------------

    def _window(self) -> np.ndarray:
        if self._mem is None:
            nbytes = (2 * self.node_size + self.stages) * self._row_bytes
            # Split_type and Split of an intracommunicator return one; mpi4py types them as Comm.
            assert isinstance(self.node, MPI.Intracomm)
            # One contiguous segment owned by node rank 0; the others attach to it.
            self.win = MPI.Win.Allocate_shared(nbytes if self.node_rank == 0 else 0, 1, comm=self.node)
            memory, _ = self.win.Shared_query(0)
            # MPI.buffer exports the buffer protocol on every Python, but mpi4py's stubs declare
            # its __buffer__ only for Python >= 3.12, so numpy's stubs reject it on 3.10.
            self._mem = np.frombuffer(memory, dtype=np.uint8)  # type: ignore[call-overload]
            self.win.Lock_all(MPI.MODE_NOCHECK)
        return self._mem

    def _geometry(self, n: int, dtype: np.dtype) -> tuple[int, list[tuple[int, int, int, int]]]:
        """(elements of a chunk, [(start, stop, lo, hi)] per chunk): where the chunks of an
        ``n``-element buffer lie and this rank's reduce slice ``[lo, hi)`` in each (relative to
        start; lo == hi: none). Slices start on cache lines."""
        me, parts = self.node_rank, self.parts
        line = max(1, _LINE // dtype.itemsize)
        cap = self._row_bytes // dtype.itemsize  # a multiple of line
        width = min(cap, -(-n // line) * line)
        chunks = []
        for start in range(0, n, width):
            stop = min(n, start + width)
            length = stop - start
            cuts = [min(length, (length * j // parts) // line * line) for j in range(parts)] + [length]
            lo, hi = (cuts[me], cuts[me + 1]) if me < parts else (0, 0)
            chunks.append((start, stop, lo, hi))
        return width, chunks

    def _plan(self, n: int, dtype: np.dtype) -> tuple[_Chunk, ...]:
        plan = self._plans.get((n, dtype))
        if plan is not None:
            return plan
        mem = self._window()
        k, me, parts, stages = self.node_size, self.node_rank, self.parts, self.stages
        cap = self._row_bytes // dtype.itemsize
        width, geometry = self._geometry(n, dtype)
        # The slots sit at the same byte offsets whatever (n, dtype): input slot s, row j at
        # (s k + j) row_bytes, result slot s at (2 k + s) row_bytes. So the next average_ (of any
        # size), which writes only input slots before its first barrier, cannot touch a result a
        # slower rank is still copying back from the previous one.
        slots = mem.view(dtype).reshape(2 * k + stages, cap)[:, :width]
        inputs = [slots[s * k:(s + 1) * k] for s in range(2)]
        results = [slots[2 * k + s] for s in range(stages)]
        chunks = []
        for c, (start, stop, lo, hi) in enumerate(geometry):
            length = stop - start
            rows, result = inputs[c % 2], results[c % stages]
            part = result[lo:hi] if me < parts else None
            mine = tuple(None if j == me else rows[j, lo:hi] for j in range(k)) if me < parts else ()
            if self.inter == MPI.COMM_NULL:
                inter = None
            else:
                inter = part if self.inter_mode == "owners" else result[:length]
            chunks.append(_Chunk(start, stop, lo, hi, rows[me, :lo], rows[me, hi:length], mine,
                                 part, inter, result[:length]))
        plan = self._plans[(n, dtype)] = tuple(chunks)
        return plan

    def has_room(self, nbytes: int, free: float | None = None) -> bool:
        """Whether every node's ``SHM_DIRECTORY`` has room for a ``shared_empty`` array of
        ``nbytes`` a rank with as much again to spare (collective over the communicator: the
        same answer on every rank). A window larger than the room left there would end the job
        with a bus error when its pages are first written. ``free``: the bytes free, for tests
        (default: ``shm_free_bytes()``, read by each node's first rank)."""
        needed = 2 * self.node_size * (-(-max(1, nbytes) // _PAGE) * _PAGE)
        if self.node_rank == 0:
            room = (shm_free_bytes() if free is None else free) >= needed
        else:
            room = True
        return bool(self.mpi.allreduce(room, op=MPI.LAND))

    def shared_empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A new uninitialized array in node-shared memory that ``average_`` averages in place
        (see the module docstring); collective over the communicator, like ``average_``.

        Every rank must ask for the same shape and dtype, and average the very object returned
        (a view of it takes the copying path). Its memory is this rank's row of a window of its
        own, released by ``free`` once no array views it any more."""
        dtype = np.dtype(dtype)
        if dtype.kind != "f" or not dtype.isnative:
            raise ValueError(f"shared arrays hold native floats, not {dtype}")
        count = int(np.prod(shape, dtype=np.int64))
        k, me = self.node_size, self.node_rank
        row_bytes = -(-max(1, count * dtype.itemsize) // _PAGE) * _PAGE  # rows start on pages
        assert isinstance(self.node, MPI.Intracomm)  # see _window
        win = MPI.Win.Allocate_shared(k * row_bytes if me == 0 else 0, 1, comm=self.node)
        memory, _ = win.Shared_query(0)
        root = np.frombuffer(memory, dtype=np.uint8)  # type: ignore[call-overload]  # see _window
        win.Lock_all(MPI.MODE_NOCHECK)
        rows = [root[j * row_bytes:j * row_bytes + count * dtype.itemsize].view(dtype) for j in range(k)]
        array = rows[me].reshape(shape)
        _, geometry = self._geometry(max(1, count), dtype)
        slices = [tuple(row[start + lo:start + hi] for row in rows)
                  for start, _, lo, hi in (geometry if count else ()) if lo < hi]
        self._shared[id(array)] = _Shared(win, root, array, tuple(slices))
        return array

    # -- the averaging -----------------------------------------------------------------------

    def _sync(self, win: MPI.Win | None = None) -> None:
        win = win or self.win
        assert win is not None  # average_ plans (and so allocates the window) before any sync
        win.Sync()
        self.node.Barrier()
        win.Sync()

    def average_(self, buf: np.ndarray) -> np.ndarray:
        """``buf <- (1/N) sum_i buf_i`` in place; every rank ends with bitwise identical values."""
        shared = self._shared.get(id(buf))
        if shared is not None and shared.array is buf and self.in_place:
            return self._average_shared(shared)
        flat = buf.reshape(-1)  # a view (buf is C-contiguous)
        if flat.size == 0:
            return buf
        chunks = self._plan(flat.size, flat.dtype)
        count, stages, n = len(chunks), self.stages, float(self.size)  # float: faster than int
        leaders = self.inter_mode == "leaders" and self.inter != MPI.COMM_NULL
        owners = self.inter_mode == "owners" and self.inter != MPI.COMM_NULL
        inter, me = self.inter, self.node_rank
        last = count + stages - 1
        for phase in range(count + stages):
            c = phase - stages  # copy-back
            if c >= 0:
                ch = chunks[c]
                np.divide(ch.result, n, out=flat[ch.start:ch.stop])
            if leaders and 0 <= phase - 2 < count:  # inter-node step of the node leader
                inter.Allreduce(MPI.IN_PLACE, chunks[phase - 2].inter, op=MPI.SUM)
            c = phase - 1  # reduce my slice, rows in a fixed order
            if 0 <= c < count:
                ch = chunks[c]
                if ch.part is not None:
                    part = ch.part
                    rows = list(ch.rows)
                    rows[me] = flat[ch.start + ch.lo:ch.start + ch.hi]  # my own row: no copy
                    if len(rows) == 1:
                        np.copyto(part, rows[0])
                    else:
                        np.add(rows[0], rows[1], out=part)
                        for row in rows[2:]:
                            np.add(part, row, out=part)
                    if owners:
                        inter.Allreduce(MPI.IN_PLACE, ch.inter, op=MPI.SUM)
            if phase < count:  # copy-in, all but my own reduce slice
                ch = chunks[phase]
                if ch.lo > 0:
                    np.copyto(ch.head, flat[ch.start:ch.start + ch.lo])
                if ch.start + ch.hi < ch.stop:
                    np.copyto(ch.tail, flat[ch.start + ch.hi:ch.stop])
            if phase < last:
                self._sync()
        return buf

    def average_node_(self, buf: np.ndarray) -> bool:
        """``buf <- (1/k) sum_i buf_i`` over this rank's node alone (its k ranks), in place,
        where ``buf`` is an array from ``shared_empty`` that ``average_`` averages in place;
        False (nothing done) otherwise. Collective over the node; each element summed in row
        order and divided by k as the copying path of an averager of the node's ranks does it:
        the same bits."""
        shared = self._shared.get(id(buf))
        if shared is None or shared.array is not buf or not self.in_place:
            return False
        self._average_shared(shared, across=False)
        return True

    def _average_shared(self, shared: _Shared, across: bool = True) -> np.ndarray:
        """``average_`` of an array from ``shared_empty``: each slice summed in place into row
        0, allreduced across nodes, divided by N, copied into the other rows (two barriers);
        without ``across``, the node's sum divided by its k ranks."""
        ranks = self.size if across else self.node_size
        n = float(ranks)
        # x / n, correctly rounded, is x * (1/n) when n is a power of two (an exact scaling):
        # the same bits at the cost of a multiplication instead of a division
        scale = np.multiply if ranks & (ranks - 1) == 0 else np.divide
        factor = 1 / n if scale is np.multiply else n
        inter = self.inter if self.inter != MPI.COMM_NULL and across else None
        self._sync(shared.win)  # every rank's row holds its values
        for rows in shared.slices:
            total = rows[0]  # summed in place in row 0, the order row 0, 1, ..., k-1 kept
            for row in rows[1:]:
                np.add(total, row, out=total)
            if inter is not None:
                inter.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
            scale(total, factor, out=total)  # once, then copied: divisions are slow
            for row in rows[1:]:
                np.copyto(row, total)  # both on cache lines: memcpy's fast case
        self._sync(shared.win)  # every row holds the average
        return shared.array

    def free(self, exiting: bool = False) -> None:
        """Release the windows and the communicators (collective; idempotent). The window of
        an array from ``shared_empty`` that some rank still views (a model's parameters) is
        kept, never freed under a live array, until the process exits (``exiting``: the kept
        windows go too, see the module docstring)."""
        shared, self._shared = list(self._shared.values()), {}
        while shared:
            item = shared.pop(0)  # the same order on every rank: the frees are collective
            root, win = item.root, item.win
            del item  # our views of root go with it
            viewed = np.array([sys.getrefcount(root) > 2], dtype=np.int32)  # `root`, the argument
            self.node.Allreduce(MPI.IN_PLACE, viewed, op=MPI.MAX)
            del root
            if viewed[0]:
                self._kept.append(win)
            else:
                win.Unlock_all()
                win.Free()
        if exiting:
            for win in self._kept:
                win.Unlock_all()
                win.Free()
            self._kept.clear()
        if not self._kept:
            _UNFREED.pop(id(self), None)
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
            self.win, self._mem = None, None
        self._plans.clear()
        if self.inter != MPI.COMM_NULL:
            self.inter.Free()
        if self.node != MPI.COMM_NULL:
            self.node.Free()


@atexit.register  # Python runs its exit handlers before mpi4py calls MPI_Finalize
def _free_at_exit() -> None:
    """Free every averager not freed yet and every window ``free`` kept for a live array (the
    module docstring): the process is ending."""
    if MPI.Is_initialized() and not MPI.Is_finalized():
        for averager in list(_UNFREED.values()):
            averager.free(exiting=True)
