"""docs/python.md as a reader uses it: every name its tables say ``hpcopt`` and the authoring
kit (``hpcopt.algorithms``) export is exported, and its example code runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import hpcopt
import hpcopt.algorithms
from tests.command_line import ROOT
from tests.timeouts import scaled

DOC = (ROOT / "docs" / "python.md").read_text()


def table_names(after: str) -> list[str]:
    """The names in the first column of the table that follows the line ``after``: each
    backticked item, its call's parentheses dropped (``option(default, help)`` -> option)."""
    lines = DOC[DOC.index(after):].splitlines()[1:]
    rows = []
    for line in lines:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    names = [re.match(r"\w+", item).group(0)
             for row in rows[2:] for item in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert names, f"no table after {after!r}"
    return names


@pytest.mark.parametrize("module, after", [
    (hpcopt, "`hpcopt` exports"),
    (hpcopt.algorithms, "The authoring kit is exported by `hpcopt.algorithms`:"),
])
def test_every_name_a_table_lists_is_exported(module, after):
    for name in table_names(after):
        assert name in module.__all__, name
        assert getattr(module, name) is not None, name


PIECES = DOC[DOC.index("## A piece of your own"):DOC.index("## Registering an algorithm")]


def example_blocks() -> list[str]:
    """The ```python blocks from "Adding an algorithm" on, but those of "A piece of your own"
    (the first one's ``my_problem`` is the reader's own)."""
    text = DOC[DOC.index("## Adding an algorithm"):].replace(PIECES, "")
    return re.findall(r"```python\n(.*?)```", text, re.S)


def quoted_blocks() -> list[str]:
    """The ```python blocks of "A piece of your own": excerpts of docs/examples/own_pieces.py."""
    return re.findall(r"```python\n(.*?)```", PIECES, re.S)


@pytest.mark.parametrize("code", example_blocks(), ids=lambda code: code.split("class ")[1].split("(")[0])
def test_the_example_code_runs(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=scaled(120))
    assert done.returncode == 0, done.stderr


def test_the_pieces_shown_are_those_the_example_script_runs():
    """The page quotes Lion and the float64 reducer from the script its bash block runs
    (tests/docs_check.py runs it; tests/mpi/test_own_pieces.py checks what it trains)."""
    script = (ROOT / "docs" / "examples" / "own_pieces.py").read_text()
    blocks = quoted_blocks()
    assert len(blocks) == 2
    for block in blocks:
        assert block in script, block.splitlines()[1]


def test_the_examples_are_the_ones_expected():
    """Two blocks: DiLoCo (built in, only defined here) and one registered and trained."""
    blocks = example_blocks()
    assert len(blocks) == 2 and "@register" in blocks[1] and "hpcopt.train(" in blocks[1]
