"""Hostile checkpoints end a real job with one line, never a hang (``mpiexec`` on 2 ranks; the
other crafted kinds are tested in-process: tests/unit/test_untrusted_files.py)."""

from __future__ import annotations

from tests.command_line import assert_one_line_error
from tests.crafted import fifo_link
from tests.faults.jobs import SMALL, run_job


def test_a_checkpoint_linked_to_a_fifo_is_one_line_not_a_hang(tmp_path):
    """``/model/flat`` links to a FIFO: rank 0's child refuses the link before any rank opens
    the file (following it would block every rank in open() for ever)."""
    out = tmp_path / "run"
    job = run_job(["train", *SMALL, "--steps", "8", "--out", str(out)])
    assert job.returncode == 0, job.describe()
    bad = fifo_link(out / "checkpoints" / "step-000000008.h5", "model/flat")
    job = run_job(["resume", str(bad), "--steps", "16"])
    assert_one_line_error(job, f"{bad}: /model/flat is an external link")
    assert job.seconds < 30, job.describe()
