"""The package's layers, read from its source: ``hpcopt.io`` holds file formats only (host arrays
in and out: no MPI, no collective, nothing of the run, the algorithms or the commands above
it), and no file imports another that imports it back through a circle of more than two files;
none at all through ``hpcopt/io/``.

Every import counts, at the top of a module, inside a function or under ``TYPE_CHECKING``: a
circle that only a function-level import closes still ties the files together. A submodule's
import of its own package's ``__init__.py`` (which Python has loaded first anyway) is an arrow
like any other."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from hpcopt.algorithms import state as fields
from hpcopt.algorithms.pprs import PipelineState
from hpcopt.io import pipeline_checkpoint

PACKAGE = Path(__file__).resolve().parents[2] / "hpcopt"
#: What a module of hpcopt/io/ may not import: MPI, and every part of hpcopt above the formats.
FORBIDDEN_IN_IO = ("mpi4py", "hpcopt.run", "hpcopt.comm", "hpcopt.algorithms", "hpcopt.child",
                   "hpcopt.build", "hpcopt.torch", "hpcopt.study", "hpcopt.bench", "hpcopt.cli",
                   "hpcopt.report")
#: Folders that no circle may pass through, whatever its size.
NO_CIRCLE = ("io",)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported(path: Path) -> set[str]:
    """The absolute names ``path`` imports (``from .x import y``: ``pkg.x.y`` where ``y`` is a
    module of the package, else ``pkg.x``), anywhere in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules() else base)
    return found


def arrows() -> dict[str, set[str]]:
    """Module -> the modules of hpcopt it imports (a package stands for its ``__init__``)."""
    return {name: {target for target in imported(path) if target in modules() and target != name}
            for name, path in modules().items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "io").glob("*.py")), ids=lambda p: p.name)
def test_an_io_module_imports_no_mpi_and_nothing_above_the_formats(path):
    above = sorted(name for name in imported(path)
                   if any(name == f or name.startswith(f + ".") for f in FORBIDDEN_IN_IO))
    assert not above, f"{path.name} imports {', '.join(above)}"


def test_no_circle_of_more_than_two_files():
    large = [c for c in circles(arrows()) if len(c) > 2]
    assert not large, large


def test_no_circle_passes_through_io():
    through = [c for c in circles(arrows())
               if any(name.split(".")[1:2] == [folder] for name in c for folder in NO_CIRCLE)]
    assert not through, through


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_pipeline_format_names_what_its_state_declares():
    assert pipeline_checkpoint.VECTORS == fields.fields_of(PipelineState, fields.VECTOR)
    kinds = (fields.COUNTER, fields.SCALAR, fields.FLAG)
    assert pipeline_checkpoint.NUMBER_TYPES == {name: fields.NUMBER_TYPES[kind] for kind in kinds
                                                for name in fields.fields_of(PipelineState, kind)}


def test_the_trace_column_an_algorithm_writes_is_the_formats():
    """Streaming DiLoCo names its trace column itself (io imports nothing of the algorithms, nor
    they of io): the same name as the trace format's."""
    from hpcopt.algorithms.streaming import PEAK_COLUMN
    from hpcopt.io.trace import OPTIONAL_COLUMNS
    from hpcopt.io.trace import PEAK_COLUMN as FORMATS

    assert PEAK_COLUMN == FORMATS and FORMATS in OPTIONAL_COLUMNS
