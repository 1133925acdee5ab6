"""Checkpoints and resume as a user meets them: real mpiexec launches, SIGTERM through the
launcher, and refusals as one line from rank 0 with exit code 2 on every rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from hpcopt.io.data_parallel_checkpoint import find_checkpoint, read_checkpoint
from hpcopt.io.digest import seal
from hpcopt.io.trace import read_trace
from tests.command_line import ROOT, assert_one_line_error, launch

SMALL = ["--dataset", "digits", "--hidden", "16", "--interval", "4", "--trace-every", "4"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished 2-rank run of 20 steps with momentum."""
    out = tmp_path_factory.mktemp("cli") / "run"
    result = launch(["train", *SMALL, "--steps", "20", "--momentum", "0.9", "--out", str(out)])
    assert result.returncode == 0, result.stderr
    assert f"files             {out}" in result.stdout
    return out


def test_resume_on_another_world_size_is_refused(run_dir):
    result = launch(["resume", str(run_dir), "--steps", "30"], ranks=1)
    assert_one_line_error(result, "written by a run on 2 rank(s); this run has 1", "mpiexec -n 2")


def test_changing_what_the_run_computes_is_refused(run_dir):
    result = launch(["train", "--resume", str(run_dir), "--steps", "30", "--interval", "2"])
    assert_one_line_error(result, "cannot change interval when resuming", "the checkpoint has 4")


def test_bad_checkpoint_on_two_ranks_is_one_line_and_exit_2(run_dir, tmp_path):
    bad = tmp_path / "step-000000020.h5"
    bad.write_bytes(find_checkpoint(run_dir).read_bytes())
    with h5py.File(bad, "a") as f:
        f["ranks/momentum"][1, 0] = np.nan
        seal(f)  # a consistent file with a bad value (damage is the digest's, on every rank)
    result = launch(["resume", str(bad), "--steps", "30"])
    # only rank 1 reads row 1: the error names it, and both ranks still exit 2
    assert_one_line_error(result, "rank 1:", "/ranks/momentum contains NaN")


def test_damage_is_refused_on_every_rank_alike(run_dir, tmp_path):
    bad = tmp_path / "step-000000020.h5"
    bad.write_bytes(find_checkpoint(run_dir).read_bytes())
    with h5py.File(bad, "a") as f:
        f["ranks/momentum"][1, 0] = 0.5
    result = launch(["resume", str(bad), "--steps", "30"])
    assert_one_line_error(result, f"{bad} is a damaged checkpoint (content digest mismatch)")
    assert "rank 1:" not in result.stderr


def test_sigterm_through_mpiexec_checkpoints_and_resumes(tmp_path):
    out = tmp_path / "run"
    command = ["mpiexec", "-n", "2", sys.executable, "-m", "hpcopt", "train", *SMALL,
               "--hidden", "64", "--steps", "200000", "--momentum", "0.9", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT="100")
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=ROOT)
    try:
        while "run directory" not in launcher.stdout.readline():
            assert launcher.poll() is None, launcher.stderr.read()
        time.sleep(1.0)
        launcher.send_signal(signal.SIGTERM)  # mpiexec forwards it to every rank, as Slurm does
        stdout, stderr = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 143, stderr  # stopped, not finished: 128 + SIGTERM
    assert "hpcopt: SIGTERM: stopped at step" in stdout and "hpcopt resume" in stdout
    ckpt = read_checkpoint(out)
    assert ckpt.tick % 4 == 0 and 0 < ckpt.tick < 200000  # at a trace row
    trace = read_trace(out / "trace.h5")
    assert trace.summary is None and trace.rows == ckpt.trace_rows == ckpt.tick // 4
    resumed = launch(["resume", str(out), "--steps", str(ckpt.tick + 8)])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {out}" in resumed.stdout
    trace = read_trace(out / "trace.h5")
    assert trace.summary["step"] == ckpt.tick + 8 and trace.attrs["resumed_at"] == f"[{ckpt.tick}]"
    assert trace.columns["step"].tolist() == list(range(4, ckpt.tick + 9, 4))
