"""Comm on device buffers, without a GPU: both paths of hpcopt/comm/staging.py under MPI.

The fake device arrays (tests/fake_device.py) expose only ``__cuda_array_interface__`` over
host memory, so the straight-through path really hands MPI a "device" pointer, and the
staging path must move every byte through host buffers of its own.
"""

import numpy as np
import pytest

from hpcopt.comm import Comm
from hpcopt.comm.staging import DeviceTransport, PathChoice, run_selftest
from tests.fake_device import FakeDeviceBackend

pytestmark = pytest.mark.mpi

PATHS = {"straight": PathChoice(False, "test"), "staged": PathChoice(True, "test")}


def device_comm(comm: Comm, path: str) -> FakeDeviceBackend:
    backend = FakeDeviceBackend()
    comm.backend = backend
    comm.transport = DeviceTransport(backend, PATHS[path])
    return backend


def rank_data(comm: Comm, n: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(100 + comm.rank).standard_normal(n).astype(dtype)


def host_average(comm: Comm, values: np.ndarray) -> np.ndarray:
    """The same average on a plain NumPy buffer (the reference for both device paths)."""
    reference = Comm(comm.mpi, averaging="mpi", slice_bytes=comm.slice_bytes)
    try:
        return reference.average_(values.copy(), label="reference")
    finally:
        reference.free()


@pytest.mark.parametrize("path", ["straight", "staged"])
@pytest.mark.parametrize("slice_bytes", [1 << 20, 64])
def test_average_on_device_buffers_matches_host_bitwise(comm, path, slice_bytes):
    comm.slice_bytes = slice_bytes
    values = rank_data(comm, 1000)
    expected = host_average(comm, values)
    backend = device_comm(comm, path)
    buf = backend.asarray(values)
    comm.average_(buf)
    np.testing.assert_array_equal(buf.host, expected)
    assert comm.stats.counters[("allreduce", "average")].bytes == values.nbytes


def test_straight_through_hands_mpi_the_device_pointer_after_a_sync(comm):
    backend = device_comm(comm, "straight")
    buf = backend.asarray(rank_data(comm, 64))
    comm.average_(buf)
    events = backend.events
    assert "mpi" in events, "MPI never read the device array's interface"
    assert "sync" in events and events.index("sync") < events.index("mpi")
    assert "d2h" not in events and "h2d" not in events
    assert comm.transport.counts == {"allocations": 0, "to_host": 0, "to_device": 0}


def test_staging_copies_once_each_way_per_round_through_one_host_buffer(comm):
    comm.slice_bytes = 256  # 1000 float32 = 16 slices: still one copy each way
    backend = device_comm(comm, "staged")
    x, momentum = backend.asarray(rank_data(comm, 1000)), backend.asarray(rank_data(comm, 1000))
    for _ in range(3):
        comm.average_(x)
        comm.average_(momentum, label="momentum")
    assert "mpi" not in backend.events, "a staged device buffer reached MPI"
    assert comm.transport.counts == {"allocations": 1, "to_host": 6, "to_device": 6}
    rounds = [e for e in backend.events if e != "mpi"]
    assert rounds == ["sync", "d2h", "h2d"] * 6  # synchronized before every copy out


def test_bcast_staged_copies_out_on_the_root_and_in_elsewhere(comm):
    root = comm.size - 1
    backend = device_comm(comm, "staged")
    buf = backend.asarray(np.full(10, float(comm.rank)))
    comm.bcast_(buf, root=root)
    np.testing.assert_array_equal(buf.host, np.full(10, float(root)))
    copies = [e for e in backend.events if e in ("d2h", "h2d")]
    assert copies == (["d2h"] if comm.rank == root else ["h2d"])


@pytest.mark.parametrize("path", ["straight", "staged"])
def test_point_to_point_ring_on_device_buffers(comm, path):
    backend = device_comm(comm, path)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for round_ in range(2):
        out = backend.asarray(np.arange(6.0) + 10 * comm.rank + round_)
        into = backend.asarray(np.zeros(6))
        requests = [comm.irecv_(into, left, tag=3), comm.isend(out, right, tag=3)]
        comm.waitall(requests)
        np.testing.assert_array_equal(into.host, np.arange(6.0) + 10 * left + round_)
    if path == "staged":  # two pooled host buffers, reused in the second round
        assert comm.transport.counts == {"allocations": 2, "to_host": 2, "to_device": 2}
    else:
        assert comm.transport.counts["allocations"] == 0


def test_host_buffers_skip_the_device_path(comm):
    backend = device_comm(comm, "staged")
    total = comm.allreduce_scalar(1.0)
    assert total == comm.size
    assert "d2h" not in backend.events and "h2d" not in backend.events


@pytest.mark.parametrize("setting,staged", [("0", True), ("1", False)])
def test_path_is_decided_on_first_use_from_the_override(comm, monkeypatch, setting, staged):
    monkeypatch.setenv("HPCOPT_GPU_AWARE_MPI", setting)
    monkeypatch.delenv("HPCOPT_GPU_SELFTEST", raising=False)
    backend = FakeDeviceBackend()
    comm.backend = backend
    buf = backend.asarray(np.ones(8))
    comm.average_(buf)
    assert comm.transport.staged is staged
    assert f"HPCOPT_GPU_AWARE_MPI={setting}" in comm.transport.choice.why
    np.testing.assert_array_equal(buf.host, np.ones(8))


def test_selftest_child_runs_mpi_on_its_own_inside_a_job(comm):
    failures = comm.mpi.allgather(run_selftest(0, memory="host", timeout=60))
    assert failures == [None] * comm.size
