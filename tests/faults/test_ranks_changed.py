"""A Slurm requeue onto fewer (or more) ranks: ``hpcopt resume --ranks-changed`` as a real
``mpiexec`` job continues a run directory to its end; without the flag the refusal names it, and a
state that has no meaning on the new count is refused in one line (exit 2) (docs/failures.md).
The carried-over state itself is checked, algorithm by algorithm, in tests/mpi/test_rescale.py."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from hpcopt.io.trace import read_trace
from tests.faults.jobs import SMALL, run_job
from tests.faults.test_pipeline_failures import PIPELINE

STEPS = 16
FLAG = "--ranks-changed"


def trained(out, ranks, *flags: str) -> None:
    job = run_job(["train", *SMALL, "--momentum", "0.9", "--steps", str(STEPS), "--out", str(out),
                   *flags], ranks=ranks)
    assert job.returncode == 0, job.describe()


def assert_refused(job, *words: str) -> None:
    lines = job.hpcopt_lines()
    assert job.returncode == 2 and len(lines) == 1 and lines[0].startswith("hpcopt: error: "), job.describe()
    for word in words:
        assert word in lines[0], job.describe()


def test_a_requeue_onto_fewer_ranks_resumes_with_the_flag_and_runs_to_the_end(tmp_path):
    out = tmp_path / "run"
    trained(out, 4)
    at = out / "checkpoints" / "step-000000008.h5"
    model = read_checkpoint(at).model
    assert_refused(run_job(["resume", str(at), "--progress", "false"], ranks=2),
                   "written by a run on 4 rank(s)", FLAG)
    job = run_job(["resume", str(at), "--progress", "false", FLAG], ranks=2)
    assert job.returncode == 0, job.describe()
    assert ("hpcopt: carrying a checkpoint of 4 rank(s) over to 2: the averaged model as it is; "
            "averaged momentum;") in job.stdout, job.describe()
    # the 4 ranks' newer checkpoint, which this run replaces at its step 16, once without a word
    assert (f"hpcopt: --ranks-changed: {out / 'checkpoints'} holds 1 checkpoint(s) after step 8 "
            "(step-000000016.h5) of the run before on 4 rank(s): this run on 2 replaces the one at "
            "each step where it writes its own") in job.stdout, job.describe()
    final = read_checkpoint(out / "checkpoints" / f"step-{STEPS:09d}.h5")
    assert final.world_size == 2 and final.tick == STEPS
    assert not np.array_equal(final.model, model)  # it trained on
    trace = read_trace(out / "trace.h5")
    assert trace.columns["step"][-1] == STEPS and trace.summary is not None
    # the trace keeps its first job's world size: collect tells this run of a 4-rank task, resumed
    # on 2, from one that started on the wrong number of ranks
    assert trace.attrs["world_size"] == 4 and trace.attrs["resumed_at"] == "[8]"


@pytest.mark.parametrize("flags, ranks, words", [
    (["--group-size", "2", "--group-interval", "2"], 3, ["group_size"]),
    # fragment 0 is sent after step 8 (I = 4) and lands a step later: in flight at the checkpoint
    (["--fragments", "2", "--overlap", "1"], 3,
     ["a reduction was in flight at its step 8", "resume it on 2"]),
], ids=["groups-that-do-not-divide", "streaming-in-flight"])
def test_a_state_without_meaning_on_the_new_count_is_refused_in_one_line(tmp_path, flags, ranks, words):
    out = tmp_path / "run"
    trained(out, 2, *flags)
    at = out / "checkpoints" / "step-000000008.h5"
    assert_refused(run_job(["resume", str(at), "--progress", "false", FLAG], ranks=ranks), *words)


def test_a_pipeline_run_refuses_the_flag_in_one_line(tmp_path):
    out = tmp_path / "run"
    job = run_job(["train", *PIPELINE, "--steps", "8", "--out", str(out)])
    assert job.returncode == 0, job.describe()
    assert_refused(run_job(["resume", str(out), "--progress", "false", FLAG], ranks=3),
                   "pipeline", "stages are its ranks")
