"""Training on the emulated cluster (2 nodes x 2 ranks, 100 Mbit/s): a run ends with exit 0 under
both of MPICH's netmods with the model's bytes on every link, a whole node stopped by SIGTERM or
killed resumes bitwise, and a node whose link is cut is named by the stall watchdog."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from tests.cluster.conftest import JOB_TIMEOUT, ROOT, hpcopt_command, job_env, run_hpcopt
from tests.faults.jobs import assert_same_run
from tests.timeouts import scaled

STEPS, INTERVAL, CHECKPOINT_EVERY = 160, 4, 40
#: PR-SGD with the shared-memory average (the window a run keeps open until its end) on an MLP
#: of 86,794 parameters: a round sends 347 KB per node, ~30 ms at 100 Mbit/s.
RUN = ["--dataset", "digits", "--hidden", "256", "--interval", str(INTERVAL), "--trace-every", "4",
       "--checkpoint-every", str(CHECKPOINT_EVERY), "--keep-checkpoints", "10", "--averaging", "shm",
       "--steps", str(STEPS), "--progress", "false"]


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """The uninterrupted run on the cluster that every resumed one must match."""
    out = tmp_path_factory.mktemp("reference") / "run"
    job = run_hpcopt(cluster, "train", *RUN, "--out", str(out))
    assert job.returncode == 0, job.describe()
    return out


@pytest.mark.parametrize("netmod", ["ofi", "ucx"])
def test_training_ends_with_exit_0_and_the_model_crosses_every_link(nodes, netmod, tmp_path):
    out = tmp_path / "run"
    job = run_hpcopt(nodes, "train", *RUN, "--progress", "true", "--out", str(out), netmod=netmod)
    # before the fix, the OFI netmod failed in MPI_Finalize after the summary (the model's
    # shared window was still open): "OFI call fabricclose failed", exit 15
    assert job.returncode == 0, job.describe()
    assert "summary" in job.stdout and "Fatal error" not in job.stderr, job.describe()
    model_bytes = read_checkpoint(out).model.nbytes
    rounds = STEPS // INTERVAL
    assert all(sent >= 0.9 * rounds * model_bytes for sent in job.sent), (job.sent, rounds, model_bytes)


#: ``hpcopt.train`` on a Comm of its own, its model kept by the caller after the run.
API_RUN = """
import hpcopt
config = hpcopt.build_config(None, {"dataset": "digits", "hidden": "256", "interval": "4",
                                    "steps": "40", "averaging": "shm"})
summary, state = hpcopt.train(config, verbose=False)
print("trained, model[0] =", float(state.x[0]))
"""


def test_a_python_api_run_that_keeps_its_model_ends_with_exit_0(nodes):
    job = nodes.mpiexec([sys.executable, "-c", API_RUN], "ofi", JOB_TIMEOUT, job_env(), ROOT)
    # before the fix: the model's shared window was still open at MPI_Finalize (exit 15)
    assert job.returncode == 0, job.describe()
    assert job.stdout.count("trained, model[0] =") == 4, job.describe()


def _start(nodes, out: Path, *flags: str) -> subprocess.Popen:
    """Start the run, and return once its first checkpoint is written."""
    process = nodes.launch(hpcopt_command("train", *RUN, "--out", str(out), *flags), "ofi",
                           JOB_TIMEOUT, job_env(), ROOT)
    deadline = time.monotonic() + scaled(60)
    first = out / "checkpoints" / f"step-{CHECKPOINT_EVERY:09d}.h5"
    while not first.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)
    return process


def _finish(process: subprocess.Popen, seconds: float) -> tuple[str, str]:
    try:
        return process.communicate(timeout=scaled(seconds))
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"the job did not end within {seconds} s: {process.communicate()}") from None


def test_sigterm_to_a_whole_node_checkpoints_and_resumes_bitwise(nodes, reference, tmp_path):
    out = tmp_path / "run"
    process = _start(nodes, out)
    assert nodes.signal_node(1, signal.SIGTERM)  # hydra's proxy and both ranks of node 1
    stdout, stderr = _finish(process, 30)
    assert process.returncode == 143, (stdout, stderr)  # stopped, not finished
    assert "hpcopt: SIGTERM: stopped at step" in stdout
    assert CHECKPOINT_EVERY < read_checkpoint(out).tick < STEPS
    resumed = run_hpcopt(nodes, "resume", str(out))
    assert resumed.returncode == 0, resumed.describe()
    assert_same_run(out, reference)


def test_kill_9_of_a_whole_node_ends_the_job_and_it_resumes_bitwise(nodes, reference, tmp_path):
    out = tmp_path / "run"
    process = _start(nodes, out)
    assert nodes.signal_node(1, signal.SIGKILL)
    stdout, stderr = _finish(process, 30)
    assert process.returncode not in (0, 124, 137), (process.returncode, stdout, stderr)
    assert CHECKPOINT_EVERY <= read_checkpoint(out).tick < STEPS
    resumed = run_hpcopt(nodes, "resume", str(out))
    assert resumed.returncode == 0, resumed.describe()
    assert_same_run(out, reference)


def test_stall_watchdog_names_the_ranks_of_a_node_whose_link_is_cut(nodes, tmp_path):
    process = _start(nodes, tmp_path / "run", "--stall-timeout", "3")
    nodes.link_down(1)
    try:
        stdout, stderr = _finish(process, 30)
    finally:
        nodes.link_up(1)
    assert process.returncode == 4, (process.returncode, stdout, stderr)
    report = stdout + stderr
    assert "hpcopt: stall: a collective has not completed within --stall-timeout 3 s; " \
           "not arrived: rank 2, 3" in report, report
    assert "rank 2: no answer" in report and "rank 3: no answer" in report, report
