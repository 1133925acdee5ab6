"""Untrusted checkpoints, traces and state_dicts (hpcopt.io.structure): nothing in them is
followed out of the file, no virtual, externally stored or oddly filtered dataset is read, and
declared data beyond what the file holds is refused before it is allocated; and writes that
fail (a full disk, hpcopt.io.safe_files) end in one error line with the previous file intact."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_checkpoint import synthetic  # noqa: E402  (tests/unit is on the path: no package)
from test_checkpoint_digest import pipeline_checkpoint  # noqa: E402

from hpcopt.config import build_config, to_toml
from hpcopt.errors import HpcoptError
from hpcopt.io.data_parallel_checkpoint import read_checkpoint, stored_config, write_checkpoint
from hpcopt.io.trace import COLUMNS, TraceWriter, read_trace
from hpcopt.run.vetting import vet_traces
from tests import crafted
from tests.memory import peak_allocation

MB = 1 << 20


#: Opens and closes ``argv[1]`` for writing every 0.1 s, starting ``argv[2]`` seconds from now.
RELEASER = """
import os, sys, time
time.sleep(float(sys.argv[2]))
while True:
    try:
        os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader waiting
        pass
    time.sleep(0.1)
"""


@contextmanager
def unblocked(fifo: Path, seconds: float = 20.0) -> Iterator[None]:
    """A reader that follows a link into ``fifo`` blocks in open() (holding the GIL: h5py does
    not release it); after ``seconds`` another process opens and closes the FIFO for writing,
    again and again (HDF5 tries more than one open), so such a reader fails the test instead
    of hanging it."""
    releaser = subprocess.Popen([sys.executable, "-c", RELEASER, str(fifo), str(seconds)])
    try:
        yield
    finally:
        releaser.kill()
        releaser.wait()


def refusal(call: Callable[[], Any]) -> str:
    """The HpcoptError message ``call`` raises (the test fails if it raises none)."""
    with pytest.raises(HpcoptError) as error:
        call()
    return str(error.value)


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    path = tmp_path / "step-000000005.h5"
    write_checkpoint(path, synthetic(world_size=2))
    return path


#: kind -> (crafting it from a checkpoint (path, scratch folder), the refusal's words)
CHECKPOINT_KINDS = {
    "soft-link": (lambda p, d: crafted.soft_link(p, "model/flat"), "/model/flat is a soft link"),
    "external-link": (lambda p, d: crafted.external_link(p, "model/flat", d / "other.h5"),
                      "/model/flat is an external link"),
    "fifo-link": (lambda p, d: crafted.fifo_link(p, "model/flat"), "/model/flat is an external link"),
    "virtual-dataset": (lambda p, d: crafted.virtual_dataset(p, "model/flat"),
                        "/model/flat is a virtual dataset"),
    "external-storage": (lambda p, d: crafted.external_storage(p, "model/flat"),
                         "/model/flat keeps its data in an external file"),
    "gzip-filter": (lambda p, d: crafted.gzip_filter(p, "model/flat"),
                    "/model/flat uses the filter deflate (id 1)"),
    "linked-twice": (lambda p, d: crafted.linked_twice(p, "ranks/momentum", "ranks/momentum2"),
                     "/ranks/momentum2 links to an object already linked elsewhere"),
    "huge-model": (lambda p, d: crafted.huge_model(p, 1 << 23),
                   "its datasets declare 134.22 MB of data but the file holds"),
}


@pytest.mark.parametrize("kind", sorted(CHECKPOINT_KINDS))
def test_every_reader_refuses_what_a_checkpoint_must_not_hold(checkpoint, tmp_path, kind):
    """Ranks read with verify=False (rank 0's child has vetted the file): the structure is
    checked whoever opens it, before any object is opened through a link."""
    make, words = CHECKPOINT_KINDS[kind]
    bad = make(checkpoint, tmp_path)
    with unblocked(bad.with_name(bad.name + ".fifo")):
        for read in (lambda: read_checkpoint(bad, 0, 2, verify=False), lambda: read_checkpoint(bad),
                     lambda: stored_config(bad)):
            message = refusal(read)
            assert message.startswith(f"{bad}: ") and words in message, message


@pytest.mark.parametrize("kind", ["checkpoint", "trace",
                                  pytest.param("state_dict", marks=pytest.mark.extra)])
def test_declared_data_beyond_the_file_is_refused_before_it_is_allocated(tmp_path, kind):
    """A few header bytes declaring tens of MB cost no memory: the refusal comes first."""
    if kind == "checkpoint":
        path = tmp_path / "step-000000005.h5"
        write_checkpoint(path, synthetic(world_size=2))
        bad = crafted.huge_model(path, 1 << 23)

        def read() -> Any:
            return read_checkpoint(bad, 0, 2, verify=False)
    elif kind == "trace":
        bad = crafted.huge_trace(small_trace(tmp_path / "trace.h5"), 1 << 20)

        def read() -> Any:
            return read_trace(bad)
    else:
        torch = pytest.importorskip("torch")
        from hpcopt.torch import load_state_dict, save_state_dict

        path = save_state_dict({"weight": torch.ones(3)}, tmp_path / "model.h5")
        bad = crafted.unwritten(path, "weight", (1 << 23,))

        def read() -> Any:
            return load_state_dict(bad)
    message, peak = peak_allocation(lambda: refusal(read))
    assert "of data but the file holds" in message and str(bad) in message, message
    assert peak < 2 * MB, peak


# -- traces --------------------------------------------------------------------------------------

ATTRS = {"config": to_toml(build_config()), "run_id": "r"}


def small_trace(path: Path, rows: int = 10) -> Path:
    """A trace of ``rows`` rows with two communication labels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = TraceWriter(path, ATTRS)
    for i in range(rows):
        writer.append({name: i for name in COLUMNS}, {"average": (i, 8 * i, 0.5), "trace": (i, 1, 0.1)})
    writer.close()
    return path


def resume(path: Path, rows: int = 5) -> TraceWriter:
    return TraceWriter(path, ATTRS, resume_at=(rows, rows))


def test_a_resumed_trace_never_writes_through_a_link_into_another_run(tmp_path):
    other = small_trace(tmp_path / "other" / "trace.h5", rows=20)
    before = other.read_bytes()
    bad = crafted.external_link(small_trace(tmp_path / "run" / "trace.h5"), "rows", other)
    message = refusal(lambda: resume(bad))
    assert message.startswith(f"{bad}: /rows is an external link"), message
    assert other.read_bytes() == before and read_trace(other).rows == 20


def test_a_trace_that_cannot_grow_is_one_line_on_resume(tmp_path):
    bad = crafted.contiguous_comm(small_trace(tmp_path / "trace.h5"))
    assert read_trace(bad).rows == 10  # still a readable trace (hpcopt report reads it)
    message = refusal(lambda: resume(bad))
    assert message == (f"{bad}: /comm/calls cannot grow (written with a fixed size, not by hpcopt); "
                       "pass --out DIR to start a new trace")
    writer = resume(small_trace(tmp_path / "good" / "trace.h5"))  # a genuine one appends
    writer.append({name: 99 for name in COLUMNS}, {"average": (99, 8, 0.5), "trace": (9, 1, 0.1)})
    writer.close()
    assert read_trace(writer.path).columns["step"].tolist() == [0, 1, 2, 3, 4, 99]


def test_trace_readers_refuse_a_fifo_link_without_blocking(tmp_path):
    bad = crafted.fifo_link(small_trace(tmp_path / "trace.h5"), "rows")
    with unblocked(bad.with_name(bad.name + ".fifo")):
        for read in (lambda: read_trace(bad), lambda: vet_traces([bad]), lambda: resume(bad)):
            assert refusal(read).startswith(f"{bad}: /rows is an external link")


# -- exported state_dicts ----------------------------------------------------------------------

@pytest.fixture
def state_dict(tmp_path) -> Path:
    torch = pytest.importorskip("torch")
    from hpcopt.torch import save_state_dict

    return save_state_dict({"weight": torch.arange(4.0), "bias": torch.zeros(2)}, tmp_path / "model.h5")


@pytest.mark.extra
@pytest.mark.parametrize("kind,words", [
    ("group", "/block holds a group, not a tensor (a state_dict file holds one numeric dataset "
              "per key at its root)"),
    ("fifo-link", "/weight is an external link"),
    ("soft-link", "/weight is a soft link"),
])
def test_load_state_dict_refuses_what_it_cannot_load_in_one_line(state_dict, kind, words):
    from hpcopt.torch import load_state_dict

    make = {"group": crafted.state_dict_with_group,
            "fifo-link": lambda p: crafted.fifo_link(p, "weight"),
            "soft-link": lambda p: crafted.soft_link(p, "weight")}[kind]
    bad = make(state_dict)
    with unblocked(bad.with_name(bad.name + ".fifo")):
        message = refusal(lambda: load_state_dict(bad))
    assert message.startswith(f"{bad}: ") and words in message, message


@pytest.mark.extra
def test_save_state_dict_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    torch = pytest.importorskip("torch")
    from hpcopt.torch import load_state_dict, save_state_dict

    victim = tmp_path / "victim.txt"
    victim.write_text("not yours\n")
    link = tmp_path / "model.h5"
    link.symlink_to(victim)
    save_state_dict({"weight": torch.ones(2)}, link)
    assert victim.read_text() == "not yours\n"
    assert not link.is_symlink() and load_state_dict(link)["weight"].tolist() == [1.0, 1.0]


def test_a_link_planted_at_a_checkpoints_temporary_name_is_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours\n")
    path = tmp_path / "step-000000005.h5"
    path.with_name(path.name + ".tmp").symlink_to(victim)
    write_checkpoint(path, synthetic())
    assert victim.read_text() == "not yours\n" and read_checkpoint(path).tick == 5


# -- writes that fail ----------------------------------------------------------------------------

class _FullDisk:
    """A raw file whose writes fail with ENOSPC once ``room`` bytes have been written to it."""

    def __init__(self, raw: Any, room: int) -> None:
        self.raw, self.room = raw, room

    def write(self, data: Any) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.raw.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def full_disk(monkeypatch, room: int) -> None:
    """Every file hpcopt writes from now on fails with ENOSPC after ``room`` bytes."""
    from hpcopt.io import safe_files

    monkeypatch.setattr(safe_files, "open", lambda *a, **k: _FullDisk(open(*a, **k), room), raising=False)


def test_a_disk_full_mid_checkpoint_is_one_error_and_the_previous_one_stays(tmp_path, monkeypatch,
                                                                           capfd):
    first, second = tmp_path / "step-000000001.h5", tmp_path / "step-000000002.h5"
    write_checkpoint(first, synthetic())
    full_disk(monkeypatch, first.stat().st_size // 2)
    message = refusal(lambda: write_checkpoint(second, synthetic(value=3.0)))
    assert message.startswith(f"cannot write the checkpoint {second}: No space left on device (")
    assert message.endswith(" free on its file system)") and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]  # no .tmp left
    monkeypatch.undo()
    np.testing.assert_array_equal(read_checkpoint(first).model, synthetic().model)
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_disk_full_mid_pipeline_checkpoint_leaves_the_file_it_would_replace(tmp_path,
                                                                               monkeypatch):
    from hpcopt.io import pipeline_checkpoint as pipe

    path, model = pipeline_checkpoint(tmp_path)
    before = path.read_bytes()
    full_disk(monkeypatch, 2000)
    message = refusal(lambda: pipeline_checkpoint(tmp_path))  # the same tick again
    assert message.startswith(f"cannot write the checkpoint {path}: No space left on device (")
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]
    assert pipe.read(path, 2).model.tolist() == model.tolist()


def test_a_disk_full_mid_trace_is_one_error_then_a_quiet_close(tmp_path, monkeypatch, capfd):
    full_disk(monkeypatch, 40_000)  # room for the new file, not for its first chunk of rows
    writer = TraceWriter(tmp_path / "trace.h5", ATTRS, flush_rows=8)
    for i in range(7):
        writer.append({name: i for name in COLUMNS}, {"average": (i, 8, 0.5)})
    message = refusal(lambda: writer.append({name: 7 for name in COLUMNS}, {"average": (7, 8, 0.5)}))
    assert message.startswith(f"cannot write the trace {writer.path}: No space left on device")
    writer.close()  # the failure was raised once; closing adds nothing
    assert "Exception ignored" not in capfd.readouterr().err


@pytest.mark.extra
def test_a_disk_full_while_exporting_keeps_the_earlier_export(state_dict, monkeypatch):
    import torch

    from hpcopt.torch import load_state_dict, save_state_dict

    full_disk(monkeypatch, 1000)
    message = refusal(lambda: save_state_dict({"weight": torch.ones(4)}, state_dict))
    assert message.startswith(f"cannot write the torch state_dict {state_dict}: No space left on device")
    monkeypatch.undo()
    assert load_state_dict(state_dict)["weight"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert sorted(p.name for p in state_dict.parent.iterdir()) == [state_dict.name]
