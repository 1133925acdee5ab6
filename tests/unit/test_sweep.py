"""``hpcopt sweep``: sweep files are checked against ``hpcopt train``'s options and values, every
array script renders to valid bash with paths relative to its study, tasks of one rank count
form one array, and the manifest and task records read back."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcopt.cli import make_parser
from hpcopt.errors import HpcoptError
from hpcopt.study import layout, sweep
from hpcopt.study.spec import JOB_DEFAULTS, Study, load_study, tasks
from tests.command_line import assert_one_line_error

BASIC = """
[job]
scheduler = "{scheduler}"
name = "t"
ranks_per_node = {per_node}
gpus_per_node = {gpus}
throttle = {throttle}
[train]
dataset = "digits"
steps = 20
hidden = [16]
[sweep]
ranks = [1, 2, 3]
interval = [1, 4]
"""


def write_sweep(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def basic(tmp_path: Path, scheduler: str = "slurm", per_node: int = 2, gpus: int = 0,
          throttle: int = 0) -> Path:
    return write_sweep(tmp_path, BASIC.format(scheduler=scheduler, per_node=per_node, gpus=gpus,
                                              throttle=throttle))


def sweep_args(*argv: str):
    return make_parser().parse_args(["sweep", *argv])


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
@pytest.mark.parametrize("gpus", [0, 2])
def test_one_array_per_rank_count_renders_to_valid_bash(tmp_path, scheduler, gpus):
    study = load_study(basic(tmp_path, scheduler, gpus=gpus, throttle=2))
    found = tasks(study)
    assert [(t.index, t.name, t.ranks) for t in found] == [
        (0, "t-n1-I1", 1), (1, "t-n1-I4", 1), (2, "t-n2-I1", 2), (3, "t-n2-I4", 2),
        (4, "t-n3-I1", 3), (5, "t-n3-I4", 3)]
    assert found[3].args == ("--dataset", "digits", "--steps", "20", "--hidden", "16", "--interval", "4",
                             *(("--device", "gpu") if gpus else ()))
    arrays = sweep.scripts(study, found)
    assert [(a.name, a.first, a.last) for a in arrays] == [
        ("array-n1.sh", 0, 1), ("array-n2.sh", 2, 3), ("array-n3.sh", 4, 5)]
    for array in arrays:
        assert "${" not in array.text.replace("${HPCOPT_SITE", "").replace("${PBS_O_WORKDIR", "") \
            .replace("${SLURM_ARRAY_TASK_ID", "").replace("${PBS_ARRAY_INDEX", "")
        assert str(tmp_path) not in array.text and "logs/task-" in array.text  # relative paths only
        script = tmp_path / array.name
        script.write_text(array.text)
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert ("--gpus-per-task=1" in array.text) == bool(gpus and scheduler == "slurm")
        assert ("ngpus=2" in array.text) == bool(gpus and scheduler == "pbs")
    three = arrays[2].text
    if scheduler == "slurm":
        assert "#SBATCH --array=4-5%2" in three and "#SBATCH --nodes=2" in three
        assert "#SBATCH --ntasks=3" in three and '"${SLURM_ARRAY_TASK_ID}" --requeue 5 srun' in three
        assert "#SBATCH --open-mode=append" in three and "#SBATCH --signal=TERM@120" in three
    else:
        assert "#PBS -J 4-5" in three and "select=2:" in three and "max_run_subjobs=2" in three
        assert '"${PBS_ARRAY_INDEX}" mpiexec -n 3' in three


@pytest.mark.parametrize("scheduler,expected", [("slurm", "--array=0"), ("pbs", "-J 0-1:2")])
def test_a_single_task_is_an_array_of_one(tmp_path, scheduler, expected):
    study = load_study(write_sweep(tmp_path, f"[job]\nscheduler = '{scheduler}'\n[train]\nsteps = 4\n"))
    [array] = sweep.scripts(study, tasks(study))
    assert expected in array.text and "%" not in array.text.split("--array=")[-1].split()[0]


@pytest.mark.parametrize("text,message", [
    ("[job]\nscheduler = 'lsf'\n[sweep]\nranks = [1]\n", "scheduler"),
    ("[job]\nqueue = 'x'\n", "unknown [job] key"),
    ("[job]\nthrottle = -1\n", "throttle must be an integer from 0 to 1000000"),
    ("[job]\nranks_per_node = 1000000000\n", "ranks_per_node must be an integer from 1 to 4096"),
    ("[job]\ncpus_per_rank = 5000\n", "cpus_per_rank must be an integer from 1 to 4096"),
    ("[job]\ngpus_per_node = 65\nranks_per_node = 65\n", "gpus_per_node must be an integer from 0 to 64"),
    ("[sweep]\nranks = [1000000000]\n", "ranks must be integers from 1 to 10000000"),
    ("[sweep]\nranks = [1000000]\n", "ranks_per_node 1 would ask for 1000000 nodes"),
    ("[job]\nname = 'a b'\n", "[job] name must be a word"),
    ("[train]\nlearning_rate = 0.1\n", "not an hpcopt train option"),
    ("[sweep]\ninterval = 4\n", "non-empty list"),
    ("[sweep]\nranks = [0]\n", "integers from 1"),
    ("[jobs]\n", "unknown table"),
    ("[train]\nout = 'x'\n", "set by the sweep"),
    ("[job]\nranks_per_node = 4\ngpus_per_node = 2\n", "one rank per GPU"),
    ("[sweep]\nlr = [0.1, -1]\n", "task hpcopt-n1-lr-1: lr must be > 0"),  # values are checked too
    ("[sweep]\nalgorithm = ['prsgd', 'sgdx']\n", "unknown algorithm 'sgdx'"),
    ("[train]\nsteps = 'many'\n", "steps must be an integer"),
    ("[sweep]\nhidden = [[16, 8], [16, 8]]\n", "would share the run directory runs/hpcopt-n1-hidden16_8"),
    ("[train\n", "is not valid TOML"),
])
def test_bad_sweep_files_are_refused(tmp_path, text, message):
    with pytest.raises(HpcoptError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tasks(load_study(write_sweep(tmp_path, text)))


def test_a_study_of_several_grids_runs_each_grids_tasks(tmp_path):
    study = load_study(write_sweep(tmp_path, """
[job]
name = "u"
[train]
dataset = "digits"
steps = 20
[[sweep]]
ranks = [2]
interval = [1, 4]
[[sweep]]
ranks = [1, 2]
interval = [4]
momentum = [0.9]
"""))
    found = tasks(study)
    # ranks outermost over the union; a name holds what its grid sweeps and what differs between grids
    assert [(t.index, t.name, t.ranks) for t in found] == [
        (0, "u-n1-I4-momentum0.9", 1), (1, "u-n2-I1", 2), (2, "u-n2-I4", 2), (3, "u-n2-I4-momentum0.9", 2)]
    assert found[3].args == ("--dataset", "digits", "--steps", "20", "--interval", "4", "--momentum", "0.9")
    assert [(a.first, a.last) for a in sweep.scripts(study, found)] == [(0, 0), (1, 3)]
    with pytest.raises(HpcoptError, match="would share the run directory runs/u-n1"):
        tasks(load_study(write_sweep(tmp_path, "[job]\nname = 'u'\n[[sweep]]\ninterval = [2]\n"
                                                "[[sweep]]\ninterval = [2]\n")))
    with pytest.raises(HpcoptError, match="non-empty list"):
        load_study(write_sweep(tmp_path, "[[sweep]]\ninterval = [2]\n[[sweep]]\nseed = 3\n"))


def test_dry_run_lists_the_tasks_and_writes_nothing(tmp_path, capsys):
    path = basic(tmp_path)
    assert sweep.run(sweep_args(str(path), "--out", str(tmp_path / "study"), "--dry-run")) == 0
    assert not (tmp_path / "study").exists()
    out = capsys.readouterr().out
    assert out.count("runs/t-n") == 6 and "would write 6 task(s)" in out
    assert "array-n2.sh (tasks 2-3, 2 rank(s))" in out


def test_the_study_directory_and_its_manifest(tmp_path, capsys):
    path = basic(tmp_path, "pbs")
    site = tmp_path / "mysite.sh"
    site.write_text("module load mpi\n")
    out = tmp_path / "study"
    assert sweep.run(sweep_args(str(path), "--out", str(out), "--site", str(site))) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "array-n1.sh", "array-n2.sh", "array-n3.sh", "logs", "manifest.tsv", "site.sh", "study.toml"]
    preamble, user = (out / "site.sh").read_text().split("# srun --mpi for MPICH\n")
    assert user == "module load mpi\n"  # the user's site file, after what this environment needs:
    assert f"source {sys.prefix}/bin/activate" in preamble  # PBS passes no environment on
    assert 'export SLURM_MPI_TYPE="${SLURM_MPI_TYPE:-pmi2}"' in preamble  # a bare srun: singletons
    assert (out / "study.toml").read_text() == path.read_text()
    assert "cd " + str(out) + "; qsub array-n1.sh; qsub array-n2.sh; qsub array-n3.sh" in capsys.readouterr().out
    entries = layout.read_manifest(out)
    assert [(e.index, e.run.as_posix(), e.ranks) for e in entries][3] == (3, "runs/t-n2-I4", 2)
    assert entries[3].args == tasks(load_study(path))[3].args
    # the same sweep again is fine (nothing changes); another sweep into it is refused
    assert sweep.run(sweep_args(str(path), "--out", str(out))) == 0
    other = write_sweep(tmp_path, BASIC.format(scheduler="pbs", per_node=2, gpus=0, throttle=0)
                        .replace("[1, 4]", "[1, 8]"))
    with pytest.raises(HpcoptError, match="holds another study"):
        sweep.run(sweep_args(str(other), "--out", str(out)))


def test_without_a_site_file_the_study_gets_a_stub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no jobs/site.sh here
    assert sweep.run(sweep_args(str(basic(tmp_path)), "--out", "s")) == 0
    assert (tmp_path / "s" / "site.sh").read_text() == sweep.site_preamble() + sweep.SITE_STUB
    with pytest.raises(HpcoptError, match="cannot read the site file"):
        sweep.run(sweep_args(str(basic(tmp_path)), "--out", "s", "--site", "nowhere.sh"))
    with pytest.raises(HpcoptError, match="-j K needs --local"):
        sweep.run(sweep_args(str(basic(tmp_path)), "--out", "s", "-j", "2"))


@pytest.mark.parametrize("line,message", [
    ("0\truns/a\t1", "expected 4 tab-separated fields"),
    ("1\truns/a\t1\t--steps 4", "expected task 0"),
    ("0\t../a\t1\t--steps 4", "inside the study"),
    ("0\t/abs\t1\t--steps 4", "inside the study"),
    ("0\truns/a\t0\t--steps 4", "ranks >= 1"),
    ("0\truns/a\t1\t--steps 'open", "expected 4 tab-separated fields"),
])
def test_a_malformed_manifest_is_refused_naming_the_line(tmp_path, line, message):
    (tmp_path / "manifest.tsv").write_text("\t".join(layout.COLUMNS) + "\n" + line + "\n")
    with pytest.raises(HpcoptError, match=f"manifest.tsv:2: .*{message}"):
        layout.read_manifest(tmp_path)


def test_a_task_record_is_locked_while_it_runs(tmp_path):
    entry = layout.Entry(0, Path("runs/a"), 1, ())
    record = layout.TaskRecord(tmp_path, entry)
    path = layout.record_path(tmp_path, 0)
    assert layout.lock_held(path) is None  # no record yet
    record.start()
    assert layout.lock_held(path) is True
    assert layout.read_record(path)["locked"] is True and "exit_code" not in layout.read_record(path)
    layout.LOCK_WAIT, saved = 0.3, layout.LOCK_WAIT
    try:
        with pytest.raises(HpcoptError, match="task 0 is running already"):
            layout.TaskRecord(tmp_path, entry).start()
    finally:
        layout.LOCK_WAIT = saved
    record.end(143)
    assert layout.lock_held(path) is False and layout.read_record(path)["exit_code"] == 143
    path.write_text("{not json")
    assert layout.read_record(path) is None


def test_sweep_command_line_errors_are_one_line(tmp_path):
    from tests.command_line import launch

    assert_one_line_error(launch(["sweep", str(tmp_path / "none.toml")], ranks=1), "sweep file not found")
    bad = write_sweep(tmp_path, "[sweep]\nlr = [0.1, 0]\n")
    assert_one_line_error(launch(["sweep", str(bad), "--dry-run"], ranks=1), "lr must be > 0")


def test_the_task_runner_needs_an_index_and_a_launcher(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hpcopt.study.task", "x"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 2 and "usage" in done.stderr
    done = subprocess.run([sys.executable, "-m", "hpcopt.study.task", "0", "mpiexec"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("hpcopt: error: cannot read the manifest")


def test_a_requeued_torch_task_names_its_model_again_on_resume(tmp_path):
    """hpcopt imports no module a checkpoint names: a task's resume repeats --model."""
    from hpcopt.study.task import command

    run = tmp_path / "runs" / "t0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step-000000008.h5").write_bytes(b"")
    torch_task = layout.Entry(0, Path("runs/t0"), 2, ("--model", "torch:tests.torch_models:bn_cnn", "--lr", "0.1"))
    assert command(tmp_path, torch_task, [])[-4:] == ["resume", "runs/t0", "--model",
                                                      "torch:tests.torch_models:bn_cnn"]
    builtin = layout.Entry(0, Path("runs/t0"), 2, ("--model", "mlp"))
    assert command(tmp_path, builtin, [])[-2:] == ["resume", "runs/t0"]


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(value=st.text(max_size=12), other=st.sampled_from(["", "data", "a\u2028b"]))
def test_any_sweep_value_is_refused_in_one_line_or_read_back_from_the_manifest(value, other):
    """A text value (here ``path``) with a line separator of any kind (U+2028, U+0085, ...) once
    passed ``sweep`` and then broke every task's manifest line."""
    study = Study(dict(JOB_DEFAULTS), {"dataset": "digits"}, [{"path": [value, other]}], "")
    try:
        found = tasks(study)
    except HpcoptError as exc:
        assert len(str(exc).splitlines()) == 1
        return
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / layout.MANIFEST).write_text(layout.manifest_text(found))
        entries = layout.read_manifest(Path(directory))
    assert [(e.index, e.run, e.ranks, e.args) for e in entries] == [(t.index, t.run, t.ranks, t.args)
                                                                     for t in found]
