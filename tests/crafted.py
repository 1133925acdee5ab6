"""Crafted files for the trust tests: one function per kind of hostile or damaged checkpoint,
trace or state_dict file, each built from a real file the test made and returning its path.

A crafted file that should pass the content digest is resealed (``reseal``), as an attacker
with ``hpcopt.io.digest.seal`` would, so the refusals tested are those of the checks behind
the digest, not of the digest itself.
"""

from __future__ import annotations

from pathlib import Path

import h5py

from hpcopt.io.digest import seal


def reseal(path: Path) -> Path:
    """``path`` with its content digest recomputed over what it holds now."""
    with h5py.File(path, "r+") as f:
        seal(f)
    return path


def truncated_trace(source: Path, path: Path, keep: int = 3000) -> Path:
    """The first ``keep`` bytes of the trace ``source`` at ``path``: a run killed while it wrote
    its trace (or a trace caught while copied)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(source.read_bytes()[:keep])
    return path
