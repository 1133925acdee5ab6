"""Algorithms from outside the package, in one process: ``register(cls)``, entry points (faked
here; tests/unit/test_outside_algorithm.py installs a real one), their clashes and errors."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import ClassVar

import pytest

from hpcopt.algorithms import ENTRY_POINT_GROUP, LocalSGD, option, register, registration, registry
from hpcopt.cli import make_parser
from hpcopt.config import algorithm_options, build_config, config_from_toml, to_toml
from hpcopt.errors import HpcoptError
from tests.timeouts import scaled


@dataclass(frozen=True, kw_only=True)
class ScaledSGD(LocalSGD):
    """PR-SGD with its step size scaled (an algorithm of a user's own)."""

    name: ClassVar[str] = "scaled_sgd"
    lr_scale: float = option(0.5, "multiplies PR-SGD's step size")

    def lr_at(self, t: int) -> float:
        return self.lr_scale * super().lr_at(t)


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    """Each test starts from the built-ins and leaves them as they were."""
    monkeypatch.setattr(registration, "_by_call", {})
    monkeypatch.setattr(registration, "entry_points", lambda group: [])
    registration.from_entry_points.cache_clear()
    registration.registry.cache_clear()
    yield
    monkeypatch.undo()
    registration.from_entry_points.cache_clear()
    registration.registry.cache_clear()


def fake_entry_points(monkeypatch, *points):
    monkeypatch.setattr(registration, "entry_points",
                        lambda group: [EntryPoint(name, value, group) for name, value in points])
    registration.from_entry_points.cache_clear()
    registration.registry.cache_clear()


def test_a_registered_algorithm_trains_from_its_options():
    assert "scaled_sgd" not in registry()
    assert register(ScaledSGD) is ScaledSGD  # a decorator returns the class
    assert registry()["scaled_sgd"] is ScaledSGD
    assert algorithm_options()["lr_scale"].users == ("scaled_sgd",)
    config = build_config(None, {"algorithm": "scaled_sgd", "lr_scale": "0.25"})
    assert config.algorithm.lr_scale == 0.25
    with pytest.raises(HpcoptError, match="lr_scale applies only to --algorithm scaled_sgd, not prsgd"):
        build_config(None, {"lr_scale": "0.25"})
    # a config it wrote reads back (the stored [algorithm] table lists every algorithm's options)
    assert config_from_toml(to_toml(config), Path("run.h5")) == config


def test_help_lists_a_registered_algorithm_and_its_options():
    register(ScaledSGD)
    train = make_parser()._subparsers._group_actions[0].choices["train"]
    helps = {a.dest: " ".join(a.help.split()) for a in train._actions if a.help}
    assert helps["algorithm"].split(" [")[0].endswith("| scaled_sgd")
    assert "[algorithm: scaled_sgd; default: 0.5]" in helps["lr_scale"]


def test_registering_again_replaces_only_the_same_class():
    register(ScaledSGD)
    register(ScaledSGD)
    redefined = type("ScaledSGD", (ScaledSGD,), {"name": "scaled_sgd", "__module__": ScaledSGD.__module__,
                                                 "__qualname__": ScaledSGD.__qualname__})
    register(dataclass(frozen=True, kw_only=True)(redefined))  # a notebook cell run again
    other = dataclass(frozen=True, kw_only=True)(type("Other", (ScaledSGD,), {"name": "scaled_sgd"}))
    with pytest.raises(HpcoptError, match=r"'scaled_sgd' is already registered as .*ScaledSGD; choose"):
        register(other)


@pytest.mark.parametrize("name", ["prsgd", "diloco", "pprs"])
def test_a_built_in_name_is_refused(name):
    clash = dataclass(frozen=True, kw_only=True)(type("Mine", (LocalSGD,), {"name": name}))
    with pytest.raises(HpcoptError, match=f"'{name}' is a built-in algorithm .*choose another name"):
        register(clash)
    assert registry()[name] is not clash


def test_an_option_of_another_type_than_a_built_ins_is_refused():
    @dataclass(frozen=True, kw_only=True)
    class Textual(LocalSGD):
        name: ClassVar[str] = "textual"
        gamma: str = option("x", "a gamma that is text")

    with pytest.raises(HpcoptError, match="option 'gamma' is declared as float by .* and as str by"):
        register(Textual)
    assert "textual" not in registry()


@pytest.mark.parametrize("value, message", [
    (dataclass(frozen=True, kw_only=True)(type("Nameless", (LocalSGD,), {})), "not an algorithm class"),
    (dataclass(type("NotText", (), {"name": 3})), "not an algorithm class"),
    (dataclass(frozen=True, kw_only=True)(type("Spaced", (LocalSGD,), {"name": "my alg"})),
     "not an identifier"),
    (dataclass(type("NoParallelism", (), {"name": "np_alg"})), "parallelism must be"),
])
def test_what_is_not_an_algorithm_class_is_refused(value, message):
    with pytest.raises(HpcoptError, match=message):
        register(value)


def test_an_entry_point_is_registered_under_its_name(monkeypatch):
    fake_entry_points(monkeypatch, ("scaled_sgd", f"{__name__}:ScaledSGD"))
    assert registry()["scaled_sgd"] is ScaledSGD
    assert list(registry())[-1] == "scaled_sgd"  # after the built-ins
    clash = dataclass(frozen=True, kw_only=True)(type("Mine", (LocalSGD,), {"name": "scaled_sgd"}))
    with pytest.raises(HpcoptError, match="already the algorithm of an entry point"):
        register(clash)


@pytest.mark.parametrize("points, message", [
    ([("gone", "no_such_module_for_hpcopt:Algorithm")],
     f"entry point gone = 'no_such_module_for_hpcopt:Algorithm' \\(group '{ENTRY_POINT_GROUP}'\\) could "
     "not be loaded: ModuleNotFoundError: No module named 'no_such_module_for_hpcopt' \\(fix that"),
    ([("missing", f"{__name__}:NoSuchClass")], "could not be loaded: AttributeError"),
    ([("other_name", f"{__name__}:ScaledSGD")],
     "names ScaledSGD, whose name is 'scaled_sgd': the entry point's name must be the algorithm's"),
    ([("option", f"{__name__}:option")], "is not an algorithm class"),
    ([("prsgd", "hpcopt.algorithms.local_sgd:LocalSGD")], "'prsgd' is a built-in algorithm; rename yours"),
])
def test_an_entry_point_that_cannot_be_used_is_one_error_naming_it(monkeypatch, points, message):
    fake_entry_points(monkeypatch, *points)
    with pytest.raises(HpcoptError, match=message) as error:
        registry()
    assert error.value.__context__ is None or error.value.__suppress_context__  # no chained traceback


def test_a_checkpoint_of_an_algorithm_not_registered_here_says_how_to_register_it():
    register(ScaledSGD)
    stored = to_toml(build_config(None, {"algorithm": "scaled_sgd", "lr_scale": "0.25"}))
    registration._by_call.clear()
    registration.registry.cache_clear()
    with pytest.raises(HpcoptError, match=f"^run.h5 was written by algorithm 'scaled_sgd', which this "
                                          f"installation of hpcopt does not have \\(it has prsgd, .*\\): "
                                          f"install the package that registers it \\(an entry point of "
                                          f"the group '{ENTRY_POINT_GROUP}'\\), or from Python call "
                                          "hpcopt.algorithms.register\\(cls\\) before reading it$"):
        config_from_toml(stored, Path("run.h5"))


def test_files_of_a_plugins_algorithm_that_is_not_installed_say_so(monkeypatch, tmp_path):
    """A run of an entry point's algorithm, read where that package is not installed: its trace
    and checkpoint say which algorithm wrote them and what to install, and ``hpcopt resume`` (a
    process that has no such entry point) ends with that line, exit 2."""
    from hpcopt.io.data_parallel_checkpoint import stored_config
    from hpcopt.io.trace import read_trace
    from tests.command_line import ROOT, assert_one_line_error
    from tests.runs import fresh_train

    fake_entry_points(monkeypatch, ("scaled_sgd", f"{__name__}:ScaledSGD"))
    out = tmp_path / "run"
    fresh_train(build_config(None, {"algorithm": "scaled_sgd", "dataset": "digits", "hidden": "16",
                                    "steps": "4", "progress": "false", "out": str(out)}))
    fake_entry_points(monkeypatch)  # the package is gone
    said = "was written by algorithm 'scaled_sgd', which this installation of hpcopt does not have"
    with pytest.raises(HpcoptError, match=f"^{out / 'trace.h5'} {said}"):
        read_trace(out / "trace.h5")
    with pytest.raises(HpcoptError, match=f" {said} .*install the package that registers it"):
        stored_config(out)
    resumed = subprocess.run([sys.executable, "-m", "hpcopt", "resume", str(out)], capture_output=True,
                             text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             timeout=scaled(120))
    assert_one_line_error(resumed, said, f"the group '{ENTRY_POINT_GROUP}'")


USER_MODULE = """
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from hpcopt.algorithms import LocalSGD, register


@register
@dataclass(frozen=True, kw_only=True)
class FromModule(LocalSGD):
    name: ClassVar[str] = "from_module"
"""

CHILD = """
from hpcopt.algorithms import registry
from hpcopt.config import build_config
from hpcopt.errors import HpcoptError

print(list(registry())[-1])
try:
    build_config(None, {"algorithm": "in_script"})
except HpcoptError as exc:
    print(exc)
"""


def test_a_process_hpcopt_starts_imports_the_modules_of_algorithms_registered_by_call(tmp_path,
                                                                                      monkeypatch):
    from hpcopt.child import child_environment
    from hpcopt.comm.mpi_support import singleton_environment

    assert registration.child_variables() == {}
    (tmp_path / "user_algorithms.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_algorithms", raising=False)
    importlib.import_module("user_algorithms")
    register(dataclass(frozen=True, kw_only=True)(
        type("InScript", (LocalSGD,), {"name": "in_script", "__module__": "__main__"})))
    env = child_environment(singleton_environment(), registration.child_variables())  # as hpcopt's callers
    assert env[registration.MODULES_VARIABLE] == "user_algorithms,__main__:in_script"
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == str(tmp_path.resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=elsewhere, capture_output=True,
                          text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stderr
    found, refused = done.stdout.splitlines()
    assert found == "from_module"  # imported from the module, which registered it
    assert refused.startswith("algorithm 'in_script' was registered in the script itself (__main__)")
    assert "move the class into a module the script imports" in refused
