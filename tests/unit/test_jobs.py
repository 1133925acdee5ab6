"""Job scripts: every template renders to valid bash, sweeps expand and validate, and a rendered
Slurm script runs end to end with a stand-in ``srun`` that calls ``mpiexec``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sweep", ROOT / "jobs" / "sweep.py")
sweep = importlib.util.module_from_spec(spec)
sys.modules["sweep"] = sweep
spec.loader.exec_module(sweep)


def write_sweep(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


BASIC = """
[job]
scheduler = "{scheduler}"
name = "t"
ranks_per_node = {per_node}
gpus_per_node = {gpus}
[train]
dataset = "digits"
steps = 20
[sweep]
ranks = [1, 2, 3]
interval = [1, 4]
"""


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
@pytest.mark.parametrize("gpus", [0, 2])
def test_every_template_renders_to_valid_bash(tmp_path, scheduler, gpus):
    path = write_sweep(tmp_path, BASIC.format(scheduler=scheduler, per_node=2, gpus=gpus))
    jobs = sweep.expand(*sweep.load_sweep(path), tmp_path / "out", ROOT / "jobs" / "site.sh")
    assert len(jobs) == 6
    assert len({job.name for job in jobs}) == 6
    for job in jobs:
        assert "${" not in job.script.replace("${HPCOPT_SITE", "").replace("${PBS_O_WORKDIR", "")
        script = tmp_path / f"{job.name}.sh"
        script.write_text(job.script)
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert ("--device gpu" in job.script) == bool(gpus)
    three = next(job for job in jobs if job.name == "t-n3-I4")
    if scheduler == "slurm":
        assert "#SBATCH --nodes=2" in three.script and "#SBATCH --ntasks=3" in three.script
    else:
        assert "select=2:" in three.script and "mpiexec -n 3" in three.script


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_a_resubmitted_torch_job_names_its_model_again(tmp_path, scheduler):
    """hpcopt imports no module a checkpoint names: the resume branch repeats --model."""
    text = BASIC.format(scheduler=scheduler, per_node=2, gpus=0).replace(
        'dataset = "digits"', 'dataset = "digits"\nmodel = "torch:tests.torch_models:bn_cnn"')
    jobs = sweep.expand(*sweep.load_sweep(write_sweep(tmp_path, text)), tmp_path / "out",
                        ROOT / "jobs" / "site.sh")
    for job in jobs:
        (resume,) = [line for line in job.script.splitlines() if "python -m hpcopt resume" in line]
        assert resume.endswith(" --model torch:tests.torch_models:bn_cnn"), resume


@pytest.mark.parametrize("text,message", [
    ("[job]\nscheduler = 'lsf'\n[sweep]\nranks = [1]\n", "scheduler"),
    ("[job]\nqueue = 'x'\n", "unknown [job] key"),
    ("[train]\nlearning_rate = 0.1\n", "not an hpcopt train option"),
    ("[sweep]\ninterval = 4\n", "non-empty list"),
    ("[sweep]\nranks = [0]\n", "positive"),
    ("[jobs]\n", "unknown table"),
    ("[train]\nout = 'x'\n", "set by the sweep"),
    ("[job]\nranks_per_node = 4\ngpus_per_node = 2\n", "one rank per GPU"),
])
def test_bad_sweep_files_are_refused(tmp_path, text, message):
    with pytest.raises(sweep.SweepError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sweep.load_sweep(write_sweep(tmp_path, text))


def test_dry_run_writes_nothing(tmp_path, capsys):
    path = write_sweep(tmp_path, BASIC.format(scheduler="slurm", per_node=4, gpus=0))
    assert sweep.main([str(path), "--out", str(tmp_path / "gen"), "--dry-run"]) == 0
    assert not (tmp_path / "gen").exists()
    assert capsys.readouterr().out.count(".sh") == 6


def test_rendered_slurm_script_runs_end_to_end_with_a_stand_in_srun(tmp_path):
    path = write_sweep(tmp_path, BASIC.format(scheduler="slurm", per_node=2, gpus=0))
    out = tmp_path / "gen"
    assert sweep.main([str(path), "--out", str(out)]) == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text('#!/bin/bash\nexec mpiexec -n "$SLURM_NTASKS" "$@"\n')
    srun.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
               SLURM_NTASKS="2", PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT="100")
    result = subprocess.run(["bash", str(out / "t-n2-I4.sh")], capture_output=True, text=True,
                            env=env, timeout=scaled(120), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "summary" in result.stdout and "2 rank(s)" in result.stdout
    assert "I=4" in result.stdout
    run_dir = out / "runs" / "t-n2-I4"
    assert (run_dir / "trace.h5").is_file() and (out / "logs").is_dir()
    # submitted again (a requeue), the same script resumes the finished run and says so
    again = subprocess.run(["bash", str(out / "t-n2-I4.sh")], capture_output=True, text=True,
                           env=env, timeout=scaled(120), cwd=tmp_path)
    assert again.returncode == 2 and "the run is complete" in again.stderr
