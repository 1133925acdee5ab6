"""hpcopt.run.signals in one process: in the training loop SIGTERM and SIGINT only set the loop's
flag; a job that got Ctrl-C never exits 0; the handlers are put back. (Ending the job, which
only whole jobs can show, is tests/faults/test_signals.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

from hpcopt.run.signals import JobSignals, StopSignal, exit_code, handled_by, launcher_rank


def wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within 30 s"
        time.sleep(0.01)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_in_the_loop_a_signal_only_sets_the_flag_and_the_first_one_counts(signum):
    with JobSignals(grace=600) as job, StopSignal(True) as stop:
        os.kill(os.getpid(), signum)
        assert stop.raised == signum  # at once: the main thread's handler set it
        other = signal.SIGINT if signum == signal.SIGTERM else signal.SIGTERM
        os.kill(os.getpid(), other)
        wait_for(lambda: len(job.received) == 2)  # the job's thread saw both
        assert stop.raised == signum and job.received == [signum, other]
        stop.settle()  # the stop's checkpoint is written: the deadline is off
    assert job.exit_code(0) == 130 and job.exit_code(2) == 2 and job.exit_code(143) == 143


def test_a_job_without_sigint_keeps_its_exit_code():
    with JobSignals(grace=600) as job, StopSignal(True) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: job.received == [signal.SIGTERM])
        assert stop.raised == signal.SIGTERM
        stop.settle()
    assert job.exit_code(0) == 0 and job.exit_code(exit_code(signal.SIGTERM)) == 143


def test_without_a_run_directory_the_loop_has_no_flag_to_set():
    stop = StopSignal(False)
    stop.request(signal.SIGTERM)
    assert stop.raised == 0


def test_the_handlers_are_put_back_and_a_job_inside_a_job_is_the_same():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with JobSignals() as outer:
        with JobSignals() as inner:
            assert inner is outer and JobSignals.active is outer
        assert JobSignals.active is outer  # the inner one installed nothing, removes nothing
        assert signal.getsignal(signal.SIGINT) is not before[signal.SIGINT]
    assert JobSignals.active is None
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_python_api_keeps_sigterm_a_flag_and_ctrl_c_a_keyboard_interrupt():
    # Python's own SIGINT handler, as a program started from a terminal has it (a suite started
    # in the background by a non-interactive shell inherits SIGINT ignored, and keeps it so)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with StopSignal(True) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.raised == signal.SIGTERM
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("job", [True, False], ids=["under JobSignals", "alone"])
def test_handled_by_hands_each_signal_to_its_handler_from_another_thread(job):
    """sweep --local's hand-over: no ending of the job, no KeyboardInterrupt, and the handler
    never runs in the main thread (which holds its lock while it starts a task)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    got: list[tuple[int, bool]] = []

    def handler(signum: int) -> None:
        got.append((signum, threading.current_thread() is threading.main_thread()))

    with JobSignals(grace=600) if job else contextlib.nullcontext():
        with handled_by(handler):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for(lambda: len(got) == 2)
        assert sorted(got) == [(signal.SIGINT, False), (signal.SIGTERM, False)]
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_rank_comes_from_the_launcher_before_mpi_starts(monkeypatch):
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert launcher_rank() == 0
    monkeypatch.setenv("SLURM_PROCID", "5")
    assert launcher_rank() == 5
    monkeypatch.setenv("PMI_RANK", "3")
    assert launcher_rank() == 3
