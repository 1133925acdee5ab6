"""Which launcher started a process and whether its processes share one MPI world
(hpcopt.comm.launcher), from the environments Slurm 22.05's ``srun``, MPICH's Hydra and Open MPI's
``mpirun`` give their processes (each seen under a real Slurm), and ``hpcopt train`` refusing a
singleton of a several-process launch before it writes anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpcopt.comm.launcher import HYDRA, PRRTE, SRUN, Launch, detect, relaunch_command, singleton_problem
from tests.command_line import ROOT
from tests.timeouts import scaled

#: The variables that tell the launch apart, as each launcher set them for a 2-process job.
SRUN_NONE = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}
SRUN_PMI2 = {**SRUN_NONE, "SLURM_MPI_TYPE": "pmi2", "PMI_SIZE": "2", "PMI_RANK": "0", "PMI_FD": "5"}
HYDRA_OVER_SRUN = {**SRUN_NONE, "PMI_SIZE": "4", "PMI_RANK": "0", "PMI_HOSTNAME": "n1",
                   "MPI_LOCALNRANKS": "2"}
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": "2", "PRTE_LAUNCHED": "1", "OMPI_COMMAND": "python"}
BATCH_SHELL = {"SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}  # no step: the batch script itself
MPICH, OPEN_MPI_LIBRARY = "MPICH Version: 4.3.0", "Open MPI v5.0.8"


@pytest.mark.parametrize("environ, expected", [
    (SRUN_NONE, Launch(SRUN, 2, "")),
    (SRUN_PMI2, Launch(SRUN, 2, "pmi2")),
    (HYDRA_OVER_SRUN, Launch(HYDRA, 4)),  # Hydra's proxies are the step's tasks, not the ranks
    (OPEN_MPI, Launch(PRRTE, 2)),
    (BATCH_SHELL, Launch("", None)),  # SLURM_NTASKS is the allocation's, not a launch
    ({}, Launch("", None)),
])
def test_the_launch_is_read_from_the_launchers_own_variables(environ, expected):
    assert detect(environ) == expected


def test_a_singleton_of_srun_without_an_mpi_plugin_names_the_plugin_each_library_needs():
    mpich = singleton_problem(1, MPICH, detect(SRUN_NONE))
    assert "srun started 2 processes but each is an MPI world of 1" in mpich
    assert "no MPI plugin" in mpich and "srun --mpi=pmi2" in mpich and "SLURM_MPI_TYPE=pmi2" in mpich
    assert "srun --mpi=pmix" in singleton_problem(1, OPEN_MPI_LIBRARY, detect(SRUN_PMI2))
    assert "'pmi2'" in singleton_problem(1, OPEN_MPI_LIBRARY, detect(SRUN_PMI2))


def test_a_singleton_of_mpiexec_blames_two_mpi_libraries():
    problem = singleton_problem(1, OPEN_MPI_LIBRARY, detect(HYDRA_OVER_SRUN))
    assert "mpiexec started 4 processes" in problem and "different MPI libraries" in problem


@pytest.mark.parametrize("size, environ", [(2, SRUN_PMI2), (1, BATCH_SHELL), (1, {}),
                                           (1, {**SRUN_NONE, "SLURM_STEP_NUM_TASKS": "1"})])
def test_one_world_or_a_launch_of_one_is_no_problem(size, environ):
    assert singleton_problem(size, MPICH, detect(environ)) == ""


def test_the_relaunch_command_is_the_launchers_own():
    assert relaunch_command(2, detect(SRUN_PMI2)) == "srun --mpi=pmi2 -n 2"
    assert relaunch_command(2, detect(SRUN_NONE)) == "srun -n 2"
    assert relaunch_command(4, detect(OPEN_MPI)) == "mpirun -n 4"
    assert relaunch_command(4, detect(HYDRA_OVER_SRUN)) == "mpiexec -n 4"
    assert relaunch_command(3, detect({})) == "mpiexec -n 3"


def test_train_refuses_a_singleton_of_a_two_task_srun_step_before_writing_anything(tmp_path):
    """The silent wrong result of a bare ``srun`` under ``MpiDefault=none``: each process would
    train a 1-rank run into the 2-rank task's directory. Here one such process (Slurm's step
    variables, no PMI) is refused in one line, exit 2, and no run directory appears."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "SLURM_", "OMPI_", "PMIX_",
                                                                     "HYDRA_", "MPI_LOCAL", "PRTE_"))}
    env.update(SRUN_NONE, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "hpcopt", "train", "--dataset", "digits", "--steps", "4",
                           "--out", str(out)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=scaled(60))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcopt: error: srun started 2 processes"), done.stderr
    assert "--mpi=" in lines[0]
    assert not out.exists()
