"""Checkpoint and trace files without MPI: round trips, atomic writes under a real kill -9, and
bad files refused with one line and exit code 2 (never a traceback, never a partial load)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.flat import ParamLayout
from hpcopt.io.data_parallel_checkpoint import (
    Checkpoint,
    find_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from hpcopt.io.digest import ATTRIBUTE, seal
from hpcopt.io.trace import read_trace
from hpcopt.run.checkpointing import restore
from hpcopt.run.directory import prune
from tests import crafted
from tests.command_line import ROOT
from tests.stored import assert_near_stored


def synthetic(d: int = 6, world_size: int = 2, value: float = 1.0, mid_round: bool = True,
              rows: bool = True) -> Checkpoint:
    """A consistent checkpoint of a run with momentum (no training needed); ``rows`` False
    leaves out the per-rank vectors (a writer adds them row by row)."""
    config = build_config(None, {"dtype": "float64", "momentum": "0.9", "steps": "10"})
    layout = ParamLayout.of(w=(d - 2,), b=(2,))
    per_rank = {"momentum": np.full((world_size, d), value / 2)} if rows else {}
    if mid_round and rows:
        per_rank["x"] = np.stack([np.full(d, value + r) for r in range(world_size)])
    return Checkpoint(
        config=config, world_size=world_size, tick=5, run_id="abc", trace_rows=2, wall_seconds=1.5,
        layout=layout, model=np.full(d, value + (world_size - 1) / 2),
        counters={"step": np.full(world_size, 5), "rounds": np.full(world_size, 1),
                  "steps_in_round": np.full(world_size, int(mid_round))},
        sampler=np.array([[0, 5, 8, 700, 0, r] for r in range(world_size)], dtype=np.int64),
        window=np.array([[1.25, 2.0]] * world_size), comm=[("allreduce", "average", 2, 96, 0.01, 1, 48)],
        rows=per_rank, ranks=tuple(range(world_size)))


def test_round_trip_and_per_rank_reading(tmp_path):
    path = tmp_path / "step-000000005.h5"
    write_checkpoint(path, synthetic())
    everything = read_checkpoint(path)
    np.testing.assert_array_equal(everything.rows["x"], [[1.0] * 6, [2.0] * 6])
    assert everything.ranks == (0, 1) and everything.config.algorithm.momentum == 0.9
    one = read_checkpoint(path, rank=1, world_size=2)
    np.testing.assert_array_equal(one.rows["x"], [[2.0] * 6])
    assert one.ranks == (1,) and one.comm == [("allreduce", "average", 2, 96, 0.01, 1, 48)]
    with h5py.File(path, "r") as f:  # plain h5py: named parameters next to the flat vector
        assert f["model/params/w"].shape == (4,) and f["model/params/b"].shape == (2,)
        assert f.attrs["format"] == "hpcopt-checkpoint" and "h5py_version" in f.attrs


def test_newest_complete_checkpoint_is_found_and_old_ones_pruned(tmp_path):
    directory = tmp_path / "checkpoints"
    for tick in (4, 12, 8):
        write_checkpoint(directory / f"step-{tick:09d}.h5", synthetic())
    (directory / "step-000000016.h5.tmp").write_bytes(b"partial")
    assert find_checkpoint(tmp_path) == directory / "step-000000012.h5"
    assert find_checkpoint(directory) == directory / "step-000000012.h5"
    prune(directory, keep=2, run_id="abc")
    assert sorted(p.name for p in directory.iterdir()) == ["step-000000008.h5", "step-000000012.h5"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(HpcoptError, match="no checkpoint"):
        find_checkpoint(tmp_path / "empty")


def test_a_failed_restore_changes_nothing(tmp_path):
    """The sampler is checked before anything is written into the state."""
    from hpcopt.algorithms.data_parallel import DataParallelState
    from hpcopt.algorithms.inner import Sgd, declared
    from hpcopt.algorithms.state import declaring
    from hpcopt.backend import CPU
    from hpcopt.data.sampler import MinibatchSampler

    ckpt = synthetic()
    state = declaring(DataParallelState, declared(Sgd(momentum=0.9)))(x=np.zeros(6), momentum=np.zeros(6))
    sampler = MinibatchSampler(np.arange(700), 8, seed=1, rank=0)  # the checkpoint has seed 0
    with pytest.raises(HpcoptError, match="seed"):
        restore(ckpt, 0, state, sampler, CPU)
    assert not state.x.any() and not state.momentum.any() and state.step == 0
    assert (sampler.epoch, sampler.position) == (0, 0)


KILL_CHILD = """
import importlib.util, sys
import numpy as np
from pathlib import Path
spec = importlib.util.spec_from_file_location("helpers", sys.argv[1])
helpers = importlib.util.module_from_spec(spec); spec.loader.exec_module(helpers)
from hpcopt.io.data_parallel_checkpoint import CheckpointWriter, write_checkpoint
out = Path(sys.argv[2])
write_checkpoint(out / "step-000000001.h5", helpers.synthetic(value=7.0))
print("first written", flush=True)
big = helpers.synthetic(d=4_000_000, world_size=8, mid_round=False, rows=False)
with CheckpointWriter(out / "step-000000002.h5", big, ["momentum"]) as writer:
    for rank in range(8):
        writer.row("momentum", rank, np.full(big.model.size, float(rank)))
    writer.commit(big.comm)
print("second written", flush=True)
"""


def test_kill_9_during_a_checkpoint_write_leaves_the_previous_one_loadable(tmp_path):
    """A real process is SIGKILLed while it writes a ~320 MB checkpoint."""
    child = subprocess.Popen([sys.executable, "-c", KILL_CHILD, __file__, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert child.stdout.readline().strip() == "first written"
        tmp = tmp_path / "step-000000002.h5.tmp"
        deadline = time.monotonic() + 60
        while not (tmp.exists() and tmp.stat().st_size > 32 << 20):
            assert time.monotonic() < deadline and child.poll() is None, "the write never started"
            time.sleep(0.002)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert tmp.exists() and not (tmp_path / "step-000000002.h5").exists()
    assert find_checkpoint(tmp_path) == tmp_path / "step-000000001.h5"
    previous = read_checkpoint(tmp_path)
    np.testing.assert_array_equal(previous.rows["x"][0], np.full(6, 7.0))
    with pytest.raises(HpcoptError, match="incomplete checkpoint"):
        read_checkpoint(tmp)
    prune(tmp_path, keep=1, run_id="abc")  # the next successful write removes the leftover
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000001.h5"]


TRACE_CHILD = """
import sys, time
from pathlib import Path
from hpcopt.io.trace import COLUMNS, TraceWriter
from hpcopt.config import build_config, to_toml
writer = TraceWriter(Path(sys.argv[1]), {"config": to_toml(build_config()), "run_id": "r"},
                     flush_rows=16)
on_disk = 0
for i in range(10**9):
    writer.append({name: i for name in COLUMNS}, {"average": (i, 8 * i, 0.5 * i)})
    if writer.rows_on_disk != on_disk:
        on_disk = writer.rows_on_disk
        print(on_disk, flush=True)
"""


def test_trace_survives_kill_9_with_every_flushed_row(tmp_path):
    path = tmp_path / "trace.h5"
    child = subprocess.Popen([sys.executable, "-c", TRACE_CHILD, str(path)], stdout=subprocess.PIPE,
                             text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert int(child.stdout.readline()) == 16
        time.sleep(0.2)
        os.kill(child.pid, signal.SIGKILL)
        flushed = [int(line) for line in child.stdout.read().split()]
    finally:
        child.kill()
        child.wait()
    trace = read_trace(path)
    at_least = max([16, *flushed])
    assert trace.rows >= at_least
    assert trace.columns["step"].tolist() == list(range(trace.rows))
    assert trace.comm["average"]["bytes"].tolist() == [8 * i for i in range(trace.rows)]


# -- bad files: one line, exit 2 ----------------------------------------------------------------

@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    """A real checkpoint of a 1-rank run that ended mid-round, with momentum."""
    from hpcopt import train
    from hpcopt.comm import Comm

    out = tmp_path_factory.mktemp("good")
    config = build_config(None, {"dataset": "digits", "hidden": "12", "steps": "6", "interval": "4",
                                 "momentum": "0.9", "progress": "false", "out": str(out / "run")})
    comm = Comm()
    train(config, comm, verbose=False)
    comm.free()
    return out / "run" / "checkpoints" / "step-000000006.h5"


def _copy(source: Path, target: Path) -> Path:
    shutil.copy(source, target)
    return target


def _write(target: Path, data: bytes) -> Path:
    target.write_bytes(data)
    return target


def _edit(source: Path, target: Path, change, sealed: bool = True) -> Path:
    """A copy of ``source`` changed by ``change``; ``sealed``: with the digest of the changed
    contents (a consistent file with a bad value: the checks after the digest), else with the
    original digest (damage)."""
    shutil.copy(source, target)
    with h5py.File(target, "a") as f:
        change(f)
        if sealed:
            seal(f)
    return target


def _unsealed(change):
    return lambda s, d: _edit(s, d, change, sealed=False)


def _old_version(f):
    """A file as version 1 wrote it: no digest."""
    del f.attrs[ATTRIBUTE]
    f.attrs["format_version"] = 1


def _replace(name, data):
    def change(f):
        del f[name]
        f[name] = data
    return change


def _bad_config(f):
    f.attrs["config"] = f.attrs["config"].replace("hidden = [12]", "hidden = [13]")


BAD_FILES = {
    "not-hdf5": (lambda src, dst: _write(dst, b"just text\n"), "not an HDF5 file"),
    "truncated": (lambda src, dst: _write(dst, src.read_bytes()[: src.stat().st_size // 2]),
                  "damaged or truncated"),
    "empty": (lambda src, dst: _write(dst, b""), "not an HDF5 file"),
    "format-version": (lambda s, d: _edit(s, d, lambda f: f.attrs.__setitem__("format_version", 99)),
                       "format version 99"),
    "not-a-checkpoint": (lambda s, d: _edit(s, d, lambda f: f.attrs.__setitem__("format", "other")),
                         "not an hpcopt checkpoint"),
    "missing-dataset": (lambda s, d: _edit(s, d, lambda f: f.__delitem__("ranks/sampler")),
                        "/ranks/sampler is missing"),
    "wrong-shape": (lambda s, d: _edit(s, d, _replace("model/flat", np.zeros(5, np.float32))),
                    "/model/flat has dtype float32 and shape (5,)"),
    "wrong-dtype": (lambda s, d: _edit(s, d, _replace("ranks/counters", np.zeros((1, 3)))),
                    "/ranks/counters has dtype float64"),
    "string-dataset": (lambda s, d: _edit(s, d, _replace("ranks/window", np.array([b"rm -rf"]))),
                       "/ranks/window has dtype |S6"),
    "nan-parameters": (lambda s, d: _edit(s, d, lambda f: f["model/flat"].__setitem__(0, np.nan)),
                       "/model/flat contains NaN"),
    "nan-rank-model": (lambda s, d: _edit(s, d, lambda f: f["ranks/x"].__setitem__((0, 3), np.inf)),
                       "/ranks/x contains NaN or infinite"),
    "config-not-toml": (lambda s, d: _edit(s, d, lambda f: f.attrs.__setitem__("config", "[[[")),
                        "stored config is not valid TOML"),
    "config-invalid": (lambda s, d: _edit(s, d, lambda f: f.attrs.__setitem__(
        "config", "[algorithm]\ninterval = 0\n")), "stored config is invalid"),
    "config-vs-model": (lambda s, d: _edit(s, d, _bad_config), "does not match the model"),
    "layout-garbage": (lambda s, d: _edit(s, d, lambda f: f["model"].attrs.__setitem__("layout", "{")),
                       "'layout' is not valid JSON"),
    "momentum-missing": (lambda s, d: _edit(s, d, lambda f: f.__delitem__("ranks/momentum")),
                         "ranks/momentum is missing"),
    "sampler-out-of-range": (lambda s, d: _edit(s, d, lambda f: f["ranks/sampler"].__setitem__(
        (0, 1), 10**6)), "step-000000006.h5: /ranks/sampler row 0: sampler state position 1000000"),
    "in-node-over-total": (lambda s, d: _edit(s, d, lambda f: f["comm"].attrs.__setitem__(
        "counters", '[["allreduce", "average", 2, 96, 0.01, 3, 48]]')), "'counters' is missing or malformed"),
    "counters-vs-tick": (lambda s, d: _edit(s, d, lambda f: f.attrs.__setitem__("tick", 3)),
                         "counters do not match its tick 3"),
    "digest-mismatch-value": (_unsealed(lambda f: f["ranks/momentum"].__setitem__((0, 1), 0.5)),
                              "is a damaged checkpoint (content digest mismatch)"),
    "digest-mismatch-attribute": (_unsealed(lambda f: f.attrs.__setitem__("trace_rows", 1)),
                                  "is a damaged checkpoint (content digest mismatch)"),
    "digest-mismatch-config": (_unsealed(_bad_config), "is a damaged checkpoint (content digest mismatch)"),
    "digest-mismatch-format": (_unsealed(lambda f: f.attrs.__setitem__("format", "other")),
                               "is a damaged checkpoint (content digest mismatch)"),
    "digest-missing": (_unsealed(lambda f: f.attrs.__delitem__(ATTRIBUTE)),
                       "is a damaged checkpoint (content digest missing)"),
    "digest-garbage": (_unsealed(lambda f: f.attrs.__setitem__(ATTRIBUTE, "0" * 64)),
                       "is a damaged checkpoint (content digest mismatch)"),
    "version-1-no-digest": (_unsealed(_old_version), "checkpoint format version 1; this hpcopt reads version 2"),
    "temporary-file": (lambda s, d: shutil.copy(s, d.with_name("step-1.h5.tmp")) and
                       d.with_name("step-1.h5.tmp"), "incomplete checkpoint"),
    "missing-file": (lambda s, d: d.with_name("nothing.h5"), "checkpoint not found"),
    # crafted (tests/crafted.py), resealed: refused by the vet child before any rank opens them
    "soft-link": (lambda s, d: crafted.soft_link(_copy(s, d), "model/flat"),
                  "/model/flat is a soft link"),
    "external-link": (lambda s, d: crafted.external_link(_copy(s, d), "model/flat", d.with_name("x.h5")),
                      "/model/flat is an external link"),
    "fifo-link": (lambda s, d: crafted.fifo_link(_copy(s, d), "model/flat"),
                  "/model/flat is an external link"),
    "virtual-dataset": (lambda s, d: crafted.virtual_dataset(_copy(s, d), "model/flat"),
                        "/model/flat is a virtual dataset"),
    "external-storage": (lambda s, d: crafted.external_storage(_copy(s, d), "ranks/x"),
                         "/ranks/x keeps its data in an external file"),
    "gzip-filter": (lambda s, d: crafted.gzip_filter(_copy(s, d), "ranks/momentum"),
                    "/ranks/momentum uses the filter deflate"),
    "huge-model": (lambda s, d: crafted.huge_model(_copy(s, d), 1 << 23), "of data but the file holds"),
}


def test_counters_written_before_the_in_node_split_count_nothing_in_node(tmp_path):
    path = tmp_path / "step-000000005.h5"
    write_checkpoint(path, synthetic())
    old = _edit(path, tmp_path / "step-000000006.h5", lambda f: f["comm"].attrs.__setitem__(
        "counters", '[["allreduce", "average", 2, 96, 0.01]]'))
    assert read_checkpoint(old).comm == [("allreduce", "average", 2, 96, 0.01, 0, 0)]


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_checkpoint_is_one_line_and_exit_2(good_checkpoint, tmp_path, capsys, case):
    from hpcopt.cli import main

    make, fragment = BAD_FILES[case]
    bad = make(good_checkpoint, tmp_path / "step-000000006.h5")
    code = main(["resume", str(bad), "--steps", "10", "--progress", "false"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("hpcopt: error: "), err
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in err


def test_good_checkpoint_resumes_in_process(good_checkpoint, tmp_path, capsys):
    from hpcopt.cli import main

    run = tmp_path / "run"
    shutil.copytree(good_checkpoint.parent.parent, run)
    assert main(["resume", str(run), "--steps", "10", "--progress", "false"]) == 0
    assert read_trace(run / "trace.h5").summary["step"] == 10
    assert find_checkpoint(run).name == "step-000000010.h5"


def test_a_new_run_never_overwrites_an_old_one(good_checkpoint, capsys):
    from hpcopt.cli import main

    run = good_checkpoint.parent.parent
    assert main(["train", "--dataset", "digits", "--steps", "4", "--out", str(run)]) == 2
    assert "already holds a run: resume it" in capsys.readouterr().err


@pytest.mark.parametrize("option,value,allowed", [
    ("hidden", "8", False), ("seed", "4", False), ("dtype", "float64", False), ("lr", "0.2", False),
    ("batch_size", "16", False), ("momentum_policy", "reset", False),
    ("steps", "40", True), ("eval_every", "5", True), ("out", "elsewhere", True),
    ("trace_every", "2", True), ("checkpoint_every", "3", True),
])
def test_only_safe_options_may_change_on_resume(option, value, allowed):
    from hpcopt.config import check_resume

    stored = build_config(None, {"steps": "20", "momentum": "0.9"})
    changed = build_config(None, {"steps": "20", "momentum": "0.9", option: value})
    if allowed:
        check_resume(stored, changed)
    else:
        with pytest.raises(HpcoptError, match=f"cannot change {option} when resuming"):
            check_resume(stored, changed)


def test_the_run_length_is_fixed_with_the_sqrt_nt_schedule():
    from hpcopt.config import check_resume

    stored = build_config(None, {"steps": "20", "schedule": "sqrt_nt"})
    with pytest.raises(HpcoptError, match="sqrt_nt step size depends on the number of steps"):
        check_resume(stored, build_config(None, {"steps": "40", "schedule": "sqrt_nt"}))


@pytest.mark.parametrize("algorithm", ["prsgd", "celgc"])
def test_a_version_2_checkpoint_resumes_bit_for_bit(tmp_path, algorithm):
    """Files written by hpcopt before the state was declared (format version 2: fixed per-rank
    datasets, the clipping numbers in their own table) resume exactly (digits, MLP 64-12-10,
    I = 4, momentum 0.9, checkpoint at step 6, mid-round): the model after 10 steps is bitwise
    the resume of the same state in today's format, and within a few ulp the model the old
    version's uninterrupted run reached on the machine that wrote the files
    (``_resume_old_checkpoint``)."""
    from hpcopt.io.data_parallel_checkpoint import VERSION

    old, _ = _resume_old_checkpoint(tmp_path, "checkpoint-v2", algorithm)
    assert VERSION == 3 and old.counters["step"].tolist() == [6]
    if algorithm == "celgc":
        assert set(old.scalars) == {"clipped", "grad_norm"} and "clip_count" in old.counters


def test_a_slowmo_checkpoint_from_before_the_outer_optimizers_resumes_bit_for_bit(tmp_path):
    """SlowMo, written when it was its own update rule (before hpcopt.algorithms.outer: its
    stored config names only slow_momentum and slow_lr, its state anchor and slow_buffer),
    resumes exactly (digits, MLP 64-12-10, I = 4, momentum 0.9 averaged, beta 0.6, alpha 0.9, lr
    halved at step 5, checkpoint at step 6: mid-round, after one slow step): the model after 10
    steps as ``_resume_old_checkpoint`` holds it; and a new run to step 6 holds the state the
    old one wrote: its counters and sampler exactly, its vectors within a few ulp (tests.stored:
    the old run's were computed on another machine)."""
    old, today = _resume_old_checkpoint(tmp_path, "checkpoint-v3", "slowmo")  # today: 1 rank,
    # so the average that ends a run mid-round changes no bit of x
    assert sorted(old.shared) == ["anchor", "slow_buffer"] and old.counters["rounds"].tolist() == [1]
    for name, stored in (("x", old.rows["x"][0]), ("momentum", old.rows["momentum"][0]),
                         ("anchor", old.shared["anchor"]), ("slow_buffer", old.shared["slow_buffer"])):
        assert_near_stored(getattr(today, name), stored, name)
    with h5py.File(ROOT / "tests" / "data" / "checkpoint-v3" / "slowmo-step-6.h5", "r") as f:
        stored = f.attrs["config"]
    assert "slow_momentum = 0.6" in stored and "outer_optimizer" not in stored


def test_a_celgc_checkpoint_from_before_celgc_was_pieces_resumes_bit_for_bit(tmp_path):
    """CELGC, written when it was its own round (LocalClip with its own step, average, finish:
    before the clipping rule, the round at a step's start and participation were pieces of
    PR-SGD's round), resumes exactly (digits, MLP 64-12-10, I = 4, gamma 0.1 on the global
    norm, momentum 0.9 averaged at the rounds, weight decay, Nesterov outer step, lr halved at
    step 5; checkpoint at step 8: the end of a round whose average comes before step 9, after
    one outer step): to step 12, where the run ends on a complete round (its outer step in the
    final average), as ``_resume_old_checkpoint`` holds it."""
    old, today = _resume_old_checkpoint(tmp_path, "checkpoint-v3", "celgc", at=8, to=12)
    assert old.counters["steps_in_round"].tolist() == [4] and old.counters["rounds"].tolist() == [2]
    assert sorted(old.shared) == ["anchor", "outer_buffer"] and "clip_count" in old.counters
    assert 0 < old.counters["clip_count"][0] < 8


def _resume_old_checkpoint(tmp_path, directory: str, algorithm: str, at: int = 6, to: int = 10):
    """Resume tests/data/DIRECTORY/ALGORITHM-step-AT.h5 (AT: 6 unless given), a file of an older
    format or an older version's, to step TO (10) and hold it to two references. Bitwise, its
    whole state (``assert_same_state``): the resume to step TO, on this machine, of the same
    state in today's format (``with_state_of``: moved by hand, without hpcopt's reader of old
    formats, into the step-AT checkpoint of a new run, whose
    counters and sampler equal the old file's) -- and such a resume is the uninterrupted run
    (tests/mpi/test_resume.py). The model within a few ulp (``tests.stored``):
    ALGORITHM-step-TO-x.npy, the old version's uninterrupted run, computed on the machine that
    wrote the files (another CPU's BLAS kernels round differently). Returns (the old
    checkpoint, the new run's state at step AT)."""
    from tests.checkpoints import with_state_of
    from tests.runs import assert_same_state, fresh_train

    data = ROOT / "tests" / "data" / directory
    old = read_checkpoint(data / f"{algorithm}-step-{at}.h5")
    name = f"step-{at:09d}.h5"
    old_path = tmp_path / "old" / "checkpoints" / name
    old_path.parent.mkdir(parents=True)
    shutil.copy(data / f"{algorithm}-step-{at}.h5", old_path)
    _, today = fresh_train(_ending_at(old.config, at, tmp_path / "today"))  # today's format
    today_path = with_state_of(old_path, tmp_path / "today" / "checkpoints" / name)
    _, from_old = fresh_train(_ending_at(old.config, to, tmp_path / "old"), resume=old_path)
    _, from_today = fresh_train(_ending_at(old.config, to, tmp_path / "today"), resume=today_path)
    assert_same_state(from_old, from_today)
    assert_near_stored(from_old.x, np.load(data / f"{algorithm}-step-{to}-x.npy"), "x")
    return old, today


def _ending_at(config, steps: int, out: Path):
    """``config`` run to ``steps`` in the run directory ``out``, quietly."""
    return dataclasses.replace(config, run=dataclasses.replace(config.run, steps=steps, out=str(out),
                                                               progress=False))


def test_a_checkpoints_run_directory_is_written_as_the_user_gave_it(tmp_path, monkeypatch):
    """A resumed run prints and uses the run directory as the user wrote it (relative stays
    relative); a checkpoints/ folder that is a link to another run's is that run's directory."""
    from hpcopt.run.directory import home_of

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "a" / "checkpoints").mkdir(parents=True)
    assert home_of(Path("runs/a/checkpoints/step-000000008.h5")) == Path("runs/a")
    (tmp_path / "runs" / "b").mkdir()
    (tmp_path / "runs" / "b" / "checkpoints").symlink_to(tmp_path / "runs" / "a" / "checkpoints")
    assert home_of(Path("runs/b/checkpoints/step-000000008.h5")) == tmp_path / "runs" / "a"
    assert home_of(Path("loose.h5")) is None
