"""CuPy under MPI at any world size: Comm on device buffers (staged, and straight through when
the MPI is CUDA-aware), PR-SGD and CELGC against their serial references, a staged GPU run
against the same run on CPU, and checkpoints moving between GPU and CPU runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hpcopt import train
from hpcopt.comm.mpi_support import cuda_aware_mpi
from hpcopt.comm.staging import DeviceTransport, PathChoice, choose_path, env_flag
from hpcopt.config import build_config
from tests.reference import celgc_reference, prsgd_reference, worker_parts
from tests.runs import fresh_train

pytestmark = pytest.mark.mpi


def straight_through_or_skip() -> None:
    """Skip unless device buffers may go to MPI directly here (by the same rule as a run)."""
    query, why = cuda_aware_mpi()
    choice = choose_path(query, why, env_flag("HPCOPT_GPU_AWARE_MPI"))
    if choice.staged:
        pytest.skip(f"this MPI is not known to be CUDA-aware ({choice.why})")


@pytest.fixture
def staged(monkeypatch):
    """Runs in this test stage device buffers through host memory."""
    monkeypatch.setenv("HPCOPT_GPU_AWARE_MPI", "0")


def small_config(directory, **overrides):
    """A small PR-SGD run on the tiny image set in ``directory`` (no data-set package needed)."""
    base = dict(dataset="mnist_idx", path=str(directory / "images"), hidden="12", batch_size="8",
                steps="23", dtype="float64", lr="0.1", interval="4", progress="false", seed="3",
                device="gpu")
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, base)


def on_cpu(config):
    return dataclasses.replace(config, run=dataclasses.replace(config.run, device="cpu"))


# -- Comm on device buffers -------------------------------------------------------------------

@pytest.mark.parametrize("path", ["staged", "straight"])
@pytest.mark.parametrize("slice_bytes", [1 << 20, 4096])
def test_average_of_device_buffers_matches_host(gpu_comm, cupy, path, slice_bytes):
    if path == "straight":
        straight_through_or_skip()
    comm = gpu_comm
    comm.slice_bytes = slice_bytes
    comm.transport = DeviceTransport(comm.backend, PathChoice(path == "staged", "test"))
    values = np.random.default_rng(comm.rank).standard_normal(10_000).astype(np.float32)
    expected = values.copy()
    comm.allreduce_(expected, label="reference")
    expected /= comm.size
    buf = cupy.asarray(values)
    for _ in range(2):
        buf[...] = cupy.asarray(values)
        comm.average_(buf)
    np.testing.assert_array_equal(cupy.asnumpy(buf), expected)
    counts = comm.transport.counts
    if path == "staged":
        assert counts == {"allocations": 1, "to_host": 2, "to_device": 2}
    else:
        assert counts["to_host"] == 0


def test_bcast_and_ring_on_device_buffers_staged(gpu_comm, cupy):
    comm = gpu_comm
    comm.transport = DeviceTransport(comm.backend, PathChoice(True, "test"))
    buf = cupy.full(100, float(comm.rank))
    comm.bcast_(buf, root=comm.size - 1)
    assert float(buf.min()) == float(buf.max()) == comm.size - 1
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    out, into = cupy.arange(50.0) + comm.rank, cupy.zeros(50)
    comm.waitall([comm.irecv_(into, left, tag=5), comm.isend(out, right, tag=5)])
    np.testing.assert_array_equal(cupy.asnumpy(into), np.arange(50.0) + left)


# -- algorithms on the GPU --------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [
    {},
    {"interval": 1},
    {"momentum": 0.9, "nesterov": "true", "momentum_policy": "average"},
])
def test_prsgd_on_gpu_matches_the_serial_reference(comm, cupy, staged, shared_dir, overrides):
    config = small_config(shared_dir, **overrides)
    summary, state = train(config, comm, verbose=False)
    assert isinstance(state.x, cupy.ndarray)
    assert comm.transport is not None and comm.transport.staged
    expected = prsgd_reference(on_cpu(config), comm.size)
    np.testing.assert_allclose(cupy.asnumpy(state.x), expected, rtol=1e-8, atol=1e-10)
    assert summary.rounds == 23 // config.algorithm.interval


def test_celgc_lstm_on_gpu_matches_the_serial_reference(comm, cupy, staged, shared_dir):
    config = build_config(None, dict(
        dataset="ptb", path=str(shared_dir / "ptb"), model="lstm", hidden="6", embed="6",
        tie="true", batch_size="3", bptt="7", steps="13", dtype="float64", lr="2", interval="4",
        progress="false", seed="5", algorithm="celgc", gamma="0.3", momentum="0.5", device="gpu"))
    _, state = train(config, comm, verbose=False)
    parts = worker_parts(on_cpu(config), comm.size)
    schedule, algo = parts[0].algorithm.lr_at, config.algorithm
    models, counts = celgc_reference(parts[0].workload.x0, [p.workload.problem.oracle for p in parts],
                                     config.run.steps, algo.interval, lr=schedule, gamma=algo.gamma,
                                     base_lr=algo.lr, momentum=algo.momentum)
    np.testing.assert_allclose(cupy.asnumpy(state.x), sum(models) / comm.size, rtol=1e-8, atol=1e-10)
    assert state.clip_count == counts[comm.rank]


@pytest.mark.parametrize("path", ["staged", "straight"])
def test_gpu_run_matches_the_same_run_on_cpu(comm, cupy, monkeypatch, shared_dir, path):
    """float32, momentum, evaluation: the GPU run (staged or straight through) against the CPU
    run to float tolerance."""
    if path == "straight":
        straight_through_or_skip()
    else:
        monkeypatch.setenv("HPCOPT_GPU_AWARE_MPI", "0")
    config = small_config(shared_dir, dtype="float32", momentum=0.9, steps=40, eval_every=10,
                          hidden="32")
    gpu_summary, gpu_state = fresh_train(config)
    cpu_summary, cpu_state = fresh_train(on_cpu(config))
    np.testing.assert_allclose(cupy.asnumpy(gpu_state.x), cpu_state.x, rtol=1e-3, atol=1e-4)
    assert gpu_summary.final.loss == pytest.approx(cpu_summary.final.loss, rel=1e-3)
    assert abs(gpu_summary.final.accuracy - cpu_summary.final.accuracy) <= 0.02
    assert gpu_summary.rounds == cpu_summary.rounds
    assert gpu_summary.average_bytes_per_rank == cpu_summary.average_bytes_per_rank


# -- checkpoints between devices --------------------------------------------------------------

@pytest.mark.parametrize("first,then", [("gpu", "cpu"), ("cpu", "gpu")])
def test_checkpoint_moves_between_gpu_and_cpu(comm, cupy, staged, shared_dir, first, then):
    def config(device, out, steps):
        return small_config(shared_dir, device=device, steps=steps, momentum=0.9, out=str(out),
                            checkpoint_every=6, trace_every=3)

    _, whole = fresh_train(config("cpu", shared_dir / "whole", 24))
    fresh_train(config(first, shared_dir / "part", 12))
    summary, resumed = fresh_train(config(then, shared_dir / "part", 24), resume=shared_dir / "part")
    assert not summary.stopped and summary.steps == 24
    x = resumed.x if then == "cpu" else cupy.asnumpy(resumed.x)
    momentum = resumed.momentum if then == "cpu" else cupy.asnumpy(resumed.momentum)
    assert isinstance(x, np.ndarray)
    np.testing.assert_allclose(x, whole.x, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(momentum, whole.momentum, rtol=1e-8, atol=1e-10)
