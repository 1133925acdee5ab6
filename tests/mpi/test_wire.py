"""Compressed averaging (hpcopt/comm/wire.py, ``--wire``) under MPI at any world size: the
serial reference of tests/reference.py (``wire_mean``: the same casts and quantization, error
feedback, the float32 sum in rank order), a checkpoint at every tick changing no bit (the error
feedback included), and the bytes a round sends, counted, traced and modelled; Streaming
DiLoCo's fragments through a wire, each with its slice of the error feedback."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt import train
from hpcopt.comm.codec import WIRES, message_bytes
from hpcopt.comm.costmodel import comm_modelled, get_profile
from hpcopt.io.trace import read_trace
from tests.mpi.test_optimizers import DILOCO, assert_shared, run_in_process, small_config, state_arrays
from tests.reference import prsgd_reference, streaming_reference

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("overrides", [
    {"wire": "bfloat16", **DILOCO},
    {"wire": "int8", "momentum": 0.9},  # plain averaging: the models are sent
    {"wire": "float16", "outer_optimizer": "sgd", "outer_lr": 1.2, "outer_momentum": 0.5},
    # with group rounds (of 2 ranks on an even world), which are not compressed
    {"wire": "int8", "algorithm": "slowmo", "slow_momentum": 0.6, "interval": 3, "group_interval": 1,
     "group_size": "even"},
    {"wire": "float32", **DILOCO},  # an MPI sum, in its own order: to float32 rounding
])
def test_compressed_rounds_match_the_serial_reference(comm, overrides):
    if overrides.get("group_size") == "even":
        overrides = {**overrides, "group_size": 2 if comm.size % 2 == 0 else 1}
    config = small_config(**overrides)
    _, state = train(config, comm, verbose=False)
    tolerance = 1e-6 if overrides["wire"] == "float32" else 1e-10
    np.testing.assert_allclose(state.x, prsgd_reference(config, comm.size), rtol=tolerance,
                               atol=tolerance)
    assert_shared(comm, state)
    assert np.any(state.wire_error != 0)  # something was lost, and is carried to the next round


@pytest.mark.parametrize("overrides", [
    {"wire": "int8", **DILOCO, "interval": 2, "steps": 5},
    {"wire": "bfloat16", "momentum": 0.9, "interval": 2, "steps": 5},
])
def test_a_checkpoint_at_every_tick_changes_no_bit(comm, shared_dir, overrides):
    config = small_config(**overrides)
    state, ticks = run_in_process(config, comm, shared_dir)
    plain, _ = run_in_process(config, comm)
    assert ticks == list(range(1, config.run.steps + 1))
    expected, got = state_arrays(plain), state_arrays(state)
    assert "wire_error" in got and sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_a_round_sends_the_wire_bytes_and_the_trace_and_the_model_show_them(comm, shared_dir):
    """T = 8, I = 4: two rounds of d float32 parameters, 4 d bytes a round uncompressed; 2 d
    through bfloat16 and float16, d + 4 ceil(d / 256) through int8 (allgathers), 4 d through
    float32 (an allreduce)."""
    steps, interval, eth10 = 8, 4, get_profile("eth10")
    sent = {}
    for wire in ("", *WIRES):
        out = shared_dir / (wire or "plain")
        summary, state = train(small_config(steps=steps, interval=interval, dtype="float32", wire=wire,
                                            network="eth10", out=out), comm, verbose=False)
        d = state.x.size
        op = "allgather" if wire in ("bfloat16", "float16", "int8") else "allreduce"
        nbytes = message_bytes(wire, d) if wire else 4 * d
        rows = {(o, label): (calls, b) for o, label, calls, b, _ in comm.stats.as_rows()}
        assert rows[op, "average"] == (steps // interval, steps // interval * nbytes), wire
        assert summary.average_bytes_per_rank == steps // interval * nbytes
        modelled = comm_modelled(comm.stats.counters, comm.size, eth10)["average"]
        per_call = ((comm.size - 1) * eth10.p2p(nbytes) if op == "allgather"
                    else eth10.allreduce(nbytes, comm.size))
        assert modelled == pytest.approx(steps // interval * per_call, rel=1e-12)
        assert summary.modelled_per_round["average"] == pytest.approx(per_call, rel=1e-12)
        if comm.rank == 0:
            trace = read_trace(out / "trace.h5")
            assert trace.comm["average"]["bytes"][-1] == steps // interval * nbytes
            assert trace.comm["average"]["modelled"][-1] == pytest.approx(modelled, rel=1e-12)
        sent[wire] = nbytes
        comm.stats.reset()
    assert sent["bfloat16"] == sent["float16"] == sent[""] // 2 and sent["float32"] == sent[""]
    assert 3.9 < sent[""] / sent["int8"] < 4


STREAMED = [
    {**DILOCO, "wire": "int8", "fragments": 3, "interval": 6, "steps": 14},
    # plain averaging with a mix: the fragments of the models are sent
    {"wire": "bfloat16", "fragments": 2, "fragment_mix": 0.5, "momentum": 0.9, "steps": 13},
]


@pytest.mark.parametrize("overrides", STREAMED)
def test_fragments_through_a_wire_match_the_serial_reference(comm, overrides):
    """Each fragment's round through the wire when it is due (tau = 0), with its slice of the
    error feedback, then its outer step and mix; label "fragments" carries the messages."""
    config = small_config(**overrides)
    _, state = train(config, comm, verbose=False)
    np.testing.assert_allclose(state.x, streaming_reference(config, comm.size), rtol=1e-10,
                               atol=1e-10)
    assert_shared(comm, state)
    assert np.any(state.wire_error != 0)
    if comm.size > 1:
        assert comm.stats.totals("fragments", "allgather").calls > 0


def test_fragments_through_a_wire_resume_at_every_tick_without_changing_a_bit(comm, shared_dir):
    config = small_config(**{**STREAMED[0], "steps": 8})
    state, ticks = run_in_process(config, comm, shared_dir)
    plain, _ = run_in_process(config, comm)
    assert ticks == list(range(1, 9))
    expected, got = state_arrays(plain), state_arrays(state)
    assert sorted(got) == sorted(expected) and "wire_error" in got
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
