"""hpcopt.comm.Comm under MPI, at any world size (1 to 4 ranks):

    mpiexec -n N python -m pytest --with-mpi -p no:cacheprovider tests/mpi -q

Every test runs the same collectives in the same order on every rank. Data are a pure
function of (rank, length, dtype), so each rank can build every other rank's input and the
exact expected result locally. Integer-valued floats make sums exact whatever order MPI adds
them in, so ``average_`` can be compared bit for bit with "sum, then divide by n". Tests taking
``device`` run again on device (CuPy) buffers, through the path a run would take to MPI.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from mpi4py import MPI

from hpcopt.comm.core import ALLREDUCE_SLICE_BYTES, Comm, CommStats, _slices
from tests.conftest import data_pointer, host, use_device
from tests.memory import peak_allocation

pytestmark = pytest.mark.mpi

DTYPES = (np.float32, np.float64)


# -- helpers ---------------------------------------------------------------------------------

def int_data(rank: int, length: int, dtype) -> np.ndarray:
    """Integer-valued floats (< 2**10), different on every rank: sums of 4 ranks are exact."""
    i = np.arange(length, dtype=np.int64)
    return ((i * 7919 + rank * 104729 + 13) % 1021).astype(dtype)


def random_data(rank: int, length: int, dtype) -> np.ndarray:
    return np.random.default_rng([rank, length]).standard_normal(length).astype(dtype)


def exact_average(length: int, dtype, n: int) -> np.ndarray:
    """sum over ranks of int_data (exact in dtype) divided by n the way average_ does it."""
    total = np.sum([int_data(r, length, np.int64) for r in range(n)], axis=0)
    out = total.astype(dtype)  # exact: < 4 * 1021
    out /= n
    return out


def digests(mpi: MPI.Comm, buf: np.ndarray) -> list[str]:
    """Every rank's sha256 of buf's bytes."""
    return mpi.allgather(hashlib.sha256(buf.tobytes()).hexdigest())


class CountingComm:
    """Stands in for ``Comm.mpi``: forwards everything, records the length of each Allreduce."""

    def __init__(self, inner: MPI.Comm) -> None:
        self._inner = inner
        self.allreduce_lengths: list[int] = []

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):  # noqa: N802 - MPI's name
        self.allreduce_lengths.append(len(recvbuf))
        return self._inner.Allreduce(sendbuf, recvbuf, op=op)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@pytest.fixture
def sliced():
    """A Comm factory with small slice sizes, for buffers of ``device``; every Comm it made is
    freed afterwards."""
    made: list[Comm] = []

    def make(slice_bytes: int, device: str = "cpu") -> Comm:
        c = use_device(Comm(slice_bytes=slice_bytes), device)
        made.append(c)
        return c

    yield make
    for c in made:
        c.free()


# -- _slices (pure, but lives with the rest of comm) -------------------------------------

@pytest.mark.parametrize("n, itemsize, slice_bytes", [
    (0, 4, 64), (1, 4, 64), (16, 4, 64), (17, 4, 64), (1003, 4, 256), (37, 8, 12),
    (10, 8, 3), (1000, 8, 4 << 20),
])
def test_slices_cover_the_buffer_once_in_order(n, itemsize, slice_bytes):
    pieces = list(_slices(n, itemsize, slice_bytes))
    step = max(1, slice_bytes // itemsize)
    covered = [i for s in pieces for i in range(s.start, s.stop)]
    assert covered == list(range(n))
    assert all(0 < s.stop - s.start <= step for s in pieces)
    assert len(pieces) == math.ceil(n / step)


# -- average_ ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [0, 1, 3, 5, 7, 1001, 4099])
def test_average_is_exact_mean_unsliced(comm, device, dtype, length):
    n = comm.size
    buf = use_device(comm, device).backend.xp.asarray(int_data(comm.rank, length, dtype))
    out = comm.average_(buf)
    assert out is buf
    assert buf.dtype == dtype
    np.testing.assert_array_equal(host(buf), exact_average(length, dtype, n))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [1, 7, 1001, 4099])
def test_average_matches_raw_allreduce_then_scale_bitwise(comm, dtype, length):
    """Same buffer, same (unsliced) call: hpcopt must add nothing but the division by n."""
    mine = random_data(comm.rank, length, dtype)
    raw = mine.copy()
    comm.mpi.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM)
    raw /= comm.size
    comm.average_(mine)
    np.testing.assert_array_equal(mine, raw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slice_bytes, length", [
    (256, 1003),   # 64 float32 / 32 float64 per slice, ragged tail
    (28, 101),     # 7 float32 / 3 float64 per slice: not a multiple of float64's size
    (12, 37),      # 3 float32 / 1 float64 per slice
    (4, 9),        # one float32 per slice; below one float64: still one element per slice
])
def test_sliced_average_is_exact_and_issues_every_slice(sliced, device, dtype, slice_bytes,
                                                        length):
    c = sliced(slice_bytes, device)
    counting = CountingComm(c.mpi)
    c.mpi = counting
    buf = c.backend.xp.asarray(int_data(c.rank, length, dtype))
    c.average_(buf)
    np.testing.assert_array_equal(host(buf), exact_average(length, dtype, c.size))
    step = max(1, slice_bytes // np.dtype(dtype).itemsize)
    assert len(counting.allreduce_lengths) == math.ceil(length / step) > 1
    assert sum(counting.allreduce_lengths) == length
    assert max(counting.allreduce_lengths) * np.dtype(dtype).itemsize <= max(slice_bytes, buf.itemsize)
    c.mpi = counting._inner  # so the fixture frees the real communicator


@pytest.mark.parametrize("dtype", DTYPES)
def test_buffer_within_one_slice_is_one_call(sliced, dtype):
    c = sliced(1024)
    counting = CountingComm(c.mpi)
    c.mpi = counting
    length = 1024 // np.dtype(dtype).itemsize  # exactly slice_bytes
    buf = int_data(c.rank, length, dtype)
    c.average_(buf)
    c.mpi = counting._inner
    assert counting.allreduce_lengths == [length]
    np.testing.assert_array_equal(buf, exact_average(length, dtype, c.size))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sliced_average_of_random_data_matches_reference(sliced, dtype):
    c = sliced(256)
    length = 1003
    buf = random_data(c.rank, length, dtype)
    c.average_(buf)
    # float32 inputs were rounded before the sum: compare with the float64 mean of them.
    ref = sum(random_data(r, length, dtype).astype(np.float64) for r in range(c.size)) / c.size
    tol = {np.float32: 2e-6, np.float64: 1e-14}[dtype]
    np.testing.assert_allclose(buf, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slice_bytes", [ALLREDUCE_SLICE_BYTES, 256, 12])
def test_every_rank_ends_with_identical_bits(sliced, device, dtype, slice_bytes):
    c = sliced(slice_bytes, device)
    buf = c.backend.xp.asarray(random_data(c.rank, 1003, dtype) * (1 + c.rank))  # far from identical
    before = digests(c.mpi, host(buf))
    assert len(set(before)) == c.size
    c.average_(buf)
    assert len(set(digests(c.mpi, host(buf)))) == 1


def test_allreduce_max_and_sliced_ops(sliced, device):
    c = sliced(16, device)
    buf = c.backend.xp.asarray(int_data(c.rank, 50, np.float64))
    c.allreduce_(buf, op=MPI.MAX, label="max")
    expected = np.max([int_data(r, 50, np.float64) for r in range(c.size)], axis=0)
    np.testing.assert_array_equal(host(buf), expected)
    assert c.stats.counters[("allreduce", "max")].calls == 1


def test_average_on_one_rank_leaves_data_untouched():
    c = Comm(MPI.COMM_SELF)
    try:
        buf = random_data(0, 101, np.float32)
        ref = buf.copy()
        c.average_(buf)
        np.testing.assert_array_equal(buf, ref)
        assert c.stats.totals(op="allreduce").calls == 1
    finally:
        c.free()


# -- no copies, no allocations -----------------------------------------------------------

@pytest.mark.parametrize("slice_bytes", [ALLREDUCE_SLICE_BYTES, 64 << 10])
def test_average_keeps_pointer_and_allocates_nothing_large(sliced, device, slice_bytes):
    c = sliced(slice_bytes, device)
    # 4 MB: 64 slices of 64 KB; past SHM_AVERAGE_MIN_BYTES (the shared-memory path on the host)
    buf = c.backend.xp.asarray(random_data(c.rank, 1 << 20, np.float32))
    address = data_pointer(buf)
    c.average_(buf)  # warm-up: first-call allocations (a staging buffer) do not count
    c.mpi.Barrier()
    out, allocated = peak_allocation(lambda: c.average_(buf))
    assert out is buf
    assert data_pointer(buf) == address
    assert buf.flags.c_contiguous and buf.flags.owndata
    # A temporary host copy of the buffer (buf / n, np.concatenate, a device buffer copied out
    # without the staging buffer, ...) would be >= 4 MB here.
    assert allocated < buf.nbytes // 100, f"average_ allocated {allocated} bytes"


def test_tracemalloc_sees_a_copying_average():
    """The check above can fail: a copy-making average shows up in tracemalloc's peak."""
    buf = np.ones(1 << 20, dtype=np.float32)

    def copying_average() -> None:
        buf[:] = buf / 2  # what average_ must not do

    _, allocated = peak_allocation(copying_average)
    assert allocated >= buf.nbytes


# -- counters ----------------------------------------------------------------------------

def test_counters_count_calls_and_nbytes_per_label(sliced):
    c = sliced(64)  # sliced: still one counted call per average_
    a = np.zeros(100, dtype=np.float32)
    b = np.zeros(33, dtype=np.float64)
    c.average_(a, label="grad")
    c.average_(a, label="grad")
    c.average_(b, label="eval")
    c.average_(b)  # default label
    c.allreduce_(a)  # default label of allreduce_
    got = {k: (v.calls, v.bytes) for k, v in c.stats.counters.items()}
    assert got == {
        ("allreduce", "grad"): (2, 2 * a.nbytes),
        ("allreduce", "eval"): (1, b.nbytes),
        ("allreduce", "average"): (1, b.nbytes),
        ("allreduce", "other"): (1, a.nbytes),
    }
    assert all(v.seconds > 0 for v in c.stats.counters.values())
    assert c.stats.labels() == ["average", "eval", "grad", "other"]

    c.bcast_(b, label="grad")
    total = c.stats.totals()
    assert (total.calls, total.bytes) == (6, 3 * a.nbytes + 3 * b.nbytes)
    grad = c.stats.totals(label="grad")
    assert (grad.calls, grad.bytes) == (3, 2 * a.nbytes + b.nbytes)
    assert c.stats.totals(op="allreduce").calls == 5
    assert c.stats.totals(op="bcast", label="grad").bytes == b.nbytes
    assert c.stats.totals(label="nothing").calls == 0
    assert math.isclose(total.seconds, sum(v.seconds for v in c.stats.counters.values()))
    rows = c.stats.as_rows()
    assert [r[:2] for r in rows] == sorted(r[:2] for r in rows)
    assert ("bcast", "grad", 1, b.nbytes) in [r[:4] for r in rows]

    # Calls and bytes agree on every rank (seconds need not).
    assert len(set(c.mpi.allgather(tuple(r[:4] for r in rows)))) == 1

    c.stats.reset()
    assert c.stats.counters == {} and c.stats.totals().calls == 0


def test_stats_are_per_comm(comm, sliced):
    other = sliced(1 << 20)
    comm.average_(np.zeros(10))
    assert other.stats.totals().calls == 0
    assert comm.stats.totals().calls == 1


def test_commstats_record_accumulates():
    s = CommStats()
    s.record("allreduce", "x", 10, 0.5)
    s.record("allreduce", "x", 6, 0.25)
    s.record("bcast", "y", 1, 1.0)
    assert (s.counters[("allreduce", "x")].calls, s.counters[("allreduce", "x")].bytes) == (2, 16)
    assert s.counters[("allreduce", "x")].seconds == pytest.approx(0.75)
    assert s.totals(label="y").bytes == 1 and s.totals(op="allreduce").calls == 2


# -- bcast, scalars, host arrays ---------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_bcast_overwrites_with_roots_copy(comm, device, dtype):
    xp = use_device(comm, device).backend.xp
    for root in sorted({0, comm.size - 1}):
        buf = xp.asarray(random_data(comm.rank, 257, dtype))
        out = comm.bcast_(buf, root=root, label="params")
        assert out is buf
        np.testing.assert_array_equal(host(buf), random_data(root, 257, dtype))
    calls = len({0, comm.size - 1})
    c = comm.stats.counters[("bcast", "params")]
    assert (c.calls, c.bytes) == (calls, calls * buf.nbytes)


def test_allreduce_scalar(comm):
    n, r = comm.size, comm.rank
    assert comm.allreduce_scalar(r + 1.5) == pytest.approx(sum(k + 1.5 for k in range(n)))
    assert comm.allreduce_scalar(float(r), op=MPI.MAX) == n - 1
    assert comm.allreduce_scalar(float(r), op=MPI.MIN, label="loss") == 0
    value = comm.allreduce_scalar(np.float32(0.1))
    assert isinstance(value, float) and value == pytest.approx(0.1 * n)
    c = comm.stats.counters[("allreduce", "scalar")]
    assert (c.calls, c.bytes) == (3, 3 * 8)
    assert comm.stats.counters[("allreduce", "loss")].calls == 1


def test_allreduce_host_(comm):
    values = np.array([comm.rank, 1.0, 2.0 * comm.rank], dtype=np.float64)
    out = comm.allreduce_host_(values, label="stats")
    n = comm.size
    assert out is values
    np.testing.assert_array_equal(values, [n * (n - 1) / 2, n, n * (n - 1)])
    assert comm.stats.counters[("allreduce", "stats")].bytes == values.nbytes


# -- point to point ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_ring_exchange(comm, device, dtype):
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    xp = use_device(comm, device).backend.xp
    send_a = xp.asarray(int_data(r, 31, dtype))
    send_b = xp.asarray(random_data(r, 5, dtype))
    recv_a = xp.full(31, np.nan, dtype=dtype)
    recv_b = xp.full(5, np.nan, dtype=dtype)
    # Receives posted in the opposite order of the sends: only the tags pair them up.
    requests = [
        comm.irecv_(recv_b, source=left, tag=2, label="ring"),
        comm.irecv_(recv_a, source=left, tag=1, label="ring"),
        comm.isend(send_a, dest=right, tag=1, label="ring"),
        comm.isend(send_b, dest=right, tag=2, label="ring"),
    ]
    assert all(isinstance(q, MPI.Request) for q in requests)
    comm.waitall(requests, label="ring")
    np.testing.assert_array_equal(host(recv_a), int_data(left, 31, dtype))
    np.testing.assert_array_equal(host(recv_b), random_data(left, 5, dtype))
    got = {op: (c.calls, c.bytes) for (op, lab), c in comm.stats.counters.items() if lab == "ring"}
    assert got == {
        "send": (2, send_a.nbytes + send_b.nbytes),
        "recv": (2, recv_a.nbytes + recv_b.nbytes),
        "wait": (1, 0),
    }


# -- agree_errors, communicator ----------------------------------------------------------

def test_agree_errors(comm):
    n, r = comm.size, comm.rank
    assert comm.agree_errors(None) == []
    last = n - 1
    msg = "bad file" if r == last else None
    assert comm.agree_errors(msg) == [(last, "bad file")]
    everyone = comm.agree_errors(f"rank {r} failed", label="check")
    assert everyone == [(k, f"rank {k} failed") for k in range(n)]
    assert comm.stats.counters[("allgather", "preflight")].calls == 2
    assert comm.stats.counters[("allgather", "check")].calls == 1


def test_texts_are_gathered_by_buffers_none_empty_and_any_characters_kept(comm):
    """``gather_texts`` (agree_errors' collective, no pickle): None, "" and non-ASCII text come
    back as each rank gave them, in rank order; ``gather_ints`` likewise."""
    from hpcopt.comm.core import gather_ints, gather_texts

    def text(r: int) -> str | None:
        return [None, "", f"rank {r}: données ∑ 🚀", "x" * (1000 + r)][r % 4]

    assert gather_texts(comm.mpi, text(comm.rank)) == [text(k) for k in range(comm.size)]
    assert gather_texts(comm.mpi, None) == [None] * comm.size
    assert gather_ints(comm.mpi, 3 * comm.rank - 1) == [3 * k - 1 for k in range(comm.size)]


def test_comm_is_a_duplicate_and_free_is_idempotent():
    c = Comm()
    assert c.mpi != MPI.COMM_WORLD
    assert MPI.Comm.Compare(c.mpi, MPI.COMM_WORLD) == MPI.CONGRUENT
    assert (c.rank, c.size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
    assert c.slice_bytes == ALLREDUCE_SLICE_BYTES
    c.free()
    assert c.mpi == MPI.COMM_NULL
    c.free()


def test_gathers_of_small_host_vectors_are_counted(comm):
    mine = np.array([comm.rank, 10 * comm.rank], dtype=np.int64)
    expected = np.array([[r, 10 * r] for r in range(comm.size)])
    np.testing.assert_array_equal(comm.allgather(mine, "stats"), expected)
    request, everyone = comm.iallgather(mine, "stats")
    comm.waitall([request], "stats")
    np.testing.assert_array_equal(everyone, expected)
    root = comm.size - 1
    gathered = comm.gather(mine, "stats", root=root)
    if comm.rank == root:
        np.testing.assert_array_equal(gathered, expected)
    else:
        assert gathered is None
    for op in ("allgather", "iallgather", "gather"):
        counter = comm.stats.counters[(op, "stats")]
        assert (counter.calls, counter.bytes) == (1, mine.nbytes)
