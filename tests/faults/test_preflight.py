"""Problems found before the first step (one line, exit 2 on every rank) and uneven shards,
which must never make a rank wait for ever."""

from __future__ import annotations

import re

import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from tests.command_line import assert_one_line_error
from tests.faults.jobs import SMALL, run_job


def test_uneven_shards_run_the_same_number_of_steps_on_every_rank(tmp_path):
    from hpcopt.data.datasets import load_dataset
    from hpcopt.data.partition import partition_indices

    dataset = load_dataset("digits", None, 0.2, 0)
    sizes = [partition_indices("dirichlet", dataset.x_train.shape[0], r, 3, 0,
                               labels=dataset.y_train, alpha=0.3).size for r in range(3)]
    assert max(sizes) > 1.5 * min(sizes), sizes  # the shards really differ
    job = run_job(["train", "--dataset", "digits", "--hidden", "16", "--partition", "dirichlet",
                   "--alpha", "0.3", "--batch-size", "8", "--epochs", "1", "--interval", "4",
                   "--out", str(tmp_path / "run")], ranks=3)
    assert job.returncode == 0, job.describe()
    # T comes from the whole training set, never from a shard: each rank wraps its own epochs
    steps = dataset.x_train.shape[0] // 3 // 8
    assert re.search(rf"steps\s+{steps} per rank", job.stdout), job.stdout


def test_ranks_that_disagree_on_the_length_of_the_run_stop_before_the_first_step(tmp_path):
    code = ("import sys; from mpi4py import MPI; import hpcopt.build as b\n"
            "if MPI.COMM_WORLD.rank == 1:  # e.g. another copy of the data set on its node\n"
            "    steps = b._steps_per_epoch\n"
            "    b._steps_per_epoch = lambda *a: steps(*a) + 1\n"
            "from hpcopt.cli import main\n"
            f"sys.exit(main(['train', *{SMALL!r}, '--epochs', '1', '--out', {str(tmp_path / 'run')!r}]))")
    job = run_job([], python_code=code)
    assert_one_line_error(job, "the ranks disagree on the length of the run", "rank 1: 23 ticks")


def test_no_room_for_a_checkpoint_is_one_line_and_exit_2_on_every_rank(tmp_path):
    code = ("import sys, collections; from mpi4py import MPI; import hpcopt.run.preflight as p\n"
            "if MPI.COMM_WORLD.rank == 0:\n"
            "    p.shutil.disk_usage = lambda path: collections.namedtuple('u', 'total used free')(1, 1, 1000)\n"
            "from hpcopt.cli import main\n"
            f"sys.exit(main(['train', *{SMALL!r}, '--steps', '8', '--out', {str(tmp_path / 'run')!r}]))")
    assert_one_line_error(run_job([], python_code=code), "rank 0: not enough free space for a checkpoint",
                          "0.0 MB free")


def test_a_rank_count_the_algorithm_cannot_use_is_one_line_and_exit_2(tmp_path):
    job = run_job(["train", *SMALL, "--steps", "8", "--local-steps", "2,3,4", "--out", str(tmp_path / "r")])
    assert_one_line_error(job, "local_steps has 3 entries for 2 ranks")


def _train(tmp_path, **options):
    from hpcopt import train
    from hpcopt.comm import Comm

    values = {"dataset": "digits", "hidden": "12", "steps": "6", "interval": "4", "momentum": "0.9",
              "progress": "false", "out": str(tmp_path / "run"), **options}
    comm = Comm()
    try:
        return train(build_config(None, values), comm, verbose=False)
    finally:
        comm.free()


@pytest.mark.parametrize("options", [
    {},
    # AdamW's two moments per rank, the outer step's anchor and buffer: 4 more vectors of
    # 153,610 float64 values, more than the fixed overhead the estimate allows
    {"hidden": "2048", "dtype": "float64", "momentum": "0", "inner_optimizer": "adamw",
     "outer_optimizer": "nesterov", "outer_momentum": "0.9"},
    # a streaming run's in_flight per rank: one more vector of 202,510 float64 values (1.6 MB)
    {"hidden": "2700", "dtype": "float64", "momentum": "0", "fragments": "2", "overlap": "1"},
])
def test_the_estimate_bounds_a_real_checkpoint(tmp_path, options):
    from hpcopt.build import build_run
    from hpcopt.comm import Comm
    from hpcopt.run.preflight import estimate

    summary, _ = _train(tmp_path, **options)  # ends mid-round: every per-rank vector is stored
    comm = Comm()
    values = {"dataset": "digits", "hidden": "12", "momentum": "0.9", **options}
    parts = build_run(build_config(None, values), comm)
    comm.free()
    size = (tmp_path / "run" / "checkpoints" / "step-000000006.h5").stat().st_size
    assert size <= estimate(parts, 1) <= size + (2 << 20)


def test_an_unwritable_checkpoint_directory_is_refused(tmp_path, monkeypatch):
    def refuse(path, mode="r", *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("hpcopt.run.preflight.open", refuse, raising=False)
    with pytest.raises(HpcoptError, match="checkpoints is not writable: Permission denied"):
        _train(tmp_path)


@pytest.mark.parametrize("flags,fragment", [
    (["--stall-timeout", "-1"], "stall_timeout must be >= 0"),
    (["--checkpoint-minutes", "-1"], "checkpoint_minutes must be >= 0 minutes (0 = off), got -1.0"),
    (["--checkpoint-minutes", "inf"], "checkpoint_minutes must be >= 0 minutes (0 = off), got inf"),
    (["--checkpoint-minutes", "nan"], "checkpoint_minutes must be >= 0 minutes (0 = off), got nan"),
    (["--checkpoint-minutes", "5", "--out", ""], "checkpoint_minutes writes checkpoints: it needs a run "
                                                 "directory (--out DIR)"),
    (["--on-nonfinite", "ignore"], "on_nonfinite must be one of stop, skip"),
    (["--debug-fail-at", "1"], "--debug-fail-at takes RANK:STEP[:KIND]"),
    (["--debug-fail-at", "0:3:explode"], "unknown kind 'explode'"),
    (["--debug-fail-at", "1:3:checkpoint"], "only rank 0 writes checkpoints"),
    (["--algorithm", "pprs", "--on-nonfinite", "skip"], "skip applies only to the data-parallel"),
])
def test_bad_failure_options_are_one_line_and_exit_2(flags, fragment, tmp_path, capsys):
    from hpcopt.cli import main

    code = main(["train", "--steps", "8", "--out", str(tmp_path / "r"), *flags])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and fragment in lines[0], lines
