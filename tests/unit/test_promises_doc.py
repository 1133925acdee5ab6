"""docs/failures.md's promises name the tests that hold them: every test file it links exists
and defines every test named after the link."""

from __future__ import annotations

import re
from pathlib import Path

from tests.command_line import ROOT

PAGE = ROOT / "docs" / "failures.md"


def promised_tests() -> dict[Path, set[str]]:
    """Test file -> the test names given after its link in the promises section."""
    text = PAGE.read_text().split("## The promises", 1)[1].split("\n## ", 1)[0]
    found: dict[Path, set[str]] = {}
    current: Path | None = None
    for token in re.finditer(r"\]\(\.\./(tests/[\w/]+\.py)\)|`(test_\w+)`", text):
        if token.group(1):
            current = ROOT / token.group(1)
            found.setdefault(current, set())
        elif current is not None:
            found[current].add(token.group(2))
    return found


def test_every_promise_names_a_test_that_exists():
    promised = promised_tests()
    assert sum(len(names) for names in promised.values()) >= 25
    for path, names in promised.items():
        assert path.is_file(), path
        defined = set(re.findall(r"^def (test_\w+)", path.read_text(), re.M))
        assert names and names <= defined, (path.name, sorted(names - defined))
