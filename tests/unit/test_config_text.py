"""Text in a config survives being stored (TOML in every checkpoint and trace), or is refused
before the run starts: a newline in --out once made every file of a run unreadable."""

from __future__ import annotations

import typing

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hpcopt.config import (
    SECTIONS,
    Config,
    RunConfig,
    _toml_value,
    build_config,
    config_from_stored,
    option_index,
    to_toml,
    tomllib,
)
from hpcopt.errors import HpcoptError

SETTINGS = settings(max_examples=200, deadline=None, database=None, derandomize=True)
#: Every option whose value is text.
TEXT_KEYS = sorted(name for name, (section, f) in option_index().items()
                   if typing.get_type_hints(SECTIONS[section])[name] is str)


@SETTINGS
@given(text=st.text())
def test_every_string_is_written_as_toml_that_reads_back_the_same(text):
    assert tomllib.loads(f"value = {_toml_value(text)}\n")["value"] == text


@SETTINGS
@given(key=st.sampled_from(TEXT_KEYS), text=st.text(max_size=30))
def test_any_text_option_round_trips_through_the_stored_config_or_is_refused(key, text):
    try:
        config = build_config(None, {key: text})
    except HpcoptError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert config_from_stored(tomllib.loads(to_toml(config))) == config


@SETTINGS
@given(key=st.sampled_from(TEXT_KEYS), before=st.text(max_size=8), after=st.text(max_size=8),
       bad=st.characters(categories=["Cc", "Cs", "Zl", "Zp"]))
@example(key="out", before="runs/a", after="b", bad="\u2028")  # a line separator, not a control
@example(key="out", before="runs/a", after="b", bad="\u2029")
def test_control_characters_separators_and_bad_bytes_are_refused_in_one_line(key, before, after, bad):
    try:
        build_config(None, {key: before + bad + after})
    except HpcoptError as exc:
        assert "\n" not in str(exc)
    else:
        raise AssertionError(f"{key} = {before + bad + after!r} was accepted")


def test_the_python_api_refuses_them_too():
    for out in ("runs/a\nb", "runs/\udcff"):  # a newline; a byte that is not UTF-8, from argv
        try:
            Config(run=RunConfig(out=out))
        except HpcoptError as exc:
            assert "out must be text without control characters" in str(exc)
        else:
            raise AssertionError(f"out {out!r} was accepted")


def test_an_out_with_a_newline_is_refused_before_anything_is_written(tmp_path, capsys):
    from hpcopt.cli import main

    code = main(["train", "--dataset", "digits", "--hidden", "8", "--steps", "4",
                 "--out", str(tmp_path / "run\nname")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "out must be text without control characters" in lines[0]
    assert list(tmp_path.iterdir()) == []


#: What a text option's value, as a crafted checkpoint stores it, can reach: the audit behind
#: "nothing a file names is imported, and a run writes only in its own directory". The rest are
#: names from a fixed table: refused by the config unless listed in CHECKED_WHERE_USED.
REACHES = {
    "model": "torch:MODULE:FUNCTION is imported only when the user names it (require_named_model)",
    "out": "never taken from a file: the run directory is --out or the checkpoint's own",
    "path": "a data set's directory: only that data set's own file names in it are read, as numbers",
    "network": "a profile name or alpha=...,bandwidth=... numbers (hpcopt.comm.costmodel)",
}
CHECKED_WHERE_USED = {"dataset": "load_dataset", "partition": "partition_indices", "activation": "mlp"}


def test_every_text_option_is_a_name_from_a_fixed_table_or_has_its_rule():
    assert set(TEXT_KEYS) >= set(REACHES) | set(CHECKED_WHERE_USED)
    for key in sorted(set(TEXT_KEYS) - set(REACHES) - set(CHECKED_WHERE_USED)):
        try:
            build_config(None, {key: "torch:os:system"})
        except HpcoptError:
            continue
        raise AssertionError(f"the text option {key} takes any value: add its rule to REACHES")
