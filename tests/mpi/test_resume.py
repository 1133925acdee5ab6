"""Checkpoint, stop and resume under MPI at any world size: the continued run is bitwise the
uninterrupted one (parameters, momentum, losses, trace), on CPU and for some cases on the GPU
(the state compared on host copies)."""

from __future__ import annotations

import os
import shutil
import signal

import h5py
import numpy as np
import pytest

from hpcopt.algorithms.streaming import FRAGMENT_LABEL
from hpcopt.config import build_config
from hpcopt.io import digest
from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from hpcopt.io.digest import verify
from hpcopt.io.trace import COLUMNS, read_trace
from hpcopt.problems.classification import ClassificationProblem
from tests.conftest import host, on_devices
from tests.mpi.lm_corpus import write_tiny_ptb
from tests.runs import assert_same_state, fresh_train

pytestmark = pytest.mark.mpi

TIME_COLUMNS = {"wall"}


def config(out, **overrides):
    base = dict(dataset="digits", hidden="12", batch_size="8", dtype="float64", lr="0.1",
                interval="4", progress="false", seed="3", momentum="0.9", trace_every="3",
                out=str(out))
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, {k: v for k, v in base.items() if v != "None"})  # None: drop a key


def assert_same_run(a_state, b_state, a_dir, b_dir, rank, ignored_labels=()):
    """The states are bitwise the same (``assert_same_state``), and so are the traces (but the
    counters of ``ignored_labels``)."""
    assert_same_state(a_state, b_state)
    if rank != 0:
        return
    a, b = read_trace(a_dir / "trace.h5"), read_trace(b_dir / "trace.h5")
    assert a.rows == b.rows > 0
    assert sorted(a.columns) == sorted(b.columns)
    for name in set(a.columns) - TIME_COLUMNS:
        np.testing.assert_array_equal(a.columns[name], b.columns[name], err_msg=name)
    labels = set(a.comm) - set(ignored_labels)
    assert labels == set(b.comm) - set(ignored_labels)
    for label in labels:
        for field in ("calls", "bytes", "in_node_calls", "in_node_bytes", "modelled"):
            # a non-blocking reduction's modelled seconds subtract the computation it measured
            # overlapping (costmodel.comm_modelled): wall-clock, so not bitwise
            if field not in a.comm[label] or (field == "modelled" and label == FRAGMENT_LABEL):
                continue
            np.testing.assert_array_equal(a.comm[label][field], b.comm[label][field],
                                          err_msg=f"{label} {field}")
    for key in ("eval_loss", "eval_accuracy", "eval_perplexity"):
        assert a.summary.get(key) == b.summary.get(key), key


def heterogeneous(size):
    return {"local_steps": ",".join(str(2 + r % 3) for r in range(size)), "interval": 3,
            "momentum": 0.5}


RESUME_CASES = ["momentum", "nesterov-average-eval", "heterogeneous", "shared-memory-averaging",
                "celgc", "lstm", "batchnorm", "batchnorm-local", "batchnorm-celgc",
                "batchnorm-naive-clip", "slowmo", "slowmo-heterogeneous", "celgc-diloco", "streaming",
                "batchnorm-streaming", "two-level", "overlapped", "celgc-wire", "celgc-heterogeneous",
                "celgc-streaming"]


# on the GPU: device state written and read back, the clipping counters, the LSTM hidden state
# and batch-norm statistics with evaluation
@pytest.mark.parametrize("case, device", on_devices(RESUME_CASES, ["momentum", "celgc", "lstm",
                                                                   "batchnorm", "batchnorm-celgc"]),
                         indirect=["device"])
def test_train_checkpoint_resume_is_bitwise_identical_to_one_run(comm, shared_dir, case, device):
    steps = 10
    extra = {"momentum": {}, "heterogeneous": heterogeneous(comm.size),
             "nesterov-average-eval": {"nesterov": "true", "momentum_policy": "average",
                                       "eval_every": 4},
             # 19,210 float64 parameters: past SHM_AVERAGE_MIN_BYTES, the other averaging path,
             # with the model in node-shared memory, averaged in place (on one rank too)
             "shared-memory-averaging": {"hidden": 256, "averaging": "shm"},
             # clipping counters, clip_fraction rows, a global norm and partial participation
             "celgc": {"algorithm": "celgc", "gamma": 0.15, "clip_norm": "global",
                       "weight_decay": 1e-3, "participation": 0.5, "momentum_policy": "average",
                       "eval_every": 4},
             # the LSTM hidden state carried across windows, mid-epoch and mid-round
             "lstm": {"dataset": "ptb", "path": str(shared_dir / "ptb"), "model": "lstm",
                      "hidden": "8,8", "embed": 6, "batch_size": 3, "bptt": 7,
                      "algorithm": "celgc", "gamma": 0.3, "lr": 2, "eval_every": 4},
             # batch-norm statistics per rank, augmentation, mid-round evaluation (I=4, eval
             # every 3: a scratch copy of the statistics under the policy) and checkpoint
             "batchnorm": {"model": "plain_cnn", "hidden": None, "channels": "3,4",
                           "batch_norm": "true", "augment": "true", "eval_every": 3},
             "batchnorm-local": {"model": "plain_cnn", "hidden": None, "channels": "3",
                                 "batch_norm": "true", "buffer_policy": "local",
                                 "eval_every": 3},
             # the same with the clipping algorithms (statistics synced at CELGC's rounds, and
             # every step in the baseline)
             "batchnorm-celgc": {"model": "plain_cnn", "hidden": None, "channels": "3,4",
                                 "batch_norm": "true", "algorithm": "celgc", "gamma": 0.2,
                                 "buffer_policy": "rank0", "eval_every": 3},
             "batchnorm-naive-clip": {"model": "plain_cnn", "hidden": None, "channels": "3",
                                      "batch_norm": "true", "algorithm": "naive_clip",
                                      "interval": None, "gamma": 0.2, "eval_every": 3},
             # an algorithm added as one file (hpcopt/algorithms/slowmo.py): its state (the
             # round's start and the slow momentum, the same on every rank) resumes by its
             # declarations, mid-round and with momentum averaged at the rounds
             "slowmo": {"algorithm": "slowmo", "slow_momentum": 0.6, "slow_lr": 0.9,
                        "momentum_policy": "average", "eval_every": 3},
             "slowmo-heterogeneous": {**heterogeneous(comm.size), "algorithm": "slowmo"},
             # CELGC with DiLoCo's optimizers: adamw's moments per rank (v reset at each round),
             # the outer step's anchor and Nesterov buffer (shared), partial participation; the
             # checkpoint at 10 is mid-round, and the run ends on a complete round (I = 4
             # divides 20), whose outer step the final average takes
             "celgc-diloco": {"algorithm": "celgc", "gamma": 0.015, "lr": 0.01, "momentum": 0,
                              "inner_optimizer": "adamw", "second_moment_policy": "reset",
                              "outer_optimizer": "nesterov", "outer_lr": 0.7,
                              "outer_momentum": 0.9, "participation": 0.5, "eval_every": 3},
             # DiLoCo streamed in 3 fragments (H = 4, tau = 1): the checkpoint at 10 holds
             # fragment 2's reduction in flight; the trace's peak_bytes_in_flight column and
             # the network model's columns go on
             "streaming": {"algorithm": "diloco", "momentum": 0, "fragments": 3, "overlap": 1,
                           "fragment_mix": 0.75, "eval_every": 3, "network": "eth1"},
             # a streaming run's batch-norm statistics (synced at its rounds of H steps) resume
             "batchnorm-streaming": {"model": "plain_cnn", "hidden": None, "channels": "3",
                                     "batch_norm": "true", "algorithm": "diloco", "momentum": 0,
                                     "fragments": 2, "overlap": 1, "eval_every": 3},
             # PR-SGD whose whole-model round overlaps 3 steps, delayed averaging: the
             # checkpoint at 10 holds the round sent at 8 in flight (due at 11)
             "overlapped": {"overlap": 3, "overlap_rule": "delayed", "interval": 4,
                            "momentum": 0.9, "network": "eth1"},
             # group averages (hpcopt/algorithms/groups.py; groups of 2 on an even world) and
             # int8 rounds with error feedback (hpcopt/comm/wire.py) under DiLoCo's outer step:
             # the checkpoint at 10 follows a group round, and the resumed run's modelled
             # seconds price group_average on the group's ranks from its first row
             "two-level": {"group_size": 2 if comm.size % 2 == 0 else 1, "group_interval": 2,
                           "network": "eth10", "wire": "int8", "outer_optimizer": "nesterov",
                           "outer_lr": 0.7, "outer_momentum": 0.9},
             # CELGC with the pieces of PR-SGD's round it was refused before: int8 rounds over
             # each round's participants (the others keep their error feedback), the round at
             # a step's start with per-rank round lengths (the clock ticks at each rank's I_i),
             # and streamed fragments with a reduction in flight at the checkpoint
             "celgc-wire": {"algorithm": "celgc", "gamma": 0.2, "wire": "int8",
                            "participation": 0.5, "outer_optimizer": "nesterov", "eval_every": 3},
             "celgc-heterogeneous": {**heterogeneous(comm.size), "algorithm": "celgc",
                                     "gamma": 0.14, "participation": 0.5},
             "celgc-streaming": {"algorithm": "celgc", "gamma": 0.15, "fragments": 2,
                                 "overlap": 1, "eval_every": 3}}[case]
    extra["device"] = device
    if case == "lstm" and comm.rank == 0:
        write_tiny_ptb(shared_dir / "ptb")
    comm.mpi.Barrier()
    if case.endswith("heterogeneous"):
        steps = 6  # nominal: 2 rounds of I=3, then 2 more after the resume
    every = steps // 3 if case.endswith("heterogeneous") else steps
    whole, part = shared_dir / "whole", shared_dir / "part"
    _, a = fresh_train(config(whole, steps=2 * steps, checkpoint_every=every, **extra))
    _, half = fresh_train(config(part, steps=steps, checkpoint_every=every, **extra))
    summary, b = fresh_train(config(part, steps=2 * steps, checkpoint_every=every, **extra),
                             resume=part)
    assert not summary.stopped and summary.final is not None
    assert_same_run(a, b, whole, part, comm.rank)
    if case == "lstm":
        assert summary.final.perplexity > 1
    if case.startswith("batchnorm"):
        everyone = np.stack(comm.mpi.allgather(host(b.buffers)))
        same = (everyone == everyone[0]).all()
        assert same if case != "batchnorm-local" or comm.size == 1 else not same
        if comm.rank == 0:
            assert read_checkpoint(part).rows["buffers"].shape == (comm.size, b.buffers.size)
    if case == "streaming" and comm.rank == 0:  # fragment 0, of 768 float64 values, sent at 4
        peaks = read_trace(part / "trace.h5").columns["peak_bytes_in_flight"]
        assert peaks[0] == 8 * 130 and set(peaks[1:]) == {8 * 768}  # one at a time (tau = H // P)
    if case.startswith("celgc"):
        assert 0 < summary.clip_fraction < 1
        if comm.rank == 0:
            assert "clip_fraction" in read_trace(part / "trace.h5").columns


def test_resume_from_an_earlier_checkpoint_drops_the_later_trace_rows(comm, shared_dir):
    """A crash after checkpoint k: the rows and checkpoints written after it are replaced."""
    whole, copy = shared_dir / "whole", shared_dir / "copy"
    _, a = fresh_train(config(whole, steps=24, checkpoint_every=8, keep_checkpoints=5))
    if comm.rank == 0:
        shutil.copytree(whole, copy)
    comm.mpi.Barrier()
    _, b = fresh_train(config(copy, steps=24, checkpoint_every=8, keep_checkpoints=5),
                       resume=copy / "checkpoints" / "step-000000008.h5")
    assert_same_run(a, b, whole, copy, comm.rank)
    if comm.rank == 0:
        assert read_trace(copy / "trace.h5").attrs["resumed_at"] == "[8]"
        final_a = read_checkpoint(whole / "checkpoints" / "step-000000024.h5")
        final_b = read_checkpoint(copy / "checkpoints" / "step-000000024.h5")
        np.testing.assert_array_equal(final_a.model, final_b.model)
        np.testing.assert_array_equal(final_a.rows["momentum"], final_b.rows["momentum"])


def test_resume_hashes_the_checkpoint_once_per_job(comm, shared_dir, monkeypatch):
    """Rank 0 has one child process read the file and check its content digest
    (hpcopt.io.vet); no rank hashes it in-process, and the ranks read only their rows (N ranks
    each hashing the whole file would read it N times). A second child reads the trace before
    rank 0 opens it to append."""
    from hpcopt import child

    out = shared_dir / "run"
    fresh_train(config(out, steps=8, checkpoint_every=4))
    checked, children = [], []  # (writing the next checkpoint hashes it too: sealing, not checking)
    monkeypatch.setattr(digest, "verify", lambda *args: checked.append(1) or verify(*args))
    real = child.run_module
    monkeypatch.setattr(child, "run_module", lambda *args: children.append(args) or real(*args))
    fresh_train(config(out, steps=12, checkpoint_every=4), resume=out)
    assert comm.mpi.allreduce(len(checked)) == 0
    assert comm.mpi.allreduce(len(children)) == 2 and (comm.rank == 0) == bool(children)
    assert all(args[0] == "hpcopt.io.vet" for args in children)
    assert [args[1][0] == "--traces" for args in children] == ([False, True] if children else [])


def test_sigterm_on_one_rank_stops_every_rank_with_a_checkpoint(comm, shared_dir, monkeypatch):
    """SIGTERM reaches only the last rank, mid-window: all ranks stop together at the next
    trace row, write a checkpoint, and the resumed run ends as the uninterrupted one."""
    calls = {"n": 0}
    original = ClassificationProblem.oracle

    def oracle(self, params, grads):
        calls["n"] += 1
        if calls["n"] == 7 and comm.rank == comm.size - 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, params, grads)

    whole, part = shared_dir / "whole", shared_dir / "part"
    _, a = fresh_train(config(whole, steps=30))
    monkeypatch.setattr(ClassificationProblem, "oracle", oracle)
    summary, _ = fresh_train(config(part, steps=30))
    monkeypatch.undo()
    assert summary.stopped and summary.final is None
    # the flag goes out with the row at tick 9 (trace_every=3), whose reduction finishes at 12
    assert summary.steps == 12
    assert summary.checkpoint.endswith("step-000000012.h5")
    _, b = fresh_train(config(part, steps=30), resume=part)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.momentum, b.momentum)
    if comm.rank == 0:
        ta, tb = read_trace(whole / "trace.h5"), read_trace(part / "trace.h5")
        for name in set(COLUMNS) - TIME_COLUMNS:
            np.testing.assert_array_equal(ta.columns[name], tb.columns[name], err_msg=name)


def test_trace_rows_evaluations_and_labels(comm, shared_dir):
    cfg = config(shared_dir / "run", steps=20, eval_every=8, momentum=0)
    summary, state = fresh_train(cfg)
    if comm.rank != 0:
        return
    trace = read_trace(shared_dir / "run" / "trace.h5")
    assert trace.columns["step"].tolist() == [3, 6, 8, 9, 12, 15, 16, 18, 20]
    evaluated = np.isfinite(trace.columns["eval_accuracy"])
    assert trace.columns["step"][evaluated].tolist() == [8, 16]
    assert trace.columns["rounds"].tolist() == [s // 4 for s in trace.columns["step"]]
    assert (trace.columns["lr"] == 0.1).all()
    for name in ("loss_mean", "loss_max", "grad_norm", "grad_norm_max"):
        assert np.isfinite(trace.columns[name]).all(), name
    assert (trace.columns["loss_max"] >= trace.columns["loss_mean"] - 1e-12).all()
    assert (trace.columns["grad_norm_max"] >= trace.columns["grad_norm"] - 1e-12).all()
    assert (np.diff(trace.columns["wall"]) >= 0).all()
    # the trace's own reduction stays off the algorithm's label: per row, one non-blocking
    # allgather of 24 bytes and its wait, label "trace" (a row's counters are taken before
    # its own reduction starts)
    assert trace.comm["average"]["calls"][-1] == 20 // 4
    assert trace.comm["trace"]["calls"].tolist() == [2 * i for i in range(trace.rows)]
    assert trace.comm["trace"]["bytes"].tolist() == [24 * i for i in range(trace.rows)]
    assert trace.summary["eval_accuracy"] == summary.final.accuracy
    assert trace.summary["step"] == 20


def test_checkpoint_opens_without_hpcopt(comm, shared_dir):
    """Plain h5py: parameters under their layer names, the flat vector, per-rank state."""
    fresh_train(config(shared_dir / "run", steps=10))  # ends mid-round: ranks' models differ
    if comm.rank != 0:
        return
    with h5py.File(shared_dir / "run" / "checkpoints" / "step-000000010.h5", "r") as f:
        flat = f["model/flat"][()]
        weight, bias = f["model/params/fc1.weight"][()], f["model/params/fc1.bias"][()]
        assert weight.shape == (64, 12) and bias.shape == (12,)
        pieces = [f[f"model/params/{name}"][()].ravel() for name in
                  ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")]
        np.testing.assert_array_equal(np.concatenate(pieces), flat)
        assert f["ranks/x"].shape == f["ranks/momentum"].shape == (comm.size, flat.size)
        np.testing.assert_allclose(f["ranks/x"][()].mean(axis=0), flat, rtol=1e-12, atol=1e-14)
        assert f.attrs["world_size"] == comm.size and f.attrs["format_version"] == 3
        assert 'hidden = [12]' in f.attrs["config"]
