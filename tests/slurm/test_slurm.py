"""hpcopt's own study arrays under a real Slurm of 2 namespaced nodes (``MpiDefault=none``, as on
Debian and many sites), with whichever MPI this environment has (MPICH: ``srun --mpi=pmi2``;
Open MPI: ``srun --mpi=pmix``, both from the study's generated site file):

- every task runs on a world of its own ranks, across the nodes;
- a bare ``srun`` (no MPI plugin) is refused loudly, never trained as singletons;
- ``scancel --signal=TERM``, ``--signal=USR1`` and ``--signal=USR1 --batch`` each stop a task at
  a checkpoint (exit 143); the last one's task requeues itself and finishes bitwise equal to an
  uninterrupted twin;
- a resubmission on fewer nodes resumes with ``--ranks-changed``;
- a node killed mid-run: the survivors end within the stall timeout, Slurm requeues the job,
  and it resumes from the last checkpoint to the end;
- Slurm's own ``--signal=TERM@N`` at a task's time limit (slow: 2 minutes);
- the MPI's own launcher inside ``sbatch`` (Hydra's ``mpiexec``, Open MPI's ``mpirun``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.cluster.slurm import MPICH_ON_THE_NETWORK, OPEN_MPI_ON_THE_NETWORK
from hpcopt.comm.mpi_support import open_mpi
from hpcopt.io.trace import read_trace
from tests.command_line import ROOT
from tests.faults.jobs import assert_same_run
from tests.timeouts import scaled

#: What every job here needs beyond the study's own site preamble: MPI kept on the links between
#: the namespaced nodes, this checkout first on the module path, Open MPI allowed to run as root.
SITE = "\n".join([
    *(f"export {k}={v}" for k, v in {**MPICH_ON_THE_NETWORK, **OPEN_MPI_ON_THE_NETWORK}.items()),
    f"export PYTHONPATH={ROOT}",
    "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx",
    "export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe",
]) + "\n"
#: A run of the digits MLP that a test stops, checkpointing often; every counted call sleeps
#: 10 ms (no number changes), so that on any machine it is still training when the test acts.
LONG = {"dataset": "digits", "hidden": [16], "steps": 400000, "interval": 4, "trace_every": 4,
        "checkpoint_every": 40, "progress": False, "network": "alpha=0.01,bandwidth=1e9",
        "network_delay": True}
SHORT = {"dataset": "digits", "hidden": [16], "steps": 48, "interval": 4, "progress": False}


def toml_value(value: object) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def make_study(tmp_path: Path, name: str, train: dict, ranks: list[int], site: str = "",
               **job: object) -> Path:
    """``hpcopt sweep`` of a study: one task per rank count, 1 rank per node."""
    job = {"name": name, "time": "00:30:00", "ranks_per_node": 1, "requeue": 0, **job}
    text = "[job]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in job.items())
    text += "[train]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in train.items())
    text += f"[sweep]\nranks = {ranks}\n"
    (tmp_path / f"{name}.toml").write_text(text)
    (tmp_path / f"{name}-site.sh").write_text(SITE + site)
    study = tmp_path / name
    subprocess.run([sys.executable, "-m", "hpcopt", "sweep", str(tmp_path / f"{name}.toml"), "--out",
                    str(study), "--site", str(tmp_path / f"{name}-site.sh")], check=True, capture_output=True,
                   cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return study


def log(study: Path, index: int) -> str:
    path = study / "logs" / f"task-{index}.log"
    return path.read_text() if path.is_file() else ""


def record(study: Path, index: int) -> dict:
    return json.loads((study / "logs" / f"task-{index}.json").read_text())


def wait_for(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    raise AssertionError(f"not within {scaled(timeout):.0f} s: {what}")


def checkpoints(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("step-*.h5"))


def started(study: Path, run: str, count: int = 1) -> None:
    """Wait until the run has written ``count`` checkpoint(s) (it is training)."""
    wait_for(f"{count} checkpoint(s) of {run}", lambda: len(checkpoints(study / "runs" / run)) >= count, 120)


def test_every_task_runs_on_a_world_of_its_own_ranks_across_the_nodes(cluster, tmp_path):
    study = make_study(tmp_path, "w", SHORT, [1, 2])
    jobs = [cluster.sbatch(script, cwd=study) for script in ("array-n1.sh", "array-n2.sh")]
    for job in jobs:
        cluster.wait_gone(job, scaled(120))
    for index, ranks in enumerate([1, 2]):
        assert record(study, index)["exit_code"] == 0, log(study, index)
        trace = read_trace(study / "runs" / f"w-n{ranks}" / "trace.h5")
        assert trace.attrs["world_size"] == ranks and trace.summary is not None
    assert "attempt 1 (Slurm job" in log(study, 1)


def test_a_bare_srun_without_an_mpi_plugin_is_refused_loudly_and_trains_nothing(cluster, tmp_path):
    """The silent wrong result of the first real submissions: under ``MpiDefault=none`` a bare
    ``srun`` starts singletons, and each trained a 1-rank run into the 2-rank task's directory."""
    study = make_study(tmp_path, "s", SHORT, [2], site="export SLURM_MPI_TYPE=none\n", requeue=3)
    job = cluster.sbatch("array-n2.sh", cwd=study)
    cluster.wait_gone(job, scaled(120))
    text = log(study, 0)
    assert record(study, 0)["exit_code"] == 2, text
    errors = [line for line in text.splitlines() if line.startswith("hpcopt: error:")]
    assert len(errors) == 2 and all("srun started 2 processes but each is an MPI world of 1" in line
                                    and "--mpi=" in line for line in errors), text
    assert not (study / "runs" / "s-n2" / "trace.h5").exists() and "requeueing" not in text


@pytest.mark.parametrize("how", [["--signal=TERM"], ["--signal=USR1"]])
def test_a_signal_to_the_ranks_stops_the_task_at_a_checkpoint(cluster, tmp_path, how):
    study = make_study(tmp_path, "t", LONG, [2])
    job = cluster.sbatch("array-n2.sh", cwd=study)
    started(study, "t-n2")
    cluster.client(["scancel", *how, f"{job}_0"])
    cluster.wait_gone(job, scaled(60))
    text = log(study, 0)
    assert record(study, 0)["exit_code"] == 143, text
    assert "stopped at step" in text and "continue with: srun --mpi=" in text, text


def test_usr1_to_the_batch_shell_stops_the_task_which_requeues_itself_and_ends_bitwise_as_its_twin(
        cluster, tmp_path):
    """``scancel --signal=USR1 --batch`` reaches only the batch shell (the task's runner): it passes
    the signal on to srun, the run stops at a checkpoint (143), the task requeues its array task,
    and (told to start at once rather than after Slurm's 2-minute requeue delay) resumes to the
    end: the same model and trace, bit for bit, as the same run never interrupted."""
    train = {**LONG, "steps": 400}
    study = make_study(tmp_path, "b", train, [2], requeue=2)
    job = cluster.sbatch("array-n2.sh", cwd=study)
    started(study, "b-n2")
    cluster.client(["scancel", "--signal=USR1", "--batch", f"{job}_0"])
    wait_for("the task to requeue itself", lambda: "requeueing Slurm job" in log(study, 0), 60)
    cluster.wait_state(job, "PENDING", scaled(60))
    cluster.start_now(f"{job}_0", lambda: "attempt 2 (Slurm job" in log(study, 0), scaled(180))
    cluster.wait_gone(job, scaled(180))
    text = log(study, 0)
    assert "task 0: exit 143" in text and "attempt 2 (Slurm job" in text and "resume runs/b-n2" in text, text
    assert record(study, 0)["exit_code"] == 0, text
    twin = tmp_path / "twin"
    args = [f"--{k.replace('_', '-')}={','.join(map(str, v)) if isinstance(v, list) else str(v).lower()}"
            for k, v in train.items()]
    done = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "hpcopt", "train", *args, "--out",
                           str(twin)], capture_output=True, text=True, cwd=ROOT, timeout=scaled(300),
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    assert_same_run(study / "runs" / "b-n2", twin)


def test_a_resubmission_on_fewer_nodes_resumes_with_ranks_changed(cluster, tmp_path):
    study = make_study(tmp_path, "f", {**LONG, "steps": 200}, [2])
    job = cluster.sbatch("array-n2.sh", cwd=study)
    started(study, "f-n2")
    cluster.client(["scancel", "--signal=TERM", f"{job}_0"])
    cluster.wait_gone(job, scaled(60))
    job = cluster.sbatch("array-n2.sh", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", cwd=study)
    cluster.wait_gone(job, scaled(180))
    text = log(study, 0)
    assert "--ranks-changed" in text and record(study, 0)["exit_code"] == 0, text
    trace = read_trace(study / "runs" / "f-n2" / "trace.h5")
    assert trace.summary is not None


def test_a_node_killed_mid_run_is_requeued_by_slurm_and_resumes_to_the_end(cluster, tmp_path):
    """Node 2 loses power (every process of it killed). Under MPICH the survivor waits until Slurm
    declares the node down (``SlurmdTimeout`` 10 s here, minutes on real clusters), which cancels
    the job and requeues it (``--requeue``); under Open MPI the survivor ends at once and the
    task requeues its job itself. Once the node is back the task resumes from its newest
    checkpoint and finishes."""
    study = make_study(tmp_path, "k", {**LONG, "steps": 600, "stall_timeout": 15}, [2], requeue=2)
    job = cluster.sbatch("array-n2.sh", cwd=study)
    started(study, "k-n2", 2)
    cluster.kill_node(2)  # slurmd, the step and the rank on node 2
    wait_for("Slurm to requeue the job", lambda: "PENDING" in (cluster.states(job) or []), 120)
    cluster.start_slurmd(2)
    cluster.start_now(f"{job}_0", lambda: "attempt 2 (Slurm job" in log(study, 0), scaled(180))
    cluster.wait_gone(job, scaled(240))
    text = log(study, 0)
    assert "NODE FAILURE" in text or "requeueing Slurm job" in text, text  # by Slurm, or by the task
    assert "attempt 2 (Slurm job" in text and "resume runs/k-n2" in text, text
    assert record(study, 0)["exit_code"] == 0, text
    assert read_trace(study / "runs" / "k-n2" / "trace.h5").summary is not None


def test_the_mpis_own_launcher_inside_sbatch_runs_one_world_across_the_nodes(cluster, tmp_path):
    launcher = "mpirun" if open_mpi() else "mpiexec"
    site = tmp_path / "site.sh"
    site.write_text(f"source {sys.prefix}/bin/activate\n" + SITE)
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --time=5 --output=job.log\n"
                      f"source {site}\n{launcher} -n 2 python -m hpcopt train --dataset digits --hidden 16 "
                      f"--steps 16 --out run\n")
    job = cluster.sbatch(script, cwd=tmp_path)
    cluster.wait_gone(job, scaled(120))
    trace = read_trace(tmp_path / "run" / "trace.h5")
    assert trace.attrs["world_size"] == 2, (tmp_path / "job.log").read_text()


@pytest.mark.slow
def test_slurms_own_signal_at_the_time_limit_stops_the_task_at_a_checkpoint(cluster, tmp_path):
    """``--time=00:02:00``: the array asks for SIGTERM 30 s before the limit (a quarter of the
    time, not 120 s: Slurm would send that at once) and Slurm sends it up to 30 s earlier still."""
    study = make_study(tmp_path, "l", LONG, [2], time="00:02:00")
    assert "#SBATCH --signal=TERM@30" in (study / "array-n2.sh").read_text()
    job = cluster.sbatch("array-n2.sh", cwd=study)
    started(study, "l-n2")
    begun = time.monotonic()
    cluster.wait_gone(job, scaled(200))
    text = log(study, 0)
    assert record(study, 0)["exit_code"] == 143 and "stopped at step" in text, text
    assert time.monotonic() - begun > 30  # not at once


def test_a_packed_studys_runs_equal_its_array_runs_bit_for_bit(cluster, tmp_path):
    """The same study run as arrays (one job per task) and packed (every task a job step of one
    allocation of 2 nodes, two 1-rank tasks at once beside each other or one 2-rank task across
    both): every run directory bitwise the same."""
    arrays = make_study(tmp_path, "p", SHORT, [1, 2], pack_nodes=2)
    packed = tmp_path / "packed"
    shutil.copytree(arrays, packed)
    jobs = [cluster.sbatch(script, cwd=arrays) for script in ("array-n1.sh", "array-n2.sh")]
    jobs.append(cluster.sbatch("packed.sh", cwd=packed))
    for job in jobs:
        cluster.wait_gone(job, scaled(180))
    text = (packed / "logs" / "packed.log").read_text()
    assert "2 task(s) on 2 task slot(s)" in text and "all 2 task(s) finished" in text, text
    for index, ranks in enumerate([1, 2]):
        assert record(packed, index)["exit_code"] == 0 and "srun --exact --ntasks" in log(packed, index)
        assert_same_run(packed / "runs" / f"p-n{ranks}", arrays / "runs" / f"p-n{ranks}")
