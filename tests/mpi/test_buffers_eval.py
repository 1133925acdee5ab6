"""Batch-norm statistics in the training loop, at any world size (1 to 4 ranks):

    mpiexec -n N python -m pytest --with-mpi -p no:cacheprovider tests/mpi/test_buffers_eval.py

A mid-round evaluation of the averaged model uses the statistics the policy would leave (and
leaves the training statistics alone); the policy is recorded in the trace and the checkpoint,
and a resume may not change it. On CPU, and on the GPU (compared on host copies).
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt.build import build_run
from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from hpcopt.io.trace import read_trace
from hpcopt.run.data_parallel import evaluate_average
from tests.conftest import host, use_device
from tests.runs import fresh_train

pytestmark = pytest.mark.mpi

POLICIES = ("local", "average", "rank0")


def bn_config(policy: str, **overrides):
    values = dict(dataset="digits", model="plain_cnn", channels="3", batch_norm="true",
                  batch_size="8", dtype="float64", interval="4", progress="false", seed="5",
                  buffer_policy=policy, out="")
    values.update(overrides)
    return build_config(None, values)


def what_the_policy_leaves(buffers: np.ndarray, policy: str, comm) -> np.ndarray:
    """The statistics after ``policy``, computed from every rank's buffer (host copies, not via
    sync_buffers)."""
    everyone = np.stack(comm.mpi.allgather(host(buffers)))
    leaves = {"local": host(buffers), "average": everyone.mean(axis=0), "rank0": everyone[0]}
    return leaves[policy].copy()


@pytest.mark.parametrize("policy", POLICIES)
def test_mid_round_evaluation_uses_the_policys_statistics(comm, policy, device):
    parts = build_run(bn_config(policy, device=device), use_device(comm, device))
    state = parts.algorithm.init(parts.workload.x0, comm, buffers=parts.workload.buffers)
    for _ in range(2):  # half a round: the ranks' parameters and statistics differ
        parts.algorithm.step(state, parts.workload.problem.oracle, comm)
    assert state.steps_in_round == 2
    x, buffers = state.x.copy(), state.buffers.copy()
    xp = parts.backend.xp

    got = evaluate_average(parts, state, xp.empty_like(state.x), comm)

    np.testing.assert_array_equal(host(state.x), host(x))  # training state untouched
    np.testing.assert_array_equal(host(state.buffers), host(buffers))
    assert parts.workload.problem.model.buffers is state.buffers
    average = xp.asarray(np.stack(comm.mpi.allgather(host(x))).mean(axis=0))
    expected = parts.workload.evaluate(average, xp.empty_like(x), comm,
                              buffers=xp.asarray(what_the_policy_leaves(buffers, policy, comm)))
    assert got.accuracy == expected.accuracy
    assert got.loss == pytest.approx(expected.loss, rel=1e-12)
    own = parts.workload.evaluate(average, xp.empty_like(x), comm, buffers=buffers.copy())
    if policy != "local" and comm.size > 1:  # the ranks' own statistics would give another loss
        assert own.loss != pytest.approx(got.loss, rel=1e-12)


def test_policy_is_recorded_in_trace_and_checkpoint(comm, shared_dir, device):
    out = shared_dir / "run"
    _, state = fresh_train(bn_config("rank0", steps="6", out=str(out), device=device))
    # the run ended mid-round: the final average applied rank0 to every rank's statistics
    everyone = np.stack(comm.mpi.allgather(host(state.buffers)))
    assert (everyone == everyone[0]).all()
    if comm.rank == 0:
        assert read_trace(out / "trace.h5").config.algorithm.buffer_policy == "rank0"
        ckpt = read_checkpoint(out)  # taken at the last step, before that final average
        assert ckpt.config.algorithm.buffer_policy == "rank0"
        assert ckpt.rows["buffers"].shape == (comm.size, state.buffers.size)
    comm.mpi.Barrier()
    with pytest.raises(HpcoptError, match="cannot change buffer_policy"):
        fresh_train(bn_config("average", steps="8", out=str(out), device=device), resume=out)
