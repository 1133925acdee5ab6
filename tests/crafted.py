"""Crafted files for the trust tests: one function per kind of hostile or damaged checkpoint,
trace or state_dict file, each built from a real file the test made and returning its path.

A crafted file that should pass the content digest is resealed (``reseal``), as an attacker
with ``hpcopt.io.digest.seal`` would, so the refusals tested are those of the checks behind
the digest, not of the digest itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py

from hpcopt.io.digest import seal


def reseal(path: Path) -> Path:
    """``path`` with its content digest recomputed over what it holds now."""
    with h5py.File(path, "r+") as f:
        seal(f)
    return path


def _with_stored_config(source: Path, dest: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of checkpoint ``source`` at ``dest`` whose stored config ``edit`` changed, resealed."""
    import shutil

    from hpcopt.config import config_from_stored, to_toml, tomllib

    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    with h5py.File(dest, "r+") as f:
        values = tomllib.loads(f.attrs["config"])
        edit(values)
        f.attrs["config"] = to_toml(config_from_stored(values))
    return reseal(dest)


def checkpoint_naming_a_module(source: Path, dest: Path, spec: str) -> Path:
    """A copy of a built-in model's checkpoint whose stored ``model`` is ``spec``
    (``torch:MODULE:FUNCTION``, the MLP's ``hidden`` dropped), resealed: resuming it must not
    import MODULE."""

    def edit(values: dict[str, Any]) -> None:
        values["model"]["model"] = spec
        values["model"].pop("hidden", None)

    return _with_stored_config(source, dest, edit)


def checkpoint_with_foreign_out(source: Path, dest: Path, victim: Path) -> Path:
    """A copy of a checkpoint whose stored ``[run] out`` is another run's directory ``victim``,
    with ``trace = false`` and ``keep_checkpoints = 1`` (so a run in it would prune all but
    one of the victim's checkpoints), resealed."""

    def edit(values: dict[str, Any]) -> None:
        values["run"].update(out=str(victim), trace=False, keep_checkpoints=1)

    return _with_stored_config(source, dest, edit)


def lock_file(directory: Path, host: str, pid: int, age_seconds: float = 0.0, **fields: Any) -> Path:
    """``directory``'s lock file naming the holder ``host``, ``pid`` (other fields as given, or
    plausible), last refreshed ``age_seconds`` ago."""
    import json
    import os
    import time

    from hpcopt.run.lock import FILE_NAME

    path = directory / FILE_NAME
    record = {"host": host, "pid": pid, "started": "", "boot": "", "run_id": "0" * 32,
              "since": "2026-01-01T00:00:00", "token": "1" * 32, **fields}
    path.write_text(json.dumps(record))
    when = time.time() - age_seconds
    os.utime(path, (when, when))
    return path
