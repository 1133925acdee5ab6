"""An algorithm from outside the package, as a user ships one: a package of their own whose
pyproject.toml declares an entry point of the group ``hpcopt.algorithms``, installed with
``pip install -e``, then trained at 2 ranks under mpiexec and resumed bit for bit; a broken
entry point is one error line; and the Python API's ``register`` from a user's script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.command_line import ROOT, assert_one_line_error, launch
from tests.timeouts import scaled

DISTRIBUTION = "hpcopt-test-outside-algorithm"
ALGORITHM = """
from dataclasses import dataclass
from typing import ClassVar

from hpcopt.algorithms import LocalSGD, option


@dataclass(frozen=True, kw_only=True)
class ScaledSGD(LocalSGD):
    \"\"\"PR-SGD with its step size scaled by lr_scale.\"\"\"

    name: ClassVar[str] = "outside_sgd"
    lr_scale: float = option(0.5, "multiplies PR-SGD's step size")

    def lr_at(self, t: int) -> float:
        return self.lr_scale * super().lr_at(t)
"""
PYPROJECT = f"""
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{DISTRIBUTION}"
version = "0.1"

[project.entry-points."hpcopt.algorithms"]
outside_sgd = "outside_algorithm.scaled:ScaledSGD"
"""
SMALL = ["--dataset", "digits", "--hidden", "16", "--interval", "4", "--dtype", "float64",
         "--trace-every", "2", "--progress", "false"]


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=scaled(300), stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package, installed editable into this environment for the module's tests, then
    uninstalled. Offline first (no build isolation: the setuptools and wheel installed here);
    where those cannot build an editable install, with build isolation if an index answers
    quickly; skipped with pip's reason otherwise."""
    package = tmp_path_factory.mktemp("outside")
    (package / "pyproject.toml").write_text(PYPROJECT)
    (package / "src" / "outside_algorithm").mkdir(parents=True)
    (package / "src" / "outside_algorithm" / "__init__.py").write_text("")
    (package / "src" / "outside_algorithm" / "scaled.py").write_text(ALGORITHM)
    offline = pip("install", "--no-deps", "--no-build-isolation", "-e", str(package))
    done = offline if offline.returncode == 0 else pip(
        "install", "--no-deps", "--retries", "0", "--timeout", "10", "-e", str(package))
    if done.returncode != 0:
        pytest.skip(f"pip cannot install a package here: {_last_line(offline)}; with build isolation: "
                    f"{_last_line(done)}")
    try:
        yield package
    finally:
        removed = pip("uninstall", "--yes", DISTRIBUTION)
        assert removed.returncode == 0, removed.stderr


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {done.returncode}"


def test_an_installed_entry_point_trains_at_two_ranks_and_resumes_bitwise(installed, tmp_path):
    whole, split, prsgd = tmp_path / "whole", tmp_path / "split", tmp_path / "prsgd"
    for args in (["train", "--algorithm", "outside_sgd", "--steps", "24", "--out", str(whole)],
                 ["train", "--algorithm", "outside_sgd", "--steps", "12", "--out", str(split)],
                 ["resume", str(split), "--steps", "24"],
                 ["train", "--algorithm", "prsgd", "--steps", "24", "--out", str(prsgd)]):
        result = launch([*args[:1], *SMALL, *args[1:]], ranks=2)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    # read in a new process: this one started before the package was installed, so neither its
    # registry nor its import system has the entry point
    compared = subprocess.run([sys.executable, "-c", COMPARE, str(whole), str(split), str(prsgd)],
                              capture_output=True, text=True, cwd=ROOT, timeout=scaled(120))
    assert compared.returncode == 0, compared.stderr
    assert compared.stdout.split() == ["24", "2", "outside_sgd", "0.5", "bitwise", "differs"]


COMPARE = """
import sys

import numpy as np

from hpcopt.io.data_parallel_checkpoint import find_checkpoint, read_checkpoint
from hpcopt.io.trace import read_trace

whole, split, prsgd = (read_checkpoint(find_checkpoint(run)) for run in sys.argv[1:])
print(whole.tick, whole.world_size, whole.config.algorithm.algorithm, whole.config.algorithm.lr_scale)
assert (split.tick, split.world_size) == (whole.tick, whole.world_size)
for name in ("model", "sampler"):
    assert getattr(whole, name).tobytes() == getattr(split, name).tobytes(), name
for name in ("rows", "counters", "scalars", "shared"):
    a, b = getattr(whole, name), getattr(split, name)
    assert sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in a), name
a, b = (read_trace(run + "/trace.h5") for run in sys.argv[1:3])
assert len(a.columns["step"]) == 12
assert all(a.columns[c].tobytes() == b.columns[c].tobytes() for c in ("step", "loss_mean", "loss_max"))
print("bitwise")
# its own step size ran: the same options under PR-SGD train another model
print("same" if np.array_equal(whole.model, prsgd.model) else "differs")
"""


def test_help_lists_the_installed_algorithm_and_its_option(installed):
    done = subprocess.run([sys.executable, "-m", "hpcopt", "train", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=scaled(120))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "| outside_sgd [algorithm; default: prsgd]" in text
    assert "--lr-scale VALUE multiplies PR-SGD's step size [algorithm: outside_sgd; default: 0.5]" in text


@pytest.mark.parametrize("module, raised", [
    (None, "ModuleNotFoundError: No module named 'broken_algorithm_module'"),
    ("import sys\nsys.exit(0)\n", "it called sys.exit(0)"),  # once: every train exited 0, untrained
    ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),  # once: a traceback
], ids=["missing", "sys.exit(0)", "KeyboardInterrupt"])
def test_an_entry_point_that_fails_to_import_is_one_line_naming_it(tmp_path, module, raised):
    """A package's metadata on the path is all importlib.metadata needs to list its entry points:
    no pip needed to install a broken one. Whatever its module raises at import, SystemExit and
    KeyboardInterrupt included, is one line naming the package, exit 2."""
    info = tmp_path / "broken_algorithm-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-algorithm\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hpcopt.algorithms]\nbroken = broken_algorithm_module:Broken\n")
    if module is not None:
        (tmp_path / "broken_algorithm_module.py").write_text(module)
    result = subprocess.run(
        ["mpiexec", "-n", "2", sys.executable, "-m", "hpcopt", "train", "--steps", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=scaled(120),
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path}"})
    assert_one_line_error(result, "entry point broken = 'broken_algorithm_module:Broken' (group "
                          "'hpcopt.algorithms' of package 'broken-algorithm') could not be loaded: "
                          f"{raised} (fix that package or uninstall it)")


SCRIPT = """
import sys

import numpy as np
from mpi4py import MPI

import hpcopt
{define}

out, algorithm = sys.argv[1], sys.argv[2]
said = open(f"{{out}}-said-by-rank-{{MPI.COMM_WORLD.Get_rank()}}.txt", "w")  # a file a rank: no interleaving
run = {{"algorithm": algorithm, "dataset": "digits", "hidden": "16", "interval": "4",
        "dtype": "float64", "progress": "false"}}
_, whole = hpcopt.train(hpcopt.build_config(None, {{**run, "steps": "24", "out": out + "/whole"}}),
                        verbose=False)
hpcopt.train(hpcopt.build_config(None, {{**run, "steps": "12", "out": out + "/split"}}), verbose=False)
try:
    _, resumed = hpcopt.train(hpcopt.build_config(None, {{**run, "steps": "24"}}), verbose=False,
                              resume=out + "/split")
except hpcopt.HpcoptError as exc:
    print("refused:", exc, file=said)
else:
    print("bitwise:", whole.x.tobytes() == resumed.x.tobytes(), file=said)
said.close()
"""
IN_MODULE = """
from dataclasses import dataclass
from typing import ClassVar

from hpcopt.algorithms import LocalSGD, option, register


@register
@dataclass(frozen=True, kw_only=True)
class Halved(LocalSGD):
    name: ClassVar[str] = "{name}"
    lr_scale: float = option(0.5, "multiplies PR-SGD's step size")

    def lr_at(self, t: int) -> float:
        return self.lr_scale * super().lr_at(t)
"""


@pytest.mark.parametrize("where", ["module", "script"])
def test_register_from_a_script_trains_and_resumes_where_its_module_can_be_imported(tmp_path, where):
    """The Python API at 2 ranks: a class registered in a module the script imports resumes
    bit for bit (the process that reads the checkpoint first imports that module); one defined
    in the script itself trains, and its resume is refused with what to do."""
    if where == "module":
        (tmp_path / "my_algorithms.py").write_text(IN_MODULE.format(name="halved"))
        define = "import my_algorithms"
    else:
        define = IN_MODULE.format(name="halved")
    (tmp_path / "script.py").write_text(SCRIPT.format(define=textwrap.dedent(define)))
    result = subprocess.run(
        ["mpiexec", "-n", "2", sys.executable, str(tmp_path / "script.py"), str(tmp_path / "runs"), "halved"],
        capture_output=True, text=True, cwd=tmp_path, timeout=scaled(240),
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    said = {(tmp_path / f"runs-said-by-rank-{rank}.txt").read_text() for rank in range(2)}  # the ranks agree
    if where == "module":
        assert said == {"bitwise: True\n"}
    else:
        assert len(said) == 1, said
        line = said.pop()
        assert line.startswith("refused: ") and "algorithm 'halved' was registered in the script itself " \
            "(__main__)" in line and "move the class into a module the script imports" in line, line
