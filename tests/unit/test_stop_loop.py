"""The runner's loop stops within two trace rows of a signal, with a checkpoint at the stop
tick and no row in flight, for every checkpoint_every, trace_every and eval_every and every
tick the signal can land in: the loop driven through a session whose rows behave like the
data-parallel window's (a row's reduction finishes at the next row, or when a checkpoint
finishes the rows in flight) or the pipeline's (finished at once). A row whose stop value asks
for a checkpoint (``--checkpoint-minutes``) gets one where it is finished, and moves no stop.
tests/mpi/test_stop_signals.py and tests/mpi/test_wall_checkpoints.py run the real sessions on
every rank."""

from __future__ import annotations

import contextlib
import signal
from itertools import product
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hpcopt.config import Config
from hpcopt.run.runner import CheckpointClock, RunFiles, Ticks, _loop
from hpcopt.run.signals import StopSignal
from hpcopt.run.threads import ThreadChoice
from hpcopt.run.window import Row, WindowStats, read_stop, stop_value

TOTAL = 40


class Session:
    """The runner's ``Session`` with nothing but ticks, rows and checkpoints; the signal lands
    in step ``signal_step`` (before the row of that tick)."""

    def __init__(self, ticks: Ticks, deferred: bool, signal_step: int, stop: StopSignal) -> None:
        self.ticks, self.deferred, self.signal_step, self.stop = ticks, deferred, signal_step, stop
        self.tick = 0
        self.posted: list[tuple[Row, float]] = []
        self.saves: list[int] = []
        self.in_flight_at_saves: list[int] = []
        self.rank_loss = None  # a lost rank ends the job

    def begin(self, files, ckpt) -> None:
        pass

    def steps_left(self) -> int:
        return self.ticks.total

    def progress(self) -> int:
        return self.tick

    def step(self) -> int:
        self.tick += 1
        if self.tick == self.signal_step:
            self.stop.request(signal.SIGTERM)
        return self.tick

    def evaluate(self, tick: int) -> None:
        return None

    def row(self, tick: int, evaluation, stop: float) -> list[Row]:
        finished = self.finish_rows()
        self.posted.append((Row(tick, {}, {}), stop))
        return finished + ([] if self.deferred else self.finish_rows())

    def finish_rows(self) -> list[Row]:
        for row, stop in self.posted:
            signal_number, checkpoint = read_stop(np.array([stop]))
            row.stats = WindowStats(1.0, 1.0, 1.0, 1.0, signal_number, checkpoint=checkpoint)
        finished, self.posted = [row for row, _ in self.posted], []
        return finished

    def check_rows(self, rows, tick) -> None:
        pass

    def note(self, row: Row) -> str:
        return ""

    def save(self, tick: int) -> None:
        self.saves.append(tick)
        self.in_flight_at_saves.append(len(self.posted))

    def last_rows(self, tick: int) -> list[Row]:
        return self.finish_rows()

    def final(self) -> str:
        return "evaluated"

    def summarize(self, final, train_loss, threads, stopped: str, show: bool) -> SimpleNamespace:
        return SimpleNamespace(final=final, stopped=stopped)


def run_loop(ce: int, te: int, ev: int, signal_step: int, deferred: bool, monkeypatch=None,
             asked=lambda tick: False):
    """The loop run to its end or stop; rank 0's clock asks for a checkpoint in the rows of the
    ticks ``asked`` is true for."""
    ticks = Ticks(TOTAL, te, ev, ce)
    stop = StopSignal(True)
    session = Session(ticks, deferred, signal_step, stop)
    if monkeypatch is not None:
        monkeypatch.setattr(CheckpointClock, "asks", lambda clock, rank: asked(session.tick))
    files = RunFiles(Config(), Path("run"), "id", None, 0.0)
    summary, _ = _loop(session, files, SimpleNamespace(rank=0, barrier=lambda label: None), None, stop,
                       ThreadChoice(1, "test"), False, contextlib.ExitStack())
    return summary, session


@pytest.mark.parametrize("deferred", [True, False], ids=["data-parallel rows", "pipeline rows"])
def test_the_loop_stops_within_two_rows_at_a_checkpoint(deferred):
    stopped = 0
    grid = list(product((0, 1, 2, 3, 4, 8, 16), (1, 2, 3, 4, 8, 16), (0, 5), range(1, TOTAL + 1)))
    for ce, te, ev, signal_step in grid:
        summary, session = run_loop(ce, te, ev, signal_step, deferred)
        ticks = Ticks(TOTAL, te, ev, ce)
        case = f"ce {ce}, te {te}, eval_every {ev}, signal in step {signal_step}"
        # the rows that go out with the flag, and where the first of them is finished: at
        # once, at a checkpoint tick, or with the next row (at most two rows after the signal)
        carried = [t for t in range(signal_step, 3 * TOTAL) if ticks.row_due(t)]
        finished = carried[0]
        if deferred:
            while not (ce and finished % ce == 0) and not (finished > carried[0] and ticks.row_due(finished)):
                finished += 1
        assert finished <= carried[1], case
        due = [t for t in range(1, TOTAL + 1) if ticks.checkpoint_due(t)]
        assert session.in_flight_at_saves == [0] * len(session.saves), case  # rows finished first
        if finished < TOTAL:
            assert summary.stopped == "SIGTERM" and summary.final is None, case
            assert session.tick == finished, case
            assert session.saves == [t for t in due if t < finished] + [finished], case
            stopped += 1
        else:  # the run ends first, as usual
            assert not summary.stopped and summary.final == "evaluated", case
            assert session.tick == TOTAL and session.saves == due, case
    assert stopped > len(grid) // 2


@pytest.mark.parametrize("deferred", [True, False], ids=["data-parallel rows", "pipeline rows"])
def test_a_row_asking_for_a_checkpoint_gets_one_where_it_is_finished(deferred, monkeypatch):
    never = TOTAL + 1  # no signal
    for ce, te, ev, ask in product((0, 3, 8), (1, 3, 4), (0, 5), range(1, TOTAL + 1)):
        summary, session = run_loop(ce, te, ev, never, deferred, monkeypatch, {ask}.__contains__)
        ticks = Ticks(TOTAL, te, ev, ce)
        case = f"ce {ce}, te {te}, eval_every {ev}, asked at {ask}"
        due = [t for t in range(1, TOTAL + 1) if ticks.checkpoint_due(t)]
        finished = ask  # a row is only made at a row tick, and only it carries the ask
        if deferred:  # finished with the next row, or at a checkpoint (its own tick's too)
            while not ticks.checkpoint_due(finished) and not (finished > ask and ticks.row_due(finished)):
                finished += 1
        want = sorted({*due, finished}) if ticks.row_due(ask) else due
        assert not summary.stopped and summary.final == "evaluated", case
        assert session.saves == want, case
        assert session.in_flight_at_saves == [0] * len(session.saves), case


@pytest.mark.parametrize("deferred", [True, False], ids=["data-parallel rows", "pipeline rows"])
def test_asking_for_checkpoints_never_delays_a_stop(deferred, monkeypatch):
    """Every row asks (the mark beside the signal in one value): the run stops with the same
    signal, no later than without asking (a checkpoint finishes the rows in flight, so a signal
    in them is seen there, as at a checkpoint_every tick), and checkpoints at every finished row."""
    for ce, te, signal_step in product((0, 4), (1, 3, 4), range(1, TOTAL + 1)):
        plain, plain_session = run_loop(ce, te, 0, signal_step, deferred)
        summary, session = run_loop(ce, te, 0, signal_step, deferred, monkeypatch, lambda t: True)
        monkeypatch.undo()
        case = f"ce {ce}, te {te}, signal in step {signal_step}"
        carried = next(t for t in range(signal_step, 3 * TOTAL) if t % te == 0)  # its row
        assert (summary.stopped, summary.final) == (plain.stopped, plain.final), case
        assert min(carried, TOTAL) <= session.tick <= plain_session.tick, case
        assert set(plain_session.saves) - {plain_session.tick} <= set(session.saves), case
        assert session.saves[-1] == session.tick, case
        assert session.in_flight_at_saves == [0] * len(session.saves), case


def test_a_stop_value_carries_the_signal_and_the_ask_without_changing_the_signal():
    assert read_stop(np.array([0.0, 0.0])) == (0, False)
    assert read_stop(np.array([stop_value(0, True)])) == (0, True)  # one rank
    assert read_stop(np.array([stop_value(0, True), stop_value(15, False)])) == (15, True)
    assert read_stop(np.array([stop_value(2, True), stop_value(15, False)])) == (15, True)
    assert read_stop(np.array([stop_value(15, False), stop_value(2, False)])) == (15, False)


def test_only_rank_0s_clock_asks_once_its_period_has_passed():
    late = CheckpointClock(60.0)
    late.since -= 61.0  # started 61 s ago
    assert late.asks(0) and not late.asks(1)
    late.restart()
    assert not late.asks(0)
    assert not CheckpointClock(0.0, since=-1e9).asks(0)  # 0: off
