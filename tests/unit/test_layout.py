"""The package layout the algorithms compose on: the data-parallel session names no algorithm,
``Workload`` has its own module (no build -> torch -> build cycle), and ``hpcopt.algorithms``
exports the authoring kit."""

from __future__ import annotations

import ast
from pathlib import Path

import hpcopt
from hpcopt.config import build_config

PACKAGE = Path(hpcopt.__file__).parent
ALGORITHM_MODULES = {p.stem for p in (PACKAGE / "algorithms").glob("*.py")} - {"__init__", "base", "state"}


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports (relative imports resolved against the hpcopt package)."""
    package = ("hpcopt", *path.relative_to(PACKAGE).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, node.module or ""))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_the_data_parallel_session_names_no_algorithm():
    """No import of an algorithm's module or of the evaluation classes, no getattr of state:
    the algorithm reports its own trace columns and summary (celgc its clipped line, prsgd none)."""
    session = PACKAGE / "run" / "data_parallel.py"
    imported = _imports(session)
    named = {m for m in imported for name in ALGORITHM_MODULES - {"data_parallel", "buffers"}
             if m.startswith(f"hpcopt.algorithms.{name}")}
    assert not named, named
    assert not {m for m in imported if m.startswith("hpcopt.problems")}
    calls = [n for n in ast.walk(ast.parse(session.read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "getattr"]
    assert not calls
    base = {"dataset": "digits", "hidden": "8", "steps": "4", "interval": "2"}
    clipped, _ = hpcopt.train(build_config(None, {**base, "algorithm": "celgc", "gamma": "0.01"}),
                              verbose=False)
    line = f"clipped           {100 * clipped.clip_fraction:.1f}% of the steps (all ranks)"
    assert clipped.reported == [line]
    assert clipped.reported[0] in clipped.lines()
    plain, _ = hpcopt.train(build_config(None, base), verbose=False)
    assert plain.reported == [] and plain.clip_fraction is None


def test_workload_has_its_own_module_and_torch_does_not_import_build():
    assert hpcopt.Workload.__module__ == "hpcopt.workload"
    assert "hpcopt.build" not in _imports(PACKAGE / "workload.py")
    for path in (PACKAGE / "torch").glob("*.py"):
        assert "hpcopt.build" not in _imports(path), path


def test_the_authoring_kit_is_exported_from_hpcopt_algorithms():
    import dataclasses

    from hpcopt.algorithms import (
        DATA_PARALLEL,
        DataParallelState,
        LocalSGD,
        context,
        counter,
        flag,
        model,
        option,
        registry,
        scalar,
        scratch,
        shared,
        vector,
    )
    from hpcopt.algorithms.state import KIND, fields_of

    @dataclasses.dataclass
    class Kinds:
        x: object = model()
        v: object = vector("average")
        s: object = shared()
        n: int = counter("same")
        f: float = scalar("reset")
        b: bool = flag("refuse")
        w: object = scratch()

    assert [f.metadata[KIND] for f in dataclasses.fields(Kinds)] == [
        "model", "vector", "shared", "counter", "scalar", "flag", "scratch"]
    assert option(1, "help").metadata and context(0).metadata
    assert fields_of(DataParallelState, "model") == ("x",)
    assert issubclass(registry()["diloco"], LocalSGD) and LocalSGD.parallelism == DATA_PARALLEL
