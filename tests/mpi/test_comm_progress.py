"""``--comm-progress`` (hpcopt/comm/progress.py) under MPI at any world size, in-process: the
communication thread posts the same reductions, so a run moved on by it has the bits of one
moved on inside MPI calls (a whole-model round in flight under the delayed rule, and three
fragments in flight at once); it counts each reduction's own seconds and the trace carries the
fraction hidden; a checkpoint written and read back at every tick under it changes no bit;
MPICH's progress thread is refused once MPI started without it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpcopt import train
from hpcopt.comm import OWN
from hpcopt.errors import HpcoptError
from hpcopt.io.trace import read_trace
from tests.mpi.test_optimizers import run_in_process, small_config, state_arrays
from tests.mpi.test_streaming import CASES, DELAYED

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("case", [DELAYED, 2])
def test_the_communication_thread_changes_no_bit(comm, case):
    _, moved = train(small_config(**CASES[case], comm_progress="comm-thread"), comm, verbose=False)
    assert comm.comm_thread is None  # the run's own, ended with it
    counters = dict(comm.stats.counters)
    comm.stats.reset()
    _, plain = train(small_config(**CASES[case]), comm, verbose=False)
    expected, got = state_arrays(plain), state_arrays(moved)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    own, held = counters[(OWN, "fragments")], counters[("iallreduce", "fragments")]
    assert (own.calls, own.bytes) == (0, 0) and own.seconds > 0 and held.calls > 0
    assert (OWN, "fragments") not in comm.stats.counters  # MPI's own progress measures none


def test_a_checkpoint_at_every_tick_under_the_thread_changes_no_bit(comm, shared_dir):
    config = small_config(**{**CASES[DELAYED], "steps": 9})
    comm.start_comm_thread()
    try:
        state, ticks = run_in_process(config, comm, shared_dir)
    finally:
        comm.stop_comm_thread()
    plain, _ = run_in_process(config, comm)
    assert ticks == list(range(1, 10))
    expected, got = state_arrays(plain), state_arrays(state)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_the_trace_records_the_fraction_hidden(comm, shared_dir):
    out = shared_dir / "run"
    train(small_config(**CASES[DELAYED], comm_progress="comm-thread", out=str(out), trace_every=2),
          comm, verbose=False)
    if comm.rank == 0:
        trace = read_trace(out / "trace.h5")
        assert trace.attrs["comm_progress"] == "comm-thread"
        hidden = trace.columns["hidden_fraction"]
        assert all(math.isnan(h) for h in hidden[:3])  # steps 2, 4, 6: the first round lands at 7
        assert all(0 <= h <= 1 for h in hidden[3:])
    comm.stats.reset()
    plain = shared_dir / "plain"
    train(small_config(**CASES[DELAYED], out=str(plain)), comm, verbose=False)
    if comm.rank == 0:
        assert "hidden_fraction" not in read_trace(plain / "trace.h5").columns


def test_mpich_thread_is_refused_once_mpi_started_without_it(comm, monkeypatch):
    monkeypatch.delenv("MPIR_CVAR_ASYNC_PROGRESS", raising=False)
    with pytest.raises(HpcoptError) as error:
        train(small_config(overlap=1, comm_progress="mpich-thread"), comm, verbose=False)
    assert "MPI started without its progress thread" in str(error.value) or "needs MPICH" in str(error.value)
