"""benchmarks/common/sections.py: a benchmark rewrites its own section of a results page and
nothing else."""

import importlib.util

from tests.command_line import ROOT

_spec = importlib.util.spec_from_file_location("sections", ROOT / "benchmarks" / "common" / "sections.py")
sections = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sections)


def test_sections_are_appended_then_replaced_in_place(tmp_path):
    page = tmp_path / "results" / "page.md"
    sections.replace_section(page, "a", "table A1")
    assert page.read_text() == "<!-- a:begin -->\ntable A1\n<!-- a:end -->\n"
    page.write_text(page.read_text() + "\nreading of A, by hand\n")
    sections.replace_section(page, "b", "table B1\n\n")
    sections.replace_section(page, "a", "table A2")
    text = page.read_text()
    assert text == ("<!-- a:begin -->\ntable A2\n<!-- a:end -->\n\nreading of A, by hand\n\n"
                    "<!-- b:begin -->\ntable B1\n<!-- b:end -->\n")
