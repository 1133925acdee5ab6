"""CuPy backend, one process: device choice, pinned copies, and every model's gradient oracle on
the GPU against the same oracle on NumPy (float64, the same minibatches)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hpcopt.backend import get_backend
from hpcopt.build import build_run
from hpcopt.config import build_config
from tests.gpu.tiny_images import write_tiny_mnist
from tests.mpi.lm_corpus import write_tiny_ptb

MODELS = {
    "mlp": {"hidden": "16,12"},
    "plain_cnn-batch-norm": {"model": "plain_cnn", "hidden": None, "channels": "3,4",
                             "batch_norm": "true", "augment": "true"},
    "resnet": {"model": "resnet", "hidden": None, "depth": 8, "width": 4},
    "lstm": {"dataset": "ptb", "model": "lstm", "hidden": "8,8", "embed": 6, "batch_size": 3,
             "bptt": 7, "algorithm": "celgc", "gamma": 0.3},
}


def config(device, directory: Path, **overrides):
    base = dict(dataset="mnist_idx", batch_size="8", steps="20", dtype="float64", lr="0.1",
                progress="false", seed="3", device=device)
    base.update({k: str(v) for k, v in overrides.items()})
    base["path"] = str(directory / ("ptb" if base["dataset"] == "ptb" else "images"))
    return build_config(None, {k: v for k, v in base.items() if v != "None"})


def test_device_selection_and_pinned_copies(cupy):
    backend = get_backend("gpu", local_rank=0)
    assert backend.is_gpu and backend.device == 0 == cupy.cuda.Device().id
    host = backend.empty_pinned(1000, np.float32)
    pointer = cupy.cuda.runtime.pointerGetAttributes(host.ctypes.data)
    assert pointer.type == 1  # cudaMemoryTypeHost: page-locked, not pageable (0)
    device = cupy.arange(1000, dtype=cupy.float32).reshape(10, 100)
    backend.copy_to_host_(device, host)
    np.testing.assert_array_equal(host, np.arange(1000))
    backend.copy_from_host_(device, host * 3)
    np.testing.assert_array_equal(cupy.asnumpy(device).ravel(), np.arange(1000) * 3)


@pytest.mark.parametrize("name", MODELS)
def test_oracle_on_gpu_matches_numpy(cupy, tmp_path, name):
    write_tiny_ptb(tmp_path / "ptb")
    write_tiny_mnist(tmp_path / "images")
    stand_in = SimpleNamespace(rank=0, size=1)
    cpu = build_run(config("cpu", tmp_path, **MODELS[name]), stand_in).workload
    gpu = build_run(config("gpu", tmp_path, **MODELS[name]), stand_in).workload
    assert isinstance(gpu.x0, cupy.ndarray) and gpu.x0.dtype == cupy.float64
    np.testing.assert_array_equal(cupy.asnumpy(gpu.x0), cpu.x0)
    grad_cpu, grad_gpu = np.zeros_like(cpu.x0), cupy.zeros_like(gpu.x0)
    for _ in range(3):  # consecutive minibatches (and a carried LSTM state)
        loss_cpu = cpu.problem.oracle(cpu.x0, grad_cpu)
        loss_gpu = gpu.problem.oracle(gpu.x0, grad_gpu)
        assert isinstance(loss_gpu, cupy.ndarray), "the loss left the device"
        assert float(loss_gpu) == pytest.approx(float(loss_cpu), rel=1e-9)
        np.testing.assert_allclose(cupy.asnumpy(grad_gpu), grad_cpu, rtol=1e-7, atol=1e-10)
