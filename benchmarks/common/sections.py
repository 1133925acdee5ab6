"""Write one generated section of a results page, leaving the rest of the page as it is.

A section is the text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``; a page without
those markers gets the section appended. Benchmarks that share a page (the MLP and ResNet
PR-SGD reproductions in ``docs/results/prsgd.md``) each rewrite only their own section, and the
hand-written reading around them survives a rerun.
"""

from __future__ import annotations

import statistics
from pathlib import Path


def replace_section(path: Path, name: str, text: str) -> None:
    """Put ``text`` between the markers of section ``name`` in ``path`` (created if missing)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{text.rstrip()}\n{end}"
    page = path.read_text() if path.exists() else ""
    if begin in page and end in page:
        head, rest = page.split(begin, 1)
        page = head + block + rest.split(end, 1)[1]
    else:
        page = (page.rstrip() + "\n\n" if page.strip() else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)


def mean_sd(values: list[float], digits: int = 4) -> str:
    """``mean ± sd`` of a table cell (sd 0 for one value)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"
