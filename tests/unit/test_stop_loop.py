"""The runner's loop stops within two trace rows of a signal, with a checkpoint at the stop
tick and no row in flight, for every checkpoint_every, trace_every and eval_every and every
tick the signal can land in: the loop driven through a session whose rows behave like the
data-parallel window's (a row's reduction finishes at the next row, or when a checkpoint
finishes the rows in flight) or the pipeline's (finished at once). tests/mpi/test_stop_signals.py
runs the real sessions on every rank."""

from __future__ import annotations

import signal
from itertools import product
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcopt.config import Config
from hpcopt.io.trace import Row, WindowStats
from hpcopt.run.runner import RunFiles, Ticks, _loop
from hpcopt.run.signals import StopSignal
from hpcopt.run.threads import ThreadChoice

TOTAL = 40


class Session:
    """The runner's ``Session`` with nothing but ticks, rows and checkpoints; the signal lands
    in step ``signal_step`` (before the row of that tick)."""

    def __init__(self, ticks: Ticks, deferred: bool, signal_step: int, stop: StopSignal) -> None:
        self.ticks, self.deferred, self.signal_step, self.stop = ticks, deferred, signal_step, stop
        self.tick = 0
        self.posted: list[tuple[Row, int]] = []
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

    def row(self, tick: int, evaluation, stop: int) -> list[Row]:
        finished = self.finish_rows()
        self.posted.append((Row(tick, {}, {}), stop))
        return finished + ([] if self.deferred else self.finish_rows())

    def finish_rows(self) -> list[Row]:
        for row, stop in self.posted:
            row.stats = WindowStats(1.0, 1.0, 1.0, 1.0, stop)
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


def run_loop(ce: int, te: int, ev: int, signal_step: int, deferred: bool):
    ticks = Ticks(TOTAL, te, ev, ce)
    stop = StopSignal(True)
    session = Session(ticks, deferred, signal_step, stop)
    files = RunFiles(Config(), Path("run"), "id", None, 0.0)
    summary, _ = _loop(session, files, SimpleNamespace(rank=0, barrier=lambda label: None), None, stop,
                       ThreadChoice(1, "test"), False)
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
