"""A run writes only in its own directory, a file never chooses code to import, and one job at a
time holds a run directory (real ``mpiexec`` jobs on 2 ranks, with crafted checkpoints from
tests/crafted.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcopt.io.data_parallel_checkpoint import find_checkpoint, read_checkpoint, run_id_of
from hpcopt.io.trace import read_trace
from hpcopt.run.lock import FILE_NAME as LOCK
from tests.command_line import assert_one_line_error
from tests.crafted import checkpoint_naming_a_module, checkpoint_with_foreign_out
from tests.faults.jobs import HARD_TIMEOUT, ROOT, SMALL, STEPS, run_job

#: What a crafted module does when imported: leave a file behind.
EVIDENCE = "import pathlib\npathlib.Path(__file__).with_suffix('.imported').touch()\n\ndef build():\n" \
           "    raise SystemExit('built')\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A victim run (32 steps, checkpoints 8 to 32) and a foreign run (16 steps, another seed)."""
    root = tmp_path_factory.mktemp("runs")
    for name, steps, seed in (("victim", STEPS, 0), ("foreign", 16, 1)):
        job = run_job(["train", *SMALL, "--steps", str(steps), "--seed", str(seed),
                       "--out", str(root / name)])
        assert job.returncode == 0, job.describe()
    return root / "victim", root / "foreign"


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` and the SHA-256 of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_checkpoint_naming_a_module_is_refused_before_it_is_imported(runs, tmp_path):
    victim, _ = runs
    (tmp_path / "evidence_module.py").write_text(EVIDENCE)
    run = tmp_path / "run"
    checkpoint_naming_a_module(victim / "checkpoints" / "step-000000016.h5",
                               run / "checkpoints" / "step-000000016.h5", "torch:evidence_module:build")
    before = snapshot(run)
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from hpcopt.cli import main\n"
            f"sys.exit(main(['resume', {str(run)!r}, '--steps', '32']))")
    job = run_job([], python_code=code)
    assert_one_line_error(job, "--model: the checkpoint's model is a torch module",
                          '"torch:evidence_module:build"', "resume with --model torch:MODULE:FUNCTION")
    assert not (tmp_path / "evidence_module.imported").exists()  # on no rank
    assert snapshot(run) == before and job.seconds < 30


def test_a_loose_checkpoint_never_writes_where_its_config_says(runs, tmp_path):
    """A copy of the foreign run's checkpoint whose stored out names the victim (trace off,
    keep one checkpoint): refused without --out, refused with --out at the victim (another
    run's directory), and with --out elsewhere it continues there; the victim is never touched."""
    victim, foreign = runs
    before = snapshot(victim)
    loose = checkpoint_with_foreign_out(foreign / "checkpoints" / "step-000000008.h5",
                                        tmp_path / "copy.h5", victim)
    job = run_job(["resume", str(loose), "--steps", "16"])
    assert_one_line_error(job, f"{loose} is not in a run directory's checkpoints/ folder",
                          "(--out DIR)")
    job = run_job(["resume", str(loose), "--steps", "16", "--out", str(victim)])
    assert_one_line_error(job, f"{victim} holds another run", "choose another --out")
    elsewhere = tmp_path / "elsewhere"
    job = run_job(["resume", str(loose), "--steps", "16", "--out", str(elsewhere)])
    assert job.returncode == 0, job.describe()
    assert sorted(p.name for p in (elsewhere / "checkpoints").iterdir()) == ["step-000000016.h5"]
    assert not (elsewhere / LOCK).exists()
    assert snapshot(victim) == before


def test_a_foreign_checkpoint_in_a_run_directory_is_refused(runs, tmp_path):
    """Another run's checkpoint copied into a run's checkpoints/ (as the newest): resuming the
    directory is refused, and nothing in it changes."""
    victim, foreign = runs
    run = tmp_path / "run"
    shutil.copytree(victim, run)
    shutil.copyfile(foreign / "checkpoints" / "step-000000016.h5", run / "checkpoints" / "step-000000040.h5")
    before = snapshot(run)
    job = run_job(["resume", str(run), "--steps", "48", "--trace", "false"])
    assert_one_line_error(job, f"{run} holds another run", "a run directory holds one run")
    assert snapshot(run) == before


def _start(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT=str(HARD_TIMEOUT + 10))
    return subprocess.Popen(["mpiexec", "-n", "2", sys.executable, "-m", "hpcopt", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT, start_new_session=True)


def _wait_for(condition, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + HARD_TIMEOUT
    while not condition():
        assert process.poll() is None, f"the job ended before {what}: {process.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {HARD_TIMEOUT} s"
        time.sleep(0.05)


def test_one_job_at_a_time_and_a_killed_jobs_lock_is_taken_over(tmp_path):
    """While a job runs, a resume (even with --trace false) and a train in its directory are
    refused in one line naming the holder; once it is killed (kill -9 of rank 0: no cleanup),
    the next resume takes its lock over and continues from its newest checkpoint."""
    run = tmp_path / "run"
    live = _start(["train", *SMALL, "--hidden", "64", "--steps", "1000000", "--checkpoint-every", "8",
                   "--keep-checkpoints", "2", "--out", str(run)])
    try:
        _wait_for(lambda: (run / LOCK).exists() and len(list((run / "checkpoints").glob("*.h5"))) > 0,
                  live, "a checkpoint")
        holder = (run / LOCK).read_text()
        for args in (["resume", str(run), "--trace", "false", "--steps", "2000000"],
                     ["train", *SMALL, "--steps", "8", "--out", str(run)]):
            job = run_job(args)
            assert_one_line_error(job, f"{run} is in use by another job (host ")
            assert (run / LOCK).read_text() == holder
        rank0 = int(holder.split('"pid": ')[1].split(",")[0])
        os.kill(rank0, signal.SIGKILL)
        live.communicate(timeout=HARD_TIMEOUT)
    finally:
        if live.poll() is None:
            os.killpg(live.pid, signal.SIGKILL)
            live.wait()
    assert (run / LOCK).exists()  # nothing cleaned up after kill -9
    ckpt = read_checkpoint(find_checkpoint(run))
    resumed = run_job(["resume", str(run), "--steps", str(ckpt.tick + 8)])
    assert resumed.returncode == 0, resumed.describe()
    assert not (run / LOCK).exists()
    assert all(run_id_of(p) == ckpt.run_id for p in (run / "checkpoints").glob("*.h5"))
    assert read_trace(run / "trace.h5").summary["step"] == ckpt.tick + 8


def test_a_run_that_failed_before_its_first_checkpoint_leaves_a_reusable_directory(tmp_path):
    """The free-space preflight refuses a run after its trace was created: the same --out then
    starts a new run, saying so, with the old trace kept aside."""
    run = tmp_path / "run"
    code = ("import sys, collections; from mpi4py import MPI; import hpcopt.run.preflight as p\n"
            "if MPI.COMM_WORLD.rank == 0:\n"
            "    p.shutil.disk_usage = lambda path: collections.namedtuple('u', 'total used free')(1, 1, 1000)\n"
            "from hpcopt.cli import main\n"
            f"sys.exit(main(['train', *{SMALL!r}, '--steps', '8', '--out', {str(run)!r}]))")
    assert_one_line_error(run_job([], python_code=code), "not enough free space for a checkpoint")
    failed = run_id_of(run / "trace.h5")
    assert failed and not (run / LOCK).exists()
    job = run_job(["resume", str(run)])
    assert_one_line_error(job, f"no checkpoint in {run}: its run has written none",
                          f"train --out {run} starts a run there")
    job = run_job(["train", *SMALL, "--steps", "8", "--out", str(run)])
    assert job.returncode == 0, job.describe()
    assert f"hpcopt: {run} held a run that ended before its first checkpoint" in job.stdout
    assert run_id_of(run / f"trace-{failed}.h5") == failed
    assert run_id_of(run / "trace.h5") == read_checkpoint(find_checkpoint(run)).run_id != failed
