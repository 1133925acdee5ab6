"""Host <-> device traffic of a GPU training run, counted by the emulated CuPy.

The GPU path promises no transfer per step: the model crosses to the host only to be staged for
MPI (one copy each way per averaged buffer and round), the trace reads its scalars once per row
(losses, clip count and ||g||^2 together), and the sampler copies an epoch's visiting order once
per epoch. So running more steps may add exactly those copies and nothing else. Each rank counts
its own traffic; under mpiexec every rank runs the same check. The counts come
from tests/emulated_gpu (real CuPy does not count), so these tests skip on a real GPU.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from mpi4py import MPI

from hpcopt.config import build_config
from tests.gpu.tiny_images import write_tiny_mnist
from tests.mpi.lm_corpus import write_tiny_ptb
from tests.runs import fresh_train

STEPS, MORE, INTERVAL, TRACE_EVERY = 48, 96, 8, 24
IMAGES, BATCH = 480, 8  # write_tiny_mnist's training set, shared equally by the ranks

RUNS = {  # name -> (overrides, buffers averaged a round, whether epochs are sampled)
    "prsgd-mlp": ({"hidden": "12"}, 1, True),
    "celgc-mlp-momentum": ({"hidden": "12", "algorithm": "celgc", "gamma": "0.05",
                            "momentum": "0.9"}, 1, True),
    "prsgd-cnn-batch-norm": ({"model": "plain_cnn", "channels": "3,4", "batch_norm": "true"}, 2, True),
    "celgc-lstm": ({"dataset": "ptb", "model": "lstm", "hidden": "6", "embed": "6",
                    "batch_size": "3", "bptt": "7", "algorithm": "celgc", "gamma": "0.3"}, 1, False),
}


@pytest.fixture
def cupy_counting(cupy):
    if not getattr(cupy, "EMULATED", False):
        pytest.skip("transfers are counted only by the emulated CuPy (tests/emulated_gpu)")
    return cupy


def traffic(cupy, directory: Path, steps: int, overrides: dict[str, str]) -> dict[str, int]:
    settings = dict(dataset="mnist_idx", batch_size=str(BATCH), steps=str(steps), dtype="float32",
                    lr="0.1", interval=str(INTERVAL), trace_every=str(TRACE_EVERY),
                    progress="false", seed="3", device="gpu", out=str(directory / f"run{steps}"))
    settings.update(overrides)
    settings["path"] = str(directory / ("ptb" if settings["dataset"] == "ptb" else "images"))
    cupy.reset_transfers()
    fresh_train(build_config(None, settings))
    return dict(cupy.transfers)


@pytest.mark.parametrize("name", RUNS)
def test_more_steps_add_only_round_row_and_epoch_copies(cupy_counting, tmp_path, monkeypatch, name):
    monkeypatch.setenv("HPCOPT_GPU_AWARE_MPI", "0")  # staged: the copies this test counts
    write_tiny_mnist(tmp_path / "images")
    write_tiny_ptb(tmp_path / "ptb")
    overrides, buffers, sampled = RUNS[name]
    before = traffic(cupy_counting, tmp_path, STEPS, overrides)
    after = traffic(cupy_counting, tmp_path, MORE, overrides)
    rounds, rows = (MORE - STEPS) // INTERVAL, (MORE - STEPS) // TRACE_EVERY
    batches = IMAGES // MPI.COMM_WORLD.Get_size() // BATCH  # a rank's batches an epoch
    epochs = math.ceil(MORE / batches) - math.ceil(STEPS / batches) if sampled else 0
    extra = {kind: after[kind] - before[kind] for kind in after}
    sites = sorted(cupy_counting.transfer_sites.items())
    assert extra["d2h"] == buffers * rounds + rows, sites
    assert extra["h2d"] == buffers * rounds + epochs, sites
