"""Shared-memory averaging (hpcopt.comm.shm) under MPI, at any world size (1 to 4 ranks):

    mpiexec -n N python -m pytest --with-mpi -q -p no:cacheprovider tests/mpi/test_shm_average.py

Nodes of several ranks are faked on one machine with ``ranks_per_node=k`` (a split by
``rank // k``), so that the inter-node step (slice owners or node leaders) runs too, on nodes of
equal and of unequal sizes (e.g. 3 ranks as nodes of 2 + 1). Small ``chunk_bytes`` make even
small buffers cross many chunks, slot reuses and ragged slices.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
from mpi4py import MPI

from hpcopt.comm import Comm
from hpcopt.comm.shm import (
    SHM_AVERAGE_MIN_BYTES,
    SHM_CHUNK_BYTES,
    SHM_CHUNK_BYTES_ACROSS_NODES,
    ShmAverager,
    shm_supported,
)
from tests.memory import peak_allocation

pytestmark = pytest.mark.mpi

DTYPES = (np.float32, np.float64)
LAYOUTS = [  # (ranks_per_node, inter): None = the real shared-memory split
    (None, "owners"), (1, "owners"), (2, "owners"), (2, "leaders"), (3, "owners"), (3, "leaders"),
]
TOL = {np.float32: 2e-6, np.float64: 1e-14}


def int_data(rank: int, length: int, dtype) -> np.ndarray:
    """Integer-valued floats (< 2**10): sums over 4 ranks are exact in any order."""
    i = np.arange(length, dtype=np.int64)
    return ((i * 7919 + rank * 104729 + 13) % 1021).astype(dtype)


def random_data(rank: int, length: int, dtype) -> np.ndarray:
    return np.random.default_rng([rank, length, 7]).standard_normal(length).astype(dtype)


def digests(mpi: MPI.Comm, buf: np.ndarray) -> list[str]:
    return mpi.allgather(hashlib.sha256(buf.tobytes()).hexdigest())


def raw_average(mpi: MPI.Comm, buf: np.ndarray) -> np.ndarray:
    out = buf.copy()
    mpi.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
    out /= mpi.Get_size()
    return out


@pytest.fixture
def world():
    mpi = MPI.COMM_WORLD.Dup()
    yield mpi
    mpi.Free()


@pytest.fixture
def averagers(world):
    """Factory of ShmAverager over ``world``; all freed after the test."""
    made: list[ShmAverager] = []

    def make(ranks_per_node=None, inter="owners", chunk_bytes=256) -> ShmAverager:
        a = ShmAverager(world, ranks_per_node=ranks_per_node, inter=inter, chunk_bytes=chunk_bytes)
        made.append(a)
        return a

    yield make
    for a in made:
        a.free()


# -- layout ----------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks_per_node, inter", LAYOUTS)
def test_layout_of_fake_nodes(world, averagers, ranks_per_node, inter):
    a = averagers(ranks_per_node, inter)
    n, rank = world.Get_size(), world.Get_rank()
    k = ranks_per_node or n  # one machine: the real split is one node
    sizes = [min(k, n - start) for start in range(0, n, k)]
    assert (a.node_rank, a.node_size) == (rank % k, sizes[rank // k])
    assert (a.nodes, a.min_node_size, a.max_node_size) == (len(sizes), min(sizes), max(sizes))
    assert a.worthwhile == (min(sizes) >= 2)
    if a.nodes == 1:
        assert a.inter == MPI.COMM_NULL and a.parts == a.node_size
    elif inter == "owners":
        assert a.parts == min(sizes)
        assert (a.inter != MPI.COMM_NULL) == (a.node_rank < min(sizes))
        if a.inter != MPI.COMM_NULL:
            assert a.inter.Get_size() == len(sizes)
    else:
        assert (a.inter != MPI.COMM_NULL) == (a.node_rank == 0)


# -- results -----------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks_per_node, inter", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_on_integer_data(world, averagers, ranks_per_node, inter, dtype):
    """Integer-valued data: the sum is exact, so the result equals Allreduce + scale bitwise."""
    a = averagers(ranks_per_node, inter, chunk_bytes=256)
    for length in (1, 3, 17, 64, 65, 1001):  # 1 to 32 chunks, ragged slices and chunks
        buf = int_data(world.Get_rank(), length, dtype)
        expected = raw_average(world, buf)
        out = a.average_(buf)
        assert out is buf and buf.dtype == dtype
        np.testing.assert_array_equal(buf, expected)


@pytest.mark.parametrize("ranks_per_node, inter", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_data_matches_allreduce_and_is_bitwise_identical(world, averagers, ranks_per_node,
                                                                  inter, dtype):
    a = averagers(ranks_per_node, inter, chunk_bytes=1024)
    n = world.Get_size()
    for length in (7, 1001, 5003):
        buf = random_data(world.Get_rank(), length, dtype)
        expected = raw_average(world, buf)
        a.average_(buf)
        np.testing.assert_allclose(buf, expected, rtol=TOL[dtype], atol=TOL[dtype])
        ref = sum(random_data(r, length, dtype).astype(np.float64) for r in range(n)) / n
        np.testing.assert_allclose(buf, ref, rtol=TOL[dtype], atol=TOL[dtype])
        assert len(set(digests(world, buf))) == 1


@pytest.mark.parametrize("ranks_per_node, inter", [(None, "owners"), (2, "owners"), (2, "leaders")])
def test_multidimensional_buffer_and_big_chunks(world, averagers, ranks_per_node, inter):
    a = averagers(ranks_per_node, inter, chunk_bytes=64 << 10)
    buf = random_data(world.Get_rank(), 3 * 41 * 1000, np.float32).reshape(3, 41, 1000)
    expected = raw_average(world, buf)
    a.average_(buf)
    np.testing.assert_allclose(buf, expected, rtol=2e-6, atol=2e-6)
    assert len(set(digests(world, buf))) == 1


@pytest.mark.parametrize("ranks_per_node, inter", LAYOUTS)
def test_identical_bits_after_every_round(world, averagers, ranks_per_node, inter):
    """Rounds of local drift + averaging (like local SGD): the models never drift apart."""
    a = averagers(ranks_per_node, inter, chunk_bytes=4096)
    rank = world.Get_rank()
    x = random_data(0, 3001, np.float32)  # same start everywhere
    rng = np.random.default_rng([rank, 99])
    for _ in range(4):
        x -= 0.01 * rng.standard_normal(x.size).astype(np.float32) * (1 + rank)  # ranks diverge
        if world.Get_size() > 1:
            assert len(set(digests(world, x))) == world.Get_size()
        a.average_(x)
        assert len(set(digests(world, x))) == 1


def test_sizes_and_dtypes_interleave_on_one_window(world, averagers):
    """One window serves every (length, dtype); plans are cached; mixing them cannot mix data."""
    a = averagers(None, "owners", chunk_bytes=2048)
    rank = world.Get_rank()
    for length, dtype in [(100, np.float32), (3000, np.float64), (100, np.float32), (1, np.float64),
                          (3000, np.float64), (777, np.float32)]:
        buf = int_data(rank, length, dtype)
        expected = raw_average(world, buf)
        a.average_(buf)
        np.testing.assert_array_equal(buf, expected)
    assert len(a._plans) == 4


# -- late arrival ------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks_per_node, inter", [(None, "owners"), (2, "owners"), (2, "leaders")])
def test_late_rank_is_waited_for(world, averagers, ranks_per_node, inter):
    """One rank reaches the averaging 0.2 s after the others: no hang, result still right."""
    a = averagers(ranks_per_node, inter, chunk_bytes=8192)
    n, rank = world.Get_size(), world.Get_rank()
    length = 5000
    for late in sorted({0, n - 1}):
        buf = int_data(rank + late, length, np.float64)
        expected = raw_average(world, buf)
        world.Barrier()
        if rank == late:
            time.sleep(0.2)
        a.average_(buf)
        np.testing.assert_array_equal(buf, expected)
        # ...and the next round, where the others are late, still works
        buf2 = int_data(rank + 1, length, np.float64)
        expected2 = raw_average(world, buf2)
        if rank != late:
            time.sleep(0.05)
        a.average_(buf2)
        np.testing.assert_array_equal(buf2, expected2)


# -- Comm integration --------------------------------------------------------------------------

def test_comm_rejects_unknown_averaging():
    with pytest.raises(ValueError, match="averaging"):
        Comm(averaging="nccl")


@pytest.mark.parametrize("mode", ["auto", "mpi", "shm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_comm_average_every_mode_counts_one_call(mode, dtype):
    c = Comm(averaging=mode)
    try:
        for length in (1, 1001, 4099):
            buf = int_data(c.rank, length, dtype)
            expected = raw_average(c.mpi, buf)
            assert c.average_(buf, label="grad") is buf
            np.testing.assert_array_equal(buf, expected)
            assert len(set(digests(c.mpi, buf))) == 1
        counter = c.stats.counters[("allreduce", "grad")]
        assert (counter.calls, counter.bytes) == (3, (1 + 1001 + 4099) * np.dtype(dtype).itemsize)
        assert set(c.stats.counters) == {("allreduce", "grad")}
        # small buffers: auto never builds the shared-memory machinery
        assert (c.averager is not None) == (mode == "shm")
    finally:
        c.free()
    assert c.averager is None and c.mpi == MPI.COMM_NULL
    c.free()  # idempotent


def test_comm_auto_uses_shm_for_big_buffers_when_nodes_hold_several_ranks():
    c = Comm(averaging="auto")
    try:
        length = SHM_AVERAGE_MIN_BYTES // 4 + 3
        buf = random_data(c.rank, length, np.float32)
        expected = raw_average(c.mpi, buf)
        c.average_(buf, label="big")
        np.testing.assert_allclose(buf, expected, rtol=2e-6, atol=2e-6)
        assert len(set(digests(c.mpi, buf))) == 1
        assert c.stats.counters[("allreduce", "big")].calls == 1
        assert c.stats.counters[("allreduce", "big")].bytes == buf.nbytes
        if c.size == 1:
            assert c.averager is None
        else:
            assert c.averager is not None and c.averager.worthwhile  # one machine: one node
            assert c.averager._plans  # it did run
    finally:
        c.free()


def test_comm_with_fake_nodes_and_mixed_paths():
    """Comm.average_ through an injected averager with nodes of 2, alternating with plain calls."""
    c = Comm(averaging="shm")
    try:
        c.averager = ShmAverager(c.mpi, ranks_per_node=2, chunk_bytes=512)
        for i in range(3):
            for dtype in DTYPES:
                buf = int_data(c.rank + i, 2049, dtype)
                expected = raw_average(c.mpi, buf)
                c.average_(buf, label="x")
                np.testing.assert_array_equal(buf, expected)
            small = np.arange(5, dtype=np.int64) * (c.rank + 1)  # other traffic in between
            c.allreduce_(small, label="y")
            np.testing.assert_array_equal(small, np.arange(5) * (c.size * (c.size + 1) // 2))
            c.average_(np.zeros(0), label="z")  # empty: the plain path
        assert c.stats.counters[("allreduce", "x")].calls == 6
        assert c.stats.counters[("allreduce", "z")].calls == 3
    finally:
        c.free()


def test_shm_supported():
    assert shm_supported(np.zeros(3, np.float32)) and shm_supported(np.zeros((2, 3)))
    assert not shm_supported(np.zeros(3, np.int64))
    assert not shm_supported(np.zeros(0))
    assert not shm_supported(np.zeros((4, 4))[:, 1])
    assert not shm_supported(np.zeros(3, ">f8"))
    assert not shm_supported([1.0, 2.0])


def test_one_rank_forced_shm_leaves_data_untouched():
    c = Comm(MPI.COMM_SELF, averaging="shm")
    try:
        buf = random_data(0, 1001, np.float32)
        ref = buf.copy()
        c.average_(buf)
        np.testing.assert_array_equal(buf, ref)
        assert c.averager is not None and c.averager.node_size == 1
    finally:
        c.free()


def test_shm_path_keeps_pointer_and_allocates_nothing_large():
    c = Comm(averaging="shm")
    try:
        c.averager = ShmAverager(c.mpi, chunk_bytes=256 << 10)
        buf = random_data(c.rank, 1 << 20, np.float32)  # 4 MB: 16 chunks
        address = buf.__array_interface__["data"][0]
        c.average_(buf)  # warm-up: window and plan are made here
        c.mpi.Barrier()
        out, allocated = peak_allocation(lambda: c.average_(buf))
        assert out is buf and buf.__array_interface__["data"][0] == address
        assert allocated < buf.nbytes // 100, f"shm average_ allocated {allocated} bytes"
    finally:
        c.free()


def test_bad_arguments_are_rejected(world):
    with pytest.raises(ValueError, match="inter"):
        ShmAverager(world, inter="ring")
    with pytest.raises(ValueError, match="chunk_bytes"):
        ShmAverager(world, chunk_bytes=8)
    with pytest.raises(ValueError, match="ranks_per_node"):
        ShmAverager(world, ranks_per_node=0)


class SlowCopyBack(np.ndarray):
    """A buffer whose in-place divisions (the shm path's copy-back) start 50 ms late."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if ufunc is np.divide:
            time.sleep(0.05)
        inputs = tuple(x.view(np.ndarray) if isinstance(x, SlowCopyBack) else x for x in inputs)
        if out is not None:
            out = tuple(x.view(np.ndarray) if isinstance(x, SlowCopyBack) else x for x in out)
            kwargs["out"] = out
        return getattr(ufunc, method)(*inputs, **kwargs)


@pytest.mark.parametrize("ranks_per_node, inter", [(None, "owners"), (2, "leaders")])
def test_slow_copy_back_then_another_size_does_not_mix_data(world, averagers, ranks_per_node, inter):
    """The last rank is still copying a result back while the others start the next average_
    of another size and dtype (another layout of the window): it must still read its result."""
    a = averagers(ranks_per_node, inter, chunk_bytes=4096)
    n, rank = world.Get_size(), world.Get_rank()
    for first, second in [((10, np.float32), (1000, np.float64)), ((100, np.float64), (900, np.float32))]:
        buf1 = int_data(rank, first[0], first[1])
        buf2 = int_data(rank + 3, second[0], second[1])
        expected1, expected2 = raw_average(world, buf1), raw_average(world, buf2)
        if rank == n - 1:
            buf1 = buf1.view(SlowCopyBack)
        a.average_(buf1)
        a.average_(buf2)
        np.testing.assert_array_equal(np.asarray(buf1), expected1)
        np.testing.assert_array_equal(buf2, expected2)


@pytest.mark.parametrize("ranks_per_node", [None, 1, 2])
def test_the_default_chunk_is_larger_across_nodes_and_the_bits_do_not_depend_on_it(world, ranks_per_node):
    """Across nodes the inter-node step moves bigger pieces (``SHM_CHUNK_BYTES_ACROSS_NODES``); a
    chunk only cuts the buffer, so any chunk size gives the same bits."""
    default = ShmAverager(world, ranks_per_node=ranks_per_node)
    small = ShmAverager(world, ranks_per_node=ranks_per_node, chunk_bytes=SHM_CHUNK_BYTES)
    try:
        spans = default.nodes > 1
        assert default.chunk_bytes == (SHM_CHUNK_BYTES_ACROSS_NODES if spans else SHM_CHUNK_BYTES)
        assert SHM_CHUNK_BYTES_ACROSS_NODES > SHM_CHUNK_BYTES
        length = 3 * SHM_CHUNK_BYTES_ACROSS_NODES // 4 + 17  # several small chunks, ragged
        a, b = (random_data(world.Get_rank(), length, np.float32) for _ in range(2))
        default.average_(a)
        small.average_(b)
        np.testing.assert_array_equal(a, b)
    finally:
        default.free()
        small.free()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [SHM_AVERAGE_MIN_BYTES // 4 + 13, 300_001])
def test_a_node_average_in_place_gives_the_node_groups_bits_and_count(dtype, size):
    """``Comm.node_average_`` of the node-shared model (two-level runs' node rounds): the bits
    and the count of the node group's own average of a copy (its copying path), round after
    round; where the model is not node-shared, that average itself."""
    comm = Comm(averaging="shm")
    try:
        values = random_data(comm.rank, size, dtype)
        shared = comm.shared_like(values)
        assert (shared is not values) == (comm.averaging_path(values) == "shm")
        copy = values.copy()
        comm.node_average_(shared, "group_average")
        node = comm.node_group("group_average").averager
        if shared is not values:  # in place: the node's own window was never needed
            assert node is None or node.win is None
        shared[...] = values
        comm.stats.reset()
        for _ in range(3):
            comm.node_average_(shared, "group_average")
            comm.node_group("group_average").average_(copy, "group_average")
            np.testing.assert_array_equal(shared, copy)
            shared += random_data(comm.rank + 1, size, dtype)
            copy += random_data(comm.rank + 1, size, dtype)
        counter = comm.stats.totals("group_average")
        assert (counter.calls, counter.bytes) == (6, 6 * values.nbytes)
        assert counter.in_node_calls == 6
    finally:
        comm.free()
