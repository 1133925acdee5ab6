"""A ``--model torch:...`` that cannot train on the data ends a real 2-rank job while the run
is built: exit 2, one line from rank 0 naming the spec and the data's shape, no traceback, no
run directory (hpcopt.torch.check)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.extra
pytest.importorskip("torch")

from tests.command_line import assert_one_line_error  # noqa: E402
from tests.faults.jobs import run_job  # noqa: E402
from tests.unit.test_torch_check import UNTRAINABLE  # noqa: E402

DIGITS = "on digits (1x8x8 images, 10 classes): "
#: From the launch to the end of a refused job at most (torch's import takes most of it).
SECONDS = 40


def test_a_3_channel_model_on_1_channel_images_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "run"
    job = run_job(["train", "--model", "torch:tests.torch_models:rgb_cnn", "--dataset", "digits",
                   "--steps", "4", "--out", str(out)])
    assert_one_line_error(job, f"--model torch:tests.torch_models:rgb_cnn {DIGITS}",
                          "cannot take a batch of inputs (32, 1, 8, 8) float32",
                          "expected input[32, 1, 8, 8] to have 3 channels, but got 1 channels")
    assert not out.exists()
    assert job.seconds < SECONDS, job.seconds


def every_case(names: list[str], out: str) -> str:
    """Python for one job that trains each model in turn through hpcopt.cli.main (what
    ``python -m hpcopt`` runs) on every rank; rank 0 reports each exit code and its seconds."""
    return ("import time\nfrom mpi4py import MPI\nfrom hpcopt.cli import main\n"
            f"for name in {names!r}:\n"
            "    start = time.monotonic()\n"
            "    code = main(['train', '--model', 'torch:tests.torch_models:' + name, '--dataset', "
            f"'digits', '--batch-size', '8', '--steps', '4', '--out', {out!r} + '/' + name])\n"
            "    if MPI.COMM_WORLD.Get_rank() == 0:\n"
            "        print('case', name, 'exit', code, 'seconds', round(time.monotonic() - start, 2))\n")


def test_every_untrainable_model_ends_both_ranks_with_one_line_from_rank_0(tmp_path):
    """All cases in one job, so torch is imported once."""
    names = sorted(UNTRAINABLE)
    job = run_job([], python_code=every_case(names, str(tmp_path)))
    assert job.returncode == 0, job.describe()
    reports = [line.split() for line in job.stdout.splitlines() if line.startswith("case ")]
    assert [(r[1], r[3]) for r in reports] == [(name, "2") for name in names], job.stdout
    assert all(float(r[5]) < SECONDS for r in reports), job.stdout
    lines = [line for line in job.stderr.splitlines() if line.strip()]
    assert len(lines) == len(names), job.stderr  # one line per case: rank 0's only
    for name, line in zip(names, lines):
        assert line.startswith(f"hpcopt: error: --model torch:tests.torch_models:{name} {DIGITS}"
                               f"{UNTRAINABLE[name]}"), line
    assert "Traceback" not in job.stdout + job.stderr
    assert not any(tmp_path.iterdir())  # no run directory was made
