"""Flat vectors in node-shared memory, averaged in place (``ShmAverager.shared_empty``,
``Comm.shared_like``), under MPI at 1 to 4 ranks:

    mpiexec -n N python -m pytest --with-mpi -q -p no:cacheprovider tests/mpi/test_shm_window.py

The in-place average is bitwise the copying path's (the same slices, summation order and
division), on real and faked nodes (``ranks_per_node``); node leaders fall back to the copying
path. Training runs with ``--averaging shm`` give bitwise the state they gave with the model in
private memory, for the paths that stay on the copying side too (groups, partial
participation, batch-norm statistics, streaming fragments, the int8 wire). The windows are
freed with the averager unless an array still views them, and leave no file behind.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

from hpcopt import train
from hpcopt.comm import Comm
from hpcopt.comm.shm import SHM_AVERAGE_MIN_BYTES, ShmAverager
from hpcopt.config import build_config
from tests.runs import assert_same_state

pytestmark = pytest.mark.mpi

DTYPES = (np.float32, np.float64)
LAYOUTS = [(None, "owners"), (1, "owners"), (2, "owners"), (2, "leaders"), (3, "owners")]


def random_data(rank: int, length: int, dtype) -> np.ndarray:
    return np.random.default_rng([rank, length, 11]).standard_normal(length).astype(dtype)


def digests(mpi: MPI.Comm, buf: np.ndarray) -> list[str]:
    return mpi.allgather(hashlib.sha256(buf.tobytes()).hexdigest())


@pytest.fixture
def world():
    mpi = MPI.COMM_WORLD.Dup()
    yield mpi
    mpi.Free()


@pytest.fixture
def averagers(world):
    made: list[ShmAverager] = []

    def make(ranks_per_node=None, inter="owners", chunk_bytes=2048) -> ShmAverager:
        a = ShmAverager(world, ranks_per_node=ranks_per_node, inter=inter, chunk_bytes=chunk_bytes)
        made.append(a)
        return a

    yield make
    for a in made:
        a.free()


@pytest.mark.parametrize("ranks_per_node, inter", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_average_is_bitwise_the_copying_path(world, averagers, ranks_per_node, inter, dtype):
    """Rounds of diverging local updates, each averaged in place and, on a private copy, by
    the copying path of the same averager: the same bits, on every rank."""
    a = averagers(ranks_per_node, inter)
    rank = world.Get_rank()
    assert a.in_place == (inter == "owners" or a.nodes == 1)
    for length in (1, 17, 1001, 3001):  # one to 12 chunks, ragged slices
        x = a.shared_empty(length, dtype)
        x[...] = random_data(rank, length, dtype)
        private = x.copy()
        rng = np.random.default_rng([rank, length])
        for _ in range(2):
            assert a.average_(x) is x
            a.average_(private)
            np.testing.assert_array_equal(x, private)
            assert len(set(digests(world, x))) == 1
            drift = rng.standard_normal(length).astype(dtype) * (1 + rank)
            x -= drift
            private -= drift


@pytest.mark.parametrize("ranks_per_node, inter", [(None, "owners"), (2, "owners")])
def test_multidimensional_shared_array_and_plain_buffers_in_between(world, averagers,
                                                                   ranks_per_node, inter):
    a = averagers(ranks_per_node, inter, chunk_bytes=64 << 10)
    rank = world.Get_rank()
    x = a.shared_empty((3, 41, 100), np.float32)
    assert x.shape == (3, 41, 100) and x.flags.c_contiguous
    x[...] = random_data(rank, x.size, np.float32).reshape(x.shape)
    private = x.copy()
    other = random_data(rank + 5, 777, np.float64)  # a private buffer: the copying path
    expected_other = other.copy()
    world.Allreduce(MPI.IN_PLACE, expected_other, op=MPI.SUM)
    expected_other /= world.Get_size()
    a.average_(x)
    a.average_(other)
    a.average_(private)
    np.testing.assert_array_equal(x, private)
    np.testing.assert_allclose(other, expected_other, rtol=1e-14, atol=1e-14)
    view = x[1:]  # a view is not the array handed out: the copying path, the same result
    before = view.copy()
    a.average_(view)
    np.testing.assert_array_equal(view, before)  # already the average everywhere


def test_late_rank_finishes_writing_its_row_before_anyone_reads_it(world, averagers):
    """The last rank updates its row 0.2 s after the others entered the average: they wait."""
    a = averagers(None, "owners", chunk_bytes=8192)
    n, rank = world.Get_size(), world.Get_rank()
    x = a.shared_empty(5000, np.float64)
    x[...] = 0.0
    world.Barrier()
    if rank == n - 1:
        time.sleep(0.2)
    x[...] = rank + 1.0
    a.average_(x)
    np.testing.assert_array_equal(x, np.full(5000, (n + 1) / 2))
    x[...] = 2.0 * rank  # written right after: no owner may still be dividing into it
    a.average_(x)
    np.testing.assert_array_equal(x, np.full(5000, n - 1.0))


def test_comm_shared_like_only_where_the_shared_memory_path_runs():
    small = np.ones(10, np.float32)
    big = np.ones(SHM_AVERAGE_MIN_BYTES // 4 + 1, np.float32)
    for mode in ("mpi", "auto", "shm"):
        c = Comm(averaging=mode)
        try:
            for x in (small, big):
                shared = c.shared_like(x)
                takes_shm = mode == "shm" or (mode == "auto" and x is big and c.size > 1)
                assert (shared is not x) == takes_shm, (mode, x.size)
                np.testing.assert_array_equal(shared, x)
        finally:
            c.free()
    assert c.shared_like(np.ones(3, np.int64)).dtype == np.int64  # not floats: itself


def test_a_vector_stays_in_private_memory_where_a_node_has_no_room_for_it(monkeypatch):
    """A window larger than /dev/shm's room would end the job with a bus error on first write:
    shared_like keeps x private (the copying path, the same bits) unless every node has twice
    what the window needs, decided by every rank alike."""
    import hpcopt.comm.shm as shm

    assert shm.shm_free_bytes("/no/such/directory") == np.inf and shm.shm_free_bytes() > 0
    c = Comm(averaging="shm")
    try:
        start = random_data(c.rank, 100_003, np.float32)
        averager = c._averager_for(start)
        assert averager is not None
        needed = 2 * averager.node_size * (-(-start.nbytes // 4096) * 4096)
        assert averager.has_room(start.nbytes, free=needed)
        assert not averager.has_room(start.nbytes, free=needed - 1)
        # only node rank 0 reads the file system; its answer reaches every rank
        assert not averager.has_room(start.nbytes, free=0 if averager.node_rank == 0 else np.inf)
        monkeypatch.setattr(shm, "shm_free_bytes", lambda directory=shm.SHM_DIRECTORY: needed - 1)
        x = c.shared_like(start)
        assert x is start
        monkeypatch.setattr(shm, "shm_free_bytes", lambda directory=shm.SHM_DIRECTORY: needed)
        shared = c.shared_like(start.copy())
        assert shared is not start
        c.average_(x, label="private")
        c.average_(shared, label="shared")
        np.testing.assert_array_equal(x, shared)
    finally:
        c.free()


def test_comm_average_of_a_shared_vector_counts_one_call_and_matches_today():
    c = Comm(averaging="shm")
    try:
        start = random_data(c.rank, 100_003, np.float32)
        x, private = c.shared_like(start), start.copy()
        c.average_(x, label="x")
        c.average_(private, label="p")
        np.testing.assert_array_equal(x, private)
        assert len(set(digests(c.mpi, x))) == 1
        assert c.stats.counters[("allreduce", "x")].calls == 1
        assert c.stats.counters[("allreduce", "x")].bytes == x.nbytes
    finally:
        c.free()


def _big_files(before: set[str], at_least: int) -> list[str]:
    """Files in /dev/shm that were not in ``before`` and hold at least ``at_least`` bytes."""
    found = []
    for name in set(os.listdir("/dev/shm")) - before:
        try:
            if os.stat(os.path.join("/dev/shm", name)).st_size >= at_least:
                found.append(name)
        except FileNotFoundError:  # another process's segment, gone meanwhile
            pass
    return found


def test_windows_are_freed_unless_viewed_and_leave_no_file(world):
    rows = 3 << 20  # float32 per rank: a window of 12 MB per rank
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else None
    a = ShmAverager(world)
    kept = a.shared_empty(rows, np.float32)
    dropped = a.shared_empty(rows, np.float32)
    kept[...] = world.Get_rank()
    wins = [a._shared[id(kept)].win, a._shared[id(dropped)].win]
    if before is not None:  # the MPI library unlinks a segment once every rank has mapped it
        assert not _big_files(before, rows * 4), "a shared window left a file in /dev/shm"
    view = kept[10:20]
    del kept, dropped
    a.free()
    assert wins[1] == MPI.WIN_NULL  # nothing viewed it: freed
    assert wins[0] != MPI.WIN_NULL  # a view is alive: the window stays, and so does its data
    np.testing.assert_array_equal(view, np.full(10, world.Get_rank(), np.float32))
    a.free()  # idempotent


# -- training ----------------------------------------------------------------------------------

def train_config(**overrides):
    base = dict(dataset="digits", hidden="12", batch_size="8", steps="10", dtype="float64",
                lr="0.1", interval="3", progress="false", seed="3", momentum="0.9",
                averaging="shm")
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, {k: v for k, v in base.items() if v != "None"})


def run(config, shared: bool, monkeypatch):
    """The final state and which of its vectors lived in the averager's shared memory."""
    if not shared:
        monkeypatch.setattr(Comm, "shared_like", lambda self, x: x)
    comm = Comm()
    try:
        _, state = train(config, comm, verbose=False)
        windows = comm.averager._shared if comm.averager is not None else {}
        in_window = {name for name in ("x", "momentum", "exp_avg", "exp_avg_sq", "buffers")
                     if id(getattr(state, name, None)) in windows}
        return state, in_window
    finally:
        comm.free()
        monkeypatch.undo()


TRAINING_CASES = {
    "plain": {},
    # sgd's momentum averaged at the rounds: in shared memory too
    "momentum-average": {"momentum_policy": "average"},
    # adamw's moments, both averaged
    "adamw-average": {"inner_optimizer": "adamw", "lr": 0.01, "momentum": 0,
                      "momentum_policy": "average", "second_moment_policy": "average"},
    # two-level: group rounds on the group's Comm (the copying path), global rounds in place
    "groups": {"group_interval": 1, "interval": 4},
    # CELGC with partial participation (a plain allreduce of x and of b, both in shared memory)
    "participation": {"algorithm": "celgc", "gamma": 0.15, "participation": 0.5,
                      "momentum_policy": "average"},
    # batch-norm statistics (a private vector, the copying path) under "average"
    "batchnorm": {"model": "plain_cnn", "hidden": None, "channels": "3", "batch_norm": "true"},
    # streaming fragments (iallreduce of the fragment, not average_)
    "fragments": {"algorithm": "diloco", "momentum": 0, "fragments": 2, "overlap": 1},
    # int8 rounds with error feedback (the wire, not average_)
    "wire": {"wire": "int8", "outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9},
}


@pytest.mark.parametrize("case", list(TRAINING_CASES))
def test_training_with_the_model_in_shared_memory_is_bitwise_unchanged(case, monkeypatch):
    extra = dict(TRAINING_CASES[case])
    if case == "groups":
        extra["group_size"] = 2 if MPI.COMM_WORLD.Get_size() % 2 == 0 else 1
    config = train_config(**extra)
    ours, in_window = run(config, True, monkeypatch)
    today, was_in_window = run(config, False, monkeypatch)
    averaged = {"momentum-average": {"momentum"}, "adamw-average": {"exp_avg", "exp_avg_sq"},
                "participation": {"momentum"}}.get(case, set())
    assert in_window == {"x"} | averaged and not was_in_window
    assert_same_state(ours, today)
