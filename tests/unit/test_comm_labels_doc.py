"""docs/formats.md's table of communication labels names every label the code passes to
``hpcopt.comm.Comm`` and no other: read from the source's syntax trees (string constants given
as a ``label``, positional string arguments of Comm's counted calls, the ``*LABEL*`` constants,
and the default labels of Comm's methods), so a new label fails here until it is documented."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Comm's calls that count under a label (hpcopt/comm/core.py), and ``agreed``.
COUNTED = {"allreduce_", "average_", "bcast_", "allreduce_scalar", "allreduce_host_", "allgather",
           "allgatherv", "iallgather", "iallreduce", "gather", "gatherv", "barrier", "agree_errors",
           "isend", "irecv_", "waitall", "group", "node_group", "node_leaders", "agreed"}
#: Labels made from the algorithm's name (f-strings in hpcopt/pipeline/executor.py), as the
#: table writes them; the evaluator's pipeline has the name "eval".
PIPELINE_SUFFIXES = (".activation", ".gradient", ".setup")


def _strings(node: ast.AST) -> list[str]:
    """The string constants of ``node``: itself, or a tuple's items."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple):
        return [s for item in node.elts for s in _strings(item)]
    return []


def labels_in_code() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "hpcopt").rglob("*.py"):
        if "bench" in path.relative_to(ROOT / "hpcopt").parts[:1]:
            continue  # the benchmarks count on their own communicators, in no run's trace
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                found.update(s for k in node.keywords if k.arg == "label" for s in _strings(k.value))
                if name in COUNTED:
                    found.update(s for arg in node.args for s in _strings(arg))
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names = [t.id for t in getattr(target, "elts", [target]) if isinstance(t, ast.Name)]
                    if any("LABEL" in n for n in names):
                        found.update(_strings(node.value))
            elif isinstance(node, ast.FunctionDef) and path.name == "core.py":
                args = node.args.args[len(node.args.args) - len(node.args.defaults):]
                found.update(s for arg, default in zip(args, node.args.defaults)
                             if arg.arg == "label" for s in _strings(default))
    return found


def documented_labels() -> set[str]:
    text = (ROOT / "docs" / "formats.md").read_text()
    table = text.split("<!-- comm-labels -->")[1].split("<!-- /comm-labels -->")[0]
    cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return {label for cell in cells for label in re.findall(r"`([^`]+)`", cell)}


def test_the_documented_labels_are_the_labels_in_the_code():
    documented = documented_labels()
    pipeline = {f"<algorithm>{suffix}" for suffix in PIPELINE_SUFFIXES}
    assert pipeline <= documented
    in_code = labels_in_code()
    assert "eval" in in_code and "group_average" in in_code and "preflight" in in_code
    assert in_code - documented == set(), "labels the code counts that formats.md does not list"
    assert documented - pipeline - in_code == set(), "labels formats.md lists that no code counts"
