"""Property-based tests of the two readers of user input: random mutations of a valid config
or of a valid checkpoint give the documented error (HpcoptError: one line, exit 2) or a valid
result, and never any other exception; a checkpoint damaged on disk never loads with values
that differ from the ones written (the content digest)."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcopt.config import Config, build_config, option_index
from hpcopt.errors import HpcoptError
from hpcopt.io.data_parallel_checkpoint import Checkpoint, read_checkpoint
from hpcopt.io.digest import seal
from tests.checkpoints import differences, small_checkpoint

#: Derandomized: the same examples on every run, so CI cannot fail by chance (HDF5 itself has
#: been seen to crash on one damaged attribute in thousands of random edits; see
#: benchmarks/faults/checkpoint_fuzz.py for the open-ended search).
SETTINGS = settings(max_examples=80, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

#: A valid config as TOML tables (tuples as lists, as tomllib gives them).
VALID = {section: {key: list(value) if isinstance(value, tuple) else value
                   for key, value in table.items()}
         for section, table in build_config().to_dict().items()}

SCALARS = st.one_of(st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12))
TOML_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=5), inner, max_size=2), max_leaves=6)
KEYS = sorted(option_index())


def _tables() -> dict:
    return {section: dict(table) for section, table in VALID.items()}


@SETTINGS
@given(key=st.sampled_from(KEYS), value=TOML_VALUES)
def test_any_value_for_a_key_gives_a_config_or_a_user_error(key, value):
    tables = _tables()
    tables[option_index()[key][0]][key] = value
    try:
        config = build_config(tables)
    except HpcoptError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert isinstance(config, Config)


@SETTINGS
@given(key=st.sampled_from(KEYS), text=st.text(max_size=20))
def test_any_flag_text_gives_a_config_or_a_user_error(key, text):
    try:
        config = build_config(None, {key: text})
    except HpcoptError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert isinstance(config, Config)


@SETTINGS
@given(section=st.sampled_from(sorted(VALID)), name=st.text(min_size=1, max_size=12), value=TOML_VALUES,
       where=st.sampled_from(["key", "section", "table"]))
def test_unknown_keys_and_sections_are_always_user_errors(section, name, value, where):
    tables = _tables()
    if where == "key":
        if name in option_index():
            return
        tables[section][name] = value
        fragment = f"unknown key {name!r} in [{section}]"
    elif where == "section":
        if name in VALID:
            return
        tables[name] = {"x": value}
        fragment = f"unknown config section [{name}]"
    else:
        if isinstance(value, dict):
            return
        tables[section] = value
        fragment = f"config section [{section}] must be a table"
    with pytest.raises(HpcoptError, match="^" + __import__("re").escape(fragment)):
        build_config(tables)


# -- the checkpoint loader ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A real 1-rank checkpoint taken mid-round, with momentum: every kind of dataset."""
    return small_checkpoint(tmp_path_factory.mktemp("property") / "run")


def _load_or_user_error(path: Path) -> Checkpoint | None:
    try:
        loaded = read_checkpoint(path)
    except HpcoptError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return None
    assert np.isfinite(loaded.model).all()
    return loaded


@SETTINGS
@given(edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                      min_size=1, max_size=8),
       keep=st.one_of(st.none(), st.floats(0, 1)))
def test_damaged_bytes_give_a_user_error_or_the_same_checkpoint(checkpoint, edits, keep):
    data = bytearray(checkpoint.read_bytes())
    for where, byte in edits:
        data[int(where * len(data))] = byte
    if keep is not None:
        data = data[: int(keep * len(data))]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / checkpoint.name
        path.write_bytes(bytes(data))
        loaded = _load_or_user_error(path)
        assert loaded is None or not differences(loaded, read_checkpoint(checkpoint)), "damage loaded silently"


def _objects(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(every dataset and group, every (object, attribute)) of an HDF5 file."""
    names: list[str] = []
    with h5py.File(path, "r") as f:
        f.visit(names.append)
        attributes = [("/", a) for a in f.attrs] + [(n, a) for n in names for a in f[n].attrs]
    return names, attributes


ARRAYS = st.one_of(
    st.builds(np.array, st.lists(st.floats(allow_nan=True), max_size=6)),
    st.builds(lambda v: np.array(v, dtype=np.int64), st.lists(st.integers(-2**40, 2**40), max_size=6)),
    st.builds(lambda v: np.array(v, dtype=np.float32).reshape(-1, 1), st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=6)),
    st.builds(lambda s: np.array([s.encode()]), st.text(max_size=8)))
ATTRIBUTE_VALUES = st.one_of(st.integers(-2**40, 2**40), st.floats(allow_nan=True), st.text(max_size=30),
                             st.booleans(), ARRAYS)


@settings(SETTINGS, max_examples=50)
@given(data=st.data(), action=st.sampled_from(["delete", "dataset", "attribute", "drop-attribute"]),
       sealed=st.booleans())
def test_edited_objects_give_a_user_error_or_a_valid_checkpoint(checkpoint, data, action, sealed):
    """``sealed``: the edited file carries the digest of its new contents, as if a faulty writer
    had made it, so the checks after the digest see the edit; unsealed, the digest refuses it."""
    names, attributes = _objects(checkpoint)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / checkpoint.name
        path.write_bytes(checkpoint.read_bytes())
        with h5py.File(path, "a") as f:
            if action in ("delete", "dataset"):
                name = data.draw(st.sampled_from(names))
                if name in f:  # a parent may be gone already
                    del f[name]
                if action == "dataset":
                    f[name] = data.draw(ARRAYS)
            else:
                owner, key = data.draw(st.sampled_from(attributes))
                if action == "drop-attribute":
                    del f[owner].attrs[key]
                else:
                    f[owner].attrs[key] = data.draw(ATTRIBUTE_VALUES)
            if sealed:
                seal(f)
        loaded = _load_or_user_error(path)
        if loaded is not None:
            assert math.isfinite(loaded.wall_seconds)
            assert sealed or not differences(loaded, read_checkpoint(checkpoint)), "an edit loaded silently"
