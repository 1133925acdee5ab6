"""``--fault`` and ``--straggler`` (hpcopt.run.fault_schedule): parsed and checked in one line, a
straggler's sleep in proportion to its gradient's time, a fault's record read as data; collect's
recovery columns from ``/rank_losses`` and from the fault record (hpcopt.study.recovery); the
study task's ``--ranks-changed`` on a requeue onto another number of ranks."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.run.fault_schedule import (
    RECORD,
    FaultRecord,
    Schedule,
    check_ranks,
    check_reached,
    parse_fault,
    parse_stragglers,
    read_record,
)
from hpcopt.study import collect, layout
from hpcopt.study.recovery import rank_losses, recovery
from hpcopt.study.task import command, launched_ranks
from tests.runs import fresh_train

SMALL = {"dataset": "digits", "hidden": "16", "steps": "8", "checkpoint_every": "4", "progress": "false"}


def test_schedules_parse():
    assert parse_stragglers("1:0.6, 3:0.25") == {1: 0.6, 3: 0.25}
    assert parse_stragglers("") == {} and parse_fault("") is None
    assert parse_fault("2:300") == (2, 300)


@pytest.mark.parametrize("options, message", [
    ({"straggler": "1:1.5"}, "FACTOR must be >= 0.01 and < 1"),
    ({"straggler": "1:0"}, "FACTOR must be >= 0.01 and < 1"),
    ({"straggler": "1:1e-300"}, "FACTOR must be >= 0.01 and < 1"),  # once an OverflowError
    ({"straggler": "1:1e-9"}, "FACTOR must be >= 0.01 and < 1"),  # once a sleep for ever
    ({"straggler": "1:nan"}, "FACTOR must be >= 0.01 and < 1"),
    ({"straggler": "1"}, "--straggler takes RANK:FACTOR"),
    ({"straggler": "1:0.5,1:0.6"}, "names rank 1 twice"),
    ({"straggler": "-1:0.5"}, "RANK must be >= 0"),
    ({"fault": "1:x"}, "--fault takes RANK:STEP"),
    ({"fault": "1:5,2:6"}, "one RANK:STEP"),
    ({"fault": "1:0", "checkpoint_every": "4"}, "counts a rank's steps from 1"),
    ({"fault": "1:6"}, "pass --checkpoint-every C with 0 < C < 6"),
    ({"fault": "1:6", "checkpoint_every": "6"}, "0 < C < 6"),
    ({"fault": "1:6", "checkpoint_every": "2", "algorithm": "pprs"}, "only to the data-parallel"),
])
def test_bad_schedules_are_one_line(options, message):
    with pytest.raises(HpcoptError, match=message):
        build_config(None, options)


def test_a_schedule_naming_a_rank_the_job_has_not_is_refused_except_a_resumed_fault():
    run = build_config(None, {"straggler": "1:0.5", "fault": "3:9", "checkpoint_every": "4"}).run
    check_ranks(run, 4)
    with pytest.raises(HpcoptError, match="--fault names rank 3, and the job has 2 rank"):
        check_ranks(run, 2)
    check_ranks(run, 2, resumed=True)  # fired already, or no such rank to kill
    with pytest.raises(HpcoptError, match="--straggler names rank 1, and the job has 1 rank"):
        check_ranks(run, 1, resumed=True)


def test_a_fault_past_its_ranks_last_step_is_refused_before_training(tmp_path):
    """It would never fire, and the run would pass for a faulted one."""
    run = build_config(None, {"fault": "1:9", "checkpoint_every": "4"}).run
    check_reached(run, lambda rank: 9, 2)
    with pytest.raises(HpcoptError, match="--fault 1:9: rank 1 runs 8 steps, so its step 9 never "
                                          "comes: choose a STEP up to 8, or a longer run"):
        check_reached(run, lambda rank: 8, 2)
    check_reached(run, lambda rank: 8, 1)  # a resumed job without rank 1: check_ranks's
    with pytest.raises(HpcoptError, match="rank 0 runs 8 steps, so its step 9 never comes"):
        fresh_train(build_config(None, {**SMALL, "fault": "0:9", "out": str(tmp_path / "run")}))
    assert not (tmp_path / "run").exists()


def test_a_sweep_refuses_a_schedule_naming_a_rank_its_task_has_not(tmp_path):
    from hpcopt.study.spec import load_study, tasks

    spec = tmp_path / "s.toml"
    spec.write_text('[train]\nsteps = 8\ncheckpoint_every = 4\n[sweep]\nranks = [2, 4]\nfault = ["3:6"]\n')
    with pytest.raises(HpcoptError, match="task hpcopt-n2: --fault names rank 3"):
        tasks(load_study(spec))
    spec.write_text('[train]\nsteps = 8\ncheckpoint_every = 4\n[sweep]\nranks = [4]\n'
                    'fault = ["", "2:6"]\nstraggler = ["", "1:0.6"]\n')
    names = [t.name for t in tasks(load_study(spec))]
    assert names == ["hpcopt-n4-fault-straggler", "hpcopt-n4-fault-straggler1_0.6",
                     "hpcopt-n4-fault2_6-straggler", "hpcopt-n4-fault2_6-straggler1_0.6"]


def test_a_straggler_sleeps_in_proportion_to_its_gradients_time_and_changes_nothing():
    run = build_config(None, {"straggler": "1:0.25"}).run

    def oracle(x, grad):
        time.sleep(0.02)
        grad[...] = x
        return 1.5

    slow, fast = Schedule(run, rank=1).wrap(oracle, lambda: 0), Schedule(run, rank=0).wrap(oracle, lambda: 0)
    assert fast is oracle  # another rank's schedule costs nothing
    x, grad = np.arange(3.0), np.zeros(3)
    start = time.perf_counter()
    assert slow(x, grad) == 1.5 and (grad == x).all()
    assert time.perf_counter() - start >= 4 * 0.02  # the gradient's 0.02 s, then 3 x that asleep


def test_a_stop_signal_ends_a_stragglers_sleep_and_those_after_it():
    """The slowest straggler sleeps 99 times its gradient's time; a stop ends that at once."""
    run = build_config(None, {"straggler": "1:0.01"}).run
    stopped: list[bool] = []

    def oracle(x, grad):
        time.sleep(0.02)
        return 1.0

    slow = Schedule(run, rank=1, stopping=lambda: bool(stopped)).wrap(oracle, lambda: 0)
    threading.Timer(0.3, stopped.append, (True,)).start()
    start = time.perf_counter()
    slow(np.zeros(1), np.zeros(1))  # 0.02 s, then 1.98 s asleep but for the stop at 0.3 s
    assert time.perf_counter() - start < 1.0
    start = time.perf_counter()
    slow(np.zeros(1), np.zeros(1))
    assert time.perf_counter() - start < 0.5  # no sleep once stopping


def test_sigterm_ends_a_stragglers_sleep_under_the_python_api(tmp_path, monkeypatch):
    """``hpcopt.train`` keeps SIGTERM a flag (no JobSignals): the straggler's sleep ends at it as
    on the command line, and the run stops at a checkpoint. Counted, not timed: the sleep's
    slices (``SLEEP_SLICE``) that begin once the signal is sent, at most the one under way as
    it is handled (the sleep once went on for every step up to the next row, 99 times each
    gradient's time)."""
    import os
    import signal
    from types import SimpleNamespace

    import hpcopt
    from hpcopt.run import fault_schedule

    sent = threading.Event()
    slices = {False: 0, True: 0}  # slices of the straggler's sleep begun before and after the signal

    def sleep(seconds: float) -> None:
        slices[sent.is_set()] += 1
        time.sleep(seconds)

    monkeypatch.setattr(fault_schedule, "time", SimpleNamespace(
        sleep=sleep, monotonic=time.monotonic, perf_counter=time.perf_counter, time=time.time))

    def send() -> None:  # once the loop takes SIGTERM over and the straggler sleeps
        while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or not slices[False]:
            time.sleep(0.01)
        sent.set()
        os.kill(os.getpid(), signal.SIGTERM)

    config = build_config(None, {"dataset": "digits", "hidden": "256,256", "batch_size": "256",
                                 "steps": "400", "trace_every": "8", "straggler": "0:0.01",
                                 "out": str(tmp_path / "run"), "progress": "false"})
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    summary, _ = hpcopt.train(config, verbose=False)
    sender.join()
    assert summary.stopped and summary.stop_signal == "SIGTERM" and Path(summary.checkpoint).is_file()
    assert slices[True] <= 1, slices
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_fault_record_is_data_checked_field_by_field(tmp_path):
    assert read_record(tmp_path) is None
    record = FaultRecord("r", 1, 13, 100.0, 102.5, 8)
    (tmp_path / RECORD).write_text(json.dumps(record.__dict__))
    assert read_record(tmp_path) == record
    assert record.steps_redone() == 4 and record.recovery_seconds() == 2.5
    for bad in ('{"run_id": "r", "rank": 1, "step": 13}', '{"run_id": "r", "rank": true, "step": 1, '
                '"killed_at": 1}', '[1]', "not json", '{"run_id": "r", "rank": 1, "step": 1, "killed_at": 1, '
                '"code": "import os"}'):
        (tmp_path / RECORD).write_text(bad)
        with pytest.raises(HpcoptError, match="not a fault record"):
            read_record(tmp_path)


def write_rank_losses(path: Path, **datasets: np.ndarray) -> None:
    """The layout ``--on-rank-loss continue`` writes: /rank_losses, one 1-D dataset per field."""
    with h5py.File(path, "a") as f:
        group = f.create_group("rank_losses")
        for name, values in datasets.items():
            group.create_dataset(name, data=values)


LOSSES = {"step": np.array([13, 30], np.int64), "rank": np.array([2, 1], np.int64),
          "recover_seconds": np.array([0.05, 0.25], np.float64),
          "round_step": np.array([8, 24], np.int64)}


def test_rank_losses_are_read_from_the_traces_group(tmp_path):
    trace = tmp_path / "trace.h5"
    write_rank_losses(trace, **LOSSES)
    found = rank_losses(trace)
    assert found is not None and found.losses == 2 and found.steps_lost == (13 - 8) + (30 - 24)
    assert found.seconds == pytest.approx(0.30)
    for name, bad in (("short", {**LOSSES, "rank": np.array([2], np.int64)}),
                      ("float-step", {**LOSSES, "step": np.array([1.0, 2.0])}),
                      ("negative", {**LOSSES, "recover_seconds": np.array([-1.0, 0.0])}),
                      ("missing", {"step": LOSSES["step"]}),
                      ("no-round-step", {k: v for k, v in LOSSES.items() if k != "round_step"})):
        path = tmp_path / f"{name}.h5"
        write_rank_losses(path, **bad)
        with pytest.raises(HpcoptError, match="rank_losses"):
            rank_losses(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished 1-rank run with checkpoints at steps 4 and 8."""
    out = tmp_path_factory.mktemp("runs") / "r"
    fresh_train(build_config(None, {**SMALL, "out": str(out)}))
    return out


def test_collect_reports_losses_from_the_trace_and_from_a_fault_record(run, tmp_path):
    import shutil

    runs = {name: tmp_path / name for name in ("plain", "continued", "resumed")}
    for path in runs.values():
        shutil.copytree(run, path)
    write_rank_losses(runs["continued"] / "trace.h5", **LOSSES)
    (runs["resumed"] / RECORD).write_text(json.dumps(FaultRecord("r", 1, 7, 50.0, 53.0, 4).__dict__))
    rows = collect.columns(collect.gather(list(runs.values())), tmp_path)
    got = [(row["rank_losses"], row["steps_lost"], row["recovery_seconds"]) for row in rows]
    assert got == [(0, None, None), (2, 11, pytest.approx(0.30)), (1, 2, 3.0)]
    assert "rank_losses" not in collect.columns(collect.gather([runs["plain"]]), tmp_path)[0]
    assert recovery(runs["plain"], runs["plain"] / "trace.h5") is None


def test_a_requeued_task_on_another_number_of_ranks_resumes_with_ranks_changed(run, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(run, tmp_path / "runs" / "t0")
    (tmp_path / "runs" / "t0" / "trace.h5").unlink()  # not finished: a task resumes it
    entry = layout.Entry(0, Path("runs/t0"), 1, ("--steps", "8"))
    assert command(tmp_path, entry, ["mpiexec", "-n", "1"])[-2:] == ["resume", "runs/t0"]
    assert command(tmp_path, entry, ["mpiexec", "-n", "2"])[-3:] == ["resume", "runs/t0", "--ranks-changed"]
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert command(tmp_path, entry, ["srun"])[-1] == "--ranks-changed"
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert command(tmp_path, entry, ["srun"])[-1] == "runs/t0"
    assert launched_ranks(["mpiexec", "-np", "3"]) == 3 and launched_ranks(["srun", "--ntasks=5"]) == 5
    assert launched_ranks(["mpiexec"]) is None
