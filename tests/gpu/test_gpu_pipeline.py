"""Pipeline runs (PPRS, pipelined AGD) on CuPy under MPI, one stage per rank at any world size:
against the same runs on CPU (float64), staged and straight through, checkpoints moving between
GPU and CPU, and (on the emulated CuPy) the host/device copies of an iteration."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt.algorithms.pprs import PPRS, PipelinedAGD
from hpcopt.backend import get_backend
from hpcopt.comm import node_layout
from hpcopt.comm.staging import DeviceTransport, PathChoice
from hpcopt.config import build_config
from hpcopt.problems.l1_chain import l1_chain
from hpcopt.problems.staged import setup_stage
from tests.gpu.test_gpu_mpi import straight_through_or_skip
from tests.runs import PIPELINE_TIME_COLUMNS, fresh_pipeline

pytestmark = pytest.mark.mpi

RUNS = {
    "pprs": {"samples": 3, "smoothing": 0.05, "momentum": 0.8, "lr": 0.02},
    "pprs-accelerated": {"samples": 3, "smoothing": 0.05, "outer": "accelerated"},
    "agd-1f1b": {"algorithm": "pipelined_agd", "momentum": 0.9, "lr": 0.02, "pipeline": "1f1b"},
    # a trainable perturbation on stage 0, frozen stages after it, margin loss on labels
    "pprs-attack": {"problem": "attack", "dataset": "mnist_idx", "hidden": "8,8,8",
                    "images": 4, "eps": 0.2, "samples": 3, "smoothing": 0.01, "lr": 0.05},
}
VECTORS = ("x", "prev", "z", "anchor", "grad_sum")


def config(device, directory, **overrides):
    base = dict(algorithm="pprs", problem="l1_chain", lr="0.02", dtype="float64", steps="8",
                trace_every="3", eval_every="4", progress="false", seed="5", out="",
                device=device, path=str(directory / "images"))
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, base)



def host_vectors(state, cupy):
    return {name: cupy.asnumpy(getattr(state, name)) if isinstance(getattr(state, name),
                                                                     cupy.ndarray)
            else getattr(state, name) for name in VECTORS if getattr(state, name) is not None}


@pytest.mark.parametrize("path", ["staged", "straight"])
@pytest.mark.parametrize("run", RUNS)
def test_pipeline_run_on_gpu_matches_the_same_run_on_cpu(comm, cupy, monkeypatch, shared_dir, path,
                                                        run):
    if path == "straight":
        straight_through_or_skip()
    else:
        monkeypatch.setenv("HPCOPT_GPU_AWARE_MPI", "0")
    gpu_summary, gpu_state = fresh_pipeline(config("gpu", shared_dir, **RUNS[run]))
    cpu_summary, cpu_state = fresh_pipeline(config("cpu", shared_dir, **RUNS[run]))
    assert isinstance(gpu_state.x, cupy.ndarray) and isinstance(cpu_state.x, np.ndarray)
    gpu_vectors, cpu_vectors = host_vectors(gpu_state, cupy), host_vectors(cpu_state, cupy)
    assert gpu_vectors.keys() == cpu_vectors.keys()
    for name, want in cpu_vectors.items():
        np.testing.assert_allclose(gpu_vectors[name], want, rtol=1e-9, atol=1e-12, err_msg=name)
    assert (gpu_state.step, gpu_state.alpha) == (cpu_state.step, pytest.approx(cpu_state.alpha))
    assert gpu_summary.final_loss == pytest.approx(cpu_summary.final_loss, rel=1e-9)
    assert gpu_summary.messages == cpu_summary.messages
    assert len(gpu_summary.history) == len(cpu_summary.history) == 4  # rows at 3, 4, 6, 8
    for got, want in zip(gpu_summary.history, cpu_summary.history):
        assert got.keys() == want.keys()  # the same per-stage columns
        for column, value in want.items():
            if column not in PIPELINE_TIME_COLUMNS and not column.startswith(("busy_", "idle_")):
                assert got[column] == pytest.approx(value, rel=1e-9, nan_ok=True), column


@pytest.mark.parametrize("first,then", [("gpu", "cpu"), ("cpu", "gpu")])
@pytest.mark.parametrize("run", ["pprs", "pprs-accelerated"])
def test_pipeline_checkpoint_moves_between_gpu_and_cpu(comm, cupy, monkeypatch, shared_dir, run,
                                                       first, then):
    monkeypatch.setenv("HPCOPT_GPU_AWARE_MPI", "0")
    options = dict(RUNS[run], checkpoint_every=5)
    _, whole = fresh_pipeline(config("cpu", shared_dir, steps=10, **options))
    part, _ = fresh_pipeline(config(first, shared_dir, steps=5, out=shared_dir / "part", **options))
    assert part.checkpoint.endswith("step-000000005.h5")
    summary, resumed = fresh_pipeline(config(then, shared_dir, steps=10, **options),
                                 resume=shared_dir / "part")
    assert isinstance(resumed.x, np.ndarray if then == "cpu" else cupy.ndarray)
    assert summary.steps == 10
    got, want = host_vectors(resumed, cupy), host_vectors(whole, cupy)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-12, err_msg=name)
    assert (resumed.step, resumed.alpha) == (whole.step, pytest.approx(whole.alpha))


@pytest.mark.parametrize("path", ["staged", "straight"])
@pytest.mark.parametrize("algorithm", ["pprs", "agd"])
def test_host_device_copies_per_iteration_are_bounded(comm, cupy, path, algorithm):
    """Per iteration of K samples, on the l1 chain (every stage holds parameters):

    - one host-to-device copy on every stage for PPRS (its K noise blocks, drawn on the host and
      copied in one batch; none for AGD, which has no noise);
    - one device-to-host copy on the last stage (the mean of the K losses, summed on the device);
    - staged, one more copy per message: each activation or gradient sent goes to the host
      (d2h) and each one received comes back (h2d); K of each per boundary. Straight through,
      none: activations, gradients and the update never leave the device.
    """
    if not getattr(cupy, "EMULATED", False):
        pytest.skip("counts host/device copies: needs the emulated CuPy's counters")
    comm.backend = get_backend("gpu", local_rank=node_layout(comm.mpi)[0])
    comm.transport = DeviceTransport(comm.backend, PathChoice(path == "staged", "test"))
    problem = l1_chain(blocks=8, block_dim=2, rows=20, seed=1, xp=cupy)
    setup = setup_stage(problem, comm, kind="gpipe")
    samples = 4 if algorithm == "pprs" else 1
    algo = (PPRS(samples=samples, smoothing=0.01, lr=0.01, seed=3) if algorithm == "pprs"
            else PipelinedAGD(lr=0.01, momentum=0.9))
    state = algo.init(setup.x0, comm)
    algo.step(state, setup.pipeline.gradient, comm)  # first iteration: buffers allocated
    iterations = 5
    cupy.reset_transfers()
    for _ in range(iterations):
        algo.step(state, setup.pipeline.gradient, comm)
    first, last = comm.rank == 0, comm.rank == comm.size - 1
    sent = samples * ((not last) + (not first))  # activations down, gradients up
    staged = path == "staged"
    h2d = (algorithm == "pprs") + staged * sent   # noise; staged receives (as many as sends)
    d2h = last + staged * sent                    # the loss; staged sends
    assert cupy.transfers["h2d"] == iterations * h2d, dict(cupy.transfer_sites)
    assert cupy.transfers["d2h"] == iterations * d2h, dict(cupy.transfer_sites)
