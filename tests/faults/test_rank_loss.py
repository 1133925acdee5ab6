"""``--on-rank-loss continue``: a rank killed (``kill -9``) mid-round at 4 ranks, the survivors
finish at 3 with the result of a 3-rank run started from the round they went back to; the
exit code and the trace's ``/rank_losses`` say so. Needs Open MPI's ULFM (``mpirun --with-ft
ulfm``); elsewhere the option is refused in one line (docs/failures.md)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpcopt.run.rank_loss import EXIT_CONTINUED
from tests.faults.jobs import SMALL, run_job
from tests.launcher import OPEN_MPI

ULFM = OPEN_MPI and hasattr(MPI.Comm, "Shrink")
needs_ulfm = pytest.mark.skipif(not ULFM, reason="a rank's loss is survived only under Open MPI's "
                                "ULFM (mpirun --with-ft ulfm); this MPI refuses --on-rank-loss continue")
LOST, KILLED_AT, ROUND = 2, 14, 12  # rank 2 dies in step 14: the survivors go back to step 12
#: 4 ranks x 32 steps, a round every 4 steps and a checkpoint at each (the reference's start)
ARGS = ["train", *SMALL, "--steps", "32", "--checkpoint-every", "4"]

#: A 3-rank resume of the 4-rank run's checkpoint of the round, without the lost rank: its
#: per-rank rows dropped (a mid-round model averaged over the survivors), then carried over as
#: ``resume --ranks-changed`` carries a checkpoint (a streaming run's idle in_flight reset).
REFERENCE = """
import sys

import numpy as np
from hpcopt.cli import main
from hpcopt.run import data_parallel

lost, carry = {lost}, data_parallel.rescaled

def survivors(ckpt, size, rank, state, sampler, to_host, in_flight):
    keep = [r for r in range(ckpt.world_size) if r != lost]
    rows = {{name: values[keep] for name, values in ckpt.rows.items()}}
    if "x" in rows:
        ckpt.model = rows["x"].mean(axis=0, dtype=np.float64).astype(rows["x"].dtype)
    ckpt.rows, ckpt.world_size, ckpt.ranks = rows, len(keep), tuple(range(len(keep)))
    ckpt.counters = {{n: v[keep] for n, v in ckpt.counters.items()}}
    ckpt.scalars = {{n: v[keep] for n, v in ckpt.scalars.items()}}
    ckpt.sampler, ckpt.window = ckpt.sampler[keep], ckpt.window[keep]
    return carry(ckpt, size, rank, state, sampler, to_host, in_flight=in_flight)

data_parallel.rescaled = survivors
sys.exit(main({argv!r}))
"""

ALGORITHMS = {
    "prsgd": ["--algorithm", "prsgd"],
    "celgc": ["--algorithm", "celgc"],
    "diloco": ["--algorithm", "diloco"],
    "streaming_diloco": ["--algorithm", "diloco", "--fragments", "2"],
}


def _model(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f["model/flat"][()]


@needs_ulfm
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_a_killed_rank_is_survived_with_the_result_of_a_3_rank_run_from_the_round(
        tmp_path: Path, algorithm: str) -> None:
    run, reference = tmp_path / "run", tmp_path / "reference"
    job = run_job([*ARGS, *ALGORITHMS[algorithm], "--out", str(run), "--on-rank-loss", "continue",
                   "--debug-fail-at", f"{LOST}:{KILLED_AT}:kill"], ranks=4,
                  mpiexec_args=("--with-ft", "ulfm"))
    assert job.returncode == EXIT_CONTINUED, job.describe()
    assert f"rank {LOST} lost at step" in job.stdout and f"going on at 3 ranks from step {ROUND}" in job.stdout
    with h5py.File(run / "trace.h5", "r") as f:
        losses = {name: f["rank_losses"][name][()] for name in ("step", "rank", "recover_seconds", "round_step")}
        steps = f["rows"]["step"]
    assert losses["rank"].tolist() == [LOST] and losses["rank"].dtype == np.int64
    assert KILLED_AT <= losses["step"][0] <= KILLED_AT + 2 and losses["step"].dtype == np.int64
    assert 0 < losses["recover_seconds"][0] < 30 and losses["recover_seconds"].dtype == np.float64
    assert losses["round_step"].tolist() == [ROUND]  # the step of the round the survivors went on from
    assert steps.tolist() == list(range(4, 33, 4))  # the rows after the round were written once
    ckpt = run / "checkpoints" / f"step-{ROUND:09d}.h5"
    argv = ["resume", str(ckpt), "--ranks-changed", "--on-rank-loss", "abort", "--out", str(reference)]
    again = run_job([], ranks=3, python_code=REFERENCE.format(lost=LOST, argv=argv))
    assert again.returncode == 0, again.describe()
    last = f"checkpoints/step-{32:09d}.h5"
    np.testing.assert_array_equal(_model(run / last), _model(reference / last))


def test_continue_is_refused_in_one_line_without_ulfm(tmp_path: Path) -> None:
    """Under MPICH, or Open MPI launched without --with-ft ulfm: exit 2 before the first step."""
    job = run_job([*ARGS, "--out", str(tmp_path / "run"), "--on-rank-loss", "continue"], ranks=2)
    assert job.returncode == 2, job.describe()
    lines = job.hpcopt_lines()
    assert len(lines) == 1 and lines[0].startswith("hpcopt: error: --on-rank-loss continue: "), lines
    assert ("MPICH" in lines[0] or "mpirun --with-ft ulfm" in lines[0]), lines


@needs_ulfm
def test_a_scheduled_fault_is_survived_once_and_collect_counts_the_steps_since_the_round(
        tmp_path: Path) -> None:
    """``--fault`` with continue needs no checkpoint before it, fires once (the rebuilt run has no
    fault plan) and collect's steps_lost is ``step - round_step`` of ``/rank_losses``."""
    from hpcopt.study.recovery import recovery

    run = tmp_path / "run"
    job = run_job([*ARGS, "--steps", "16", "--checkpoint-every", "0", "--out", str(run),
                   "--on-rank-loss", "continue", "--fault", f"{LOST}:6"], ranks=4,
                  mpiexec_args=("--with-ft", "ulfm"))
    assert job.returncode == EXIT_CONTINUED, job.describe()
    assert (job.stdout + job.stderr).count("--fault: killing rank") == 1, job.describe()
    with h5py.File(run / "trace.h5", "r") as f:
        step, round_step = int(f["rank_losses/step"][0]), int(f["rank_losses/round_step"][0])
        assert f["rows"]["step"][-1] == 16  # the run finished, at 3 ranks
    assert round_step == 4 and step > round_step  # the round before the kill at step 6
    found = recovery(run, run / "trace.h5")
    assert found is not None and found.losses == 1 and found.steps_lost == step - round_step
    assert found.seconds is not None and 0 < found.seconds < 30
