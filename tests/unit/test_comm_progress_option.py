"""``--comm-progress``: the values refused, MPICH's progress thread asked for on the command line
before MPI starts (``hpcopt.run.mpi_start``), and the fraction hidden of the counters."""

from __future__ import annotations

import math
import os

import pytest

from hpcopt.comm import OWN, CommStats
from hpcopt.comm.progress import hidden_fraction
from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.run import mpi_start


def test_an_unknown_mode_is_refused():
    with pytest.raises(HpcoptError, match="comm_progress must be one of calls, mpich-thread, comm-thread"):
        build_config(None, {"dataset": "digits", "comm_progress": "thread"})


def test_the_communication_thread_is_refused_for_a_pipeline():
    with pytest.raises(HpcoptError, match="a pipeline's messages are point-to-point"):
        build_config(None, {"algorithm": "pprs", "comm_progress": "comm-thread"})


@pytest.mark.parametrize("argv, on", [
    (["train", "--comm-progress", "mpich-thread"], True),
    (["train", "--comm-progress=mpich-thread", "--steps", "4"], True),
    (["train", "--comm-progress", "comm-thread"], False),
    (["train"], False),
])
def test_the_mpich_thread_is_set_before_mpi_starts(monkeypatch, argv, on):
    monkeypatch.delenv(mpi_start._MPICH_ASYNC, raising=False)
    mpi_start.start(argv)
    assert (os.environ.get(mpi_start._MPICH_ASYNC) == "1") is on


def test_the_fraction_hidden_is_one_less_held_over_own():
    stats = CommStats()
    assert math.isnan(stats.hidden_fraction())
    stats.record_overlapped("iallreduce", "fragments", 400, held=0.1, hidden=0.5)
    stats.record_own("fragments", 0.4)
    assert stats.hidden_fraction() == pytest.approx(0.75)
    assert stats.totals("fragments").seconds == pytest.approx(0.1)  # own seconds overlap: not spent
    assert stats.totals("fragments", OWN).seconds == pytest.approx(0.4)
    assert hidden_fraction(2.0, 1.0) == 0.0 and hidden_fraction(0.0, 1.0) == 1.0
