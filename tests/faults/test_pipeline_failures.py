"""The failures of a pipeline run end the job as quickly as a data-parallel one's, and never cost
the last good checkpoint: PPRS on the l1 chain, 2 stages (real ``mpiexec`` jobs), each fault
followed by a resume from the newest checkpoint that must end bitwise where the uninterrupted
run ends (docs/failures.md)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt.io import pipeline_checkpoint as pipe_ckpt
from hpcopt.io.trace import read_trace
from tests.faults.jobs import assert_fault_ended_the_job, run_job
from tests.runs import PIPELINE_TIME_COLUMNS

ITERATIONS = 32
PIPELINE = ["--algorithm", "pprs", "--problem", "l1_chain", "--momentum", "0.8", "--samples", "3",
            "--smoothing", "0.05", "--trace-every", "4", "--checkpoint-every", "8",
            "--keep-checkpoints", "10", "--progress", "false"]

#: fault -> (flags, exit code (None: any non-zero), what the output says, seconds from the fault
#: to the end of the job at most, newest checkpoint left behind)
FAULTS = {
    "raise": (["--debug-fail-at", "1:20"], 1,
              "[rank 1] RuntimeError: --debug-fail-at: injected failure on rank 1 at step 20", 5, 16),
    "kill-9": (["--debug-fail-at", "0:20:kill"], None, "signal 9", 5, 16),
    "kill-in-checkpoint": (["--debug-fail-at", "0:16:checkpoint"], None, "signal 9", 5, 8),
    "nan": (["--debug-fail-at", "1:18:nan"], 3,
            "hpcopt: error: non-finite loss in the trace row at iteration 20", 5, 16),
    "hang": (["--debug-fail-at", "1:10:hang", "--stall-timeout", "2"], 4,
             "not arrived: rank 1", 2 + 4, 8),
}


def assert_same_pipeline_run(run_dir, reference) -> None:
    """The final checkpoints (model, every stage's vectors) and the traces' results (not the
    measured times) of two pipeline runs are bitwise the same."""
    ckpt, ref = pipe_ckpt.read(run_dir, 2), pipe_ckpt.read(reference, 2)
    assert ckpt.tick == ref.tick == ITERATIONS
    np.testing.assert_array_equal(ckpt.model, ref.model)
    for stage, expected in zip(ckpt.stages, ref.stages):
        assert sorted(stage.vectors) == sorted(expected.vectors)
        for name, values in expected.vectors.items():
            np.testing.assert_array_equal(stage.vectors[name], values, err_msg=name)
    trace, ref_trace = read_trace(run_dir / "trace.h5"), read_trace(reference / "trace.h5")
    assert trace.rows == ref_trace.rows
    measured = (*PIPELINE_TIME_COLUMNS, "busy_", "idle_")
    for name, column in ref_trace.columns.items():
        if not name.startswith(measured):
            np.testing.assert_array_equal(trace.columns[name], column, err_msg=name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    job = run_job(["train", *PIPELINE, "--steps", str(ITERATIONS), "--out", str(out)])
    assert job.returncode == 0, job.describe()
    return out


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_pipeline_fault_ends_the_job_fast_and_the_run_resumes_bitwise(fault, reference, tmp_path):
    flags, code, message, seconds, newest = FAULTS[fault]
    out = tmp_path / "run"
    job = run_job(["train", *PIPELINE, "--steps", str(ITERATIONS), "--out", str(out), *flags])
    assert_fault_ended_the_job(job, code, message, seconds)
    ckpt = pipe_ckpt.read(out, 2)  # the newest complete checkpoint loads
    assert ckpt.tick == newest, ckpt.path
    resumed = run_job(["resume", str(out)])
    assert resumed.returncode == 0, resumed.describe()
    assert_same_pipeline_run(out, reference)


def test_skip_is_refused_for_pipeline_runs(tmp_path):
    job = run_job(["train", *PIPELINE, "--steps", "4", "--on-nonfinite", "skip"])
    assert job.returncode == 2 and "on_nonfinite skip applies only to the data-parallel" in job.stderr
