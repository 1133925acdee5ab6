"""The content digest of checkpoints (hpcopt.io.digest): canonical, sensitive to every part of
the content, verified once per read, and the same for both checkpoint formats; and the vetting
of a checkpoint in a child process before a resumed job reads it (hpcopt.run.vetting)."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcopt.child import ChildResult
from hpcopt.errors import HpcoptError
from hpcopt.io import digest
from hpcopt.io.data_parallel_checkpoint import read_checkpoint, stored_config, write_checkpoint
from hpcopt.io.digest import ATTRIBUTE, BLOCK_BYTES, content_digest
from hpcopt.run.vetting import vet_checkpoint

from test_checkpoint import synthetic  # noqa: E402  (tests/unit is on the path: no package)

MISMATCH = "is a damaged checkpoint (content digest mismatch)"


def _file(path: Path, order: list[str], attributes: dict) -> str:
    """A small HDF5 file whose datasets are created in ``order``; its digest."""
    values = {"a/x": np.arange(6.0).reshape(2, 3), "b": np.array([1, 2], np.int64), "c": np.float32(3)}
    with h5py.File(path, "w") as f:
        f.attrs.update(attributes)
        for name in order:
            f.create_dataset(name, data=values[name])
        return content_digest(f)


def test_the_digest_is_canonical_and_covers_names_values_and_types(tmp_path):
    attrs = {"text": "é", "n": 3}
    reference = _file(tmp_path / "1.h5", ["a/x", "b", "c"], attrs)
    assert _file(tmp_path / "2.h5", ["c", "b", "a/x"], dict(reversed(attrs.items()))) == reference
    assert _file(tmp_path / "3.h5", ["a/x", "b", "c"], {"text": "é", "n": 4}) != reference
    assert _file(tmp_path / "4.h5", ["a/x", "b", "c"], {"text": "é", "m": 3}) != reference
    assert _file(tmp_path / "5.h5", ["a/x", "b", "c"], {"text": "é", "n": np.int32(3)}) != reference
    assert _file(tmp_path / "6.h5", ["a/x", "b"], attrs) != reference
    with h5py.File(tmp_path / "1.h5", "a") as f:
        f.attrs[ATTRIBUTE] = "anything"  # the digest itself is left out
        assert content_digest(f) == reference
        f["b"][0] = 9
        assert content_digest(f) != reference


def test_large_datasets_hash_in_blocks_as_one_stream(tmp_path, monkeypatch):
    data = np.arange(10 * 7, dtype=np.float64).reshape(10, 7)
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["v"] = data
        whole = content_digest(f)
        monkeypatch.setattr(digest, "BLOCK_BYTES", 3 * 7 * 8)  # 3 rows a block: 4 blocks
        assert content_digest(f) == whole  # the block size is not part of the format
        f["v"][9, 6] = -1.0
        assert content_digest(f) != whole
    assert BLOCK_BYTES >= 1 << 20


@pytest.fixture
def written(tmp_path) -> Path:
    path = tmp_path / "step-000000005.h5"
    write_checkpoint(path, synthetic(world_size=3))
    return path


def test_every_reader_hashes_the_file_exactly_once(written, monkeypatch):
    calls = []
    monkeypatch.setattr(digest, "content_digest", lambda f: calls.append(1) or content_digest(f))
    stored_config(written)  # parsing the flags: no hashing
    assert calls == []
    for rank in range(3):
        read_checkpoint(written, rank, 3)
    read_checkpoint(written)
    assert len(calls) == 4


@pytest.mark.parametrize("change", ["value", "row", "attribute", "group-attribute", "new-attribute"])
def test_edits_that_pass_every_other_check_are_refused(written, tmp_path, change):
    bad = tmp_path / "bad" / written.name
    bad.parent.mkdir()
    shutil.copy(written, bad)
    with h5py.File(bad, "a") as f:
        if change == "value":
            f["model/flat"][0] += 0.5
        elif change == "row":
            f["ranks/momentum"][2, 1] = 0.25
        elif change == "attribute":
            f.attrs["wall_seconds"] = 2.5
        elif change == "group-attribute":
            f["comm"].attrs["counters"] = '[["allreduce", "average", 2, 48, 0.01]]'
        else:
            f["ranks"].attrs["note"] = "x"
    with pytest.raises(HpcoptError, match="content digest mismatch") as error:
        read_checkpoint(bad, 0, 3)
    assert str(bad) in str(error.value) and MISMATCH in str(error.value)
    with pytest.raises(HpcoptError, match="content digest mismatch"):
        read_checkpoint(bad)


def test_a_damaged_config_is_reported_as_damage_when_merging_flags(written):
    with h5py.File(written, "a") as f:
        f.attrs["config"] = "[[["
    with pytest.raises(HpcoptError, match="content digest mismatch"):
        stored_config(written)


def pipeline_checkpoint(directory: Path) -> tuple[Path, np.ndarray]:
    """A small pipeline checkpoint of 2 stages (no training needed); (its path, the model)."""
    from hpcopt.config import build_config
    from hpcopt.flat import ParamLayout
    from hpcopt.io import pipeline_checkpoint as pipe
    from hpcopt.io import versions

    model = np.linspace(0, 1, 6)
    ckpt = pipe.PipelineCheckpoint(
        build_config(None, {"dtype": "float64"}), 2, 7, "abc", 1, 0.5, model,
        [pipe.StageRecord((0, 4), {"x": model[:4].copy()}, {"step": 7, "alpha": 0.1}),
         pipe.StageRecord((4, 6), {"x": model[4:].copy()}, {"step": 7, "alpha": 0.1})],
        np.zeros((2, len(pipe.WINDOW_COLUMNS))))
    path = directory / "step-000000007.h5"
    pipe.write(path, ckpt, ParamLayout.of(w=(4,), b=(2,)), [], versions())
    return path, model


def test_the_pipeline_format_is_sealed_and_verified_the_same_way(tmp_path):
    from hpcopt.io import pipeline_checkpoint as pipe

    path, model = pipeline_checkpoint(tmp_path)
    assert pipe.read(path, 2).stages[1].vectors["x"].tolist() == model[4:].tolist()
    with h5py.File(path, "a") as f:
        f["stages/1"].attrs["alpha"] = 0.2  # not covered by Fletcher-32
    with pytest.raises(HpcoptError, match=f"{path} {MISMATCH.replace('(', '.').replace(')', '.')}"):
        pipe.read(path, 2)


# -- vetting in a child process (hpcopt.run.vetting) --------------------------------------------

def test_a_child_reads_either_kind_whole_and_each_file_once(written, tmp_path, monkeypatch):
    from hpcopt import child

    started = []
    real = child.run_module
    monkeypatch.setattr(child, "run_module", lambda *a: started.append(a[1]) or real(*a))
    pipeline, _ = pipeline_checkpoint(tmp_path)
    assert vet_checkpoint(written) == written
    assert vet_checkpoint(str(written)) == written
    assert vet_checkpoint(pipeline) == pipeline
    assert started == [[str(written)], [str(pipeline)]]  # the second look at `written` is free
    with h5py.File(pipeline, "a") as f:  # a changed file (size, time) is vetted again
        f["stages/0"].attrs["alpha"] = 0.3
    with pytest.raises(HpcoptError, match=f"^{pipeline} .*content digest mismatch"):
        vet_checkpoint(pipeline)
    assert len(started) == 3


@pytest.mark.parametrize("damage", ["digest", "version", "not-hdf5"])
def test_the_childs_refusal_is_the_readers_message(written, damage):
    if damage == "not-hdf5":
        written.write_bytes(b"plain text, not a checkpoint")
    else:
        with h5py.File(written, "a") as f:
            if damage == "digest":
                f["model/flat"][0] += 1
            else:
                f.attrs["format_version"] = 1
                del f.attrs[ATTRIBUTE]
    expected = {"digest": "content digest mismatch", "version": "format version 1; this hpcopt reads",
                "not-hdf5": "is not an HDF5 file"}[damage]
    with pytest.raises(HpcoptError, match=expected) as error:
        vet_checkpoint(written)
    assert str(written) in str(error.value) and "hpcopt: error" not in str(error.value)


@pytest.mark.parametrize("ended,message", [
    (ChildResult(-11, "SIGSEGV", ""),
     "is a damaged checkpoint: the process that checked it crashed reading it (SIGSEGV)"),
    (ChildResult(-10, "SIGUSR1", ""),  # a stop signal to the job: not known to be damaged
     "could not be checked: the process that read it was stopped (SIGUSR1)"),
    (ChildResult(None, None, "did not finish within 60 s"),  # not known to be damaged
     "could not be checked: the process that read it did not finish within 60 s (is the node "
     "overloaded? a damaged file can also hang a reader)"),
])
def test_a_crash_or_hang_while_reading_becomes_one_line(written, monkeypatch, ended, message):
    from hpcopt import child

    monkeypatch.setattr(child, "run_module", lambda *a: ended)
    with pytest.raises(HpcoptError) as error:
        vet_checkpoint(written)
    assert str(error.value) == f"{written} {message}"
