"""Compressed averaging (hpcopt/comm/wire.py): the wire's refusals, the bytes of each message,
error feedback (what a round loses reaches the next one: nothing is lost over the rounds), and
bfloat16 without ml-dtypes (hpcopt/comm/codec.py casts by integer operations)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hpcopt.comm import Comm
from hpcopt.comm.codec import INT8_ROW, WIRES, decode, encode, message_bytes
from hpcopt.comm.wire import compressed_mean
from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from tests.registered import refused


@pytest.mark.parametrize("options, message", [
    ({"wire": "int4"}, "unknown wire 'int4' \\(choose from float32, bfloat16, float16, int8\\)"),
    ({"wire": "int8", "algorithm": "naive_clip"}, refused("wire", "naive_clip")),
    ({"wire": "int8", "device": "gpu"}, "wire applies only to --device cpu"),
])
def test_a_wire_that_cannot_be_used_is_refused(options, message):
    with pytest.raises(HpcoptError, match=message):
        build_config(None, options)


@pytest.mark.parametrize("wire", WIRES)
def test_a_message_is_sent_in_its_bytes_and_decoded_as_encoded(wire):
    rng = np.random.default_rng(0)
    for n in (1, INT8_ROW, 3 * INT8_ROW + 5):
        message = rng.standard_normal(n) * np.exp(rng.uniform(-3, 3, n))
        payload, decoded = encode(message, wire)
        assert payload.dtype == np.uint8 and payload.size == message_bytes(wire, n)
        np.testing.assert_array_equal(decode(payload, wire, n), decoded)
        relative = {"float32": 1e-7, "bfloat16": 4e-3, "float16": 1e-3, "int8": None}[wire]
        if relative:
            np.testing.assert_allclose(decoded, message, rtol=relative)
        else:  # half a step of its row's scale
            for start in range(0, n, INT8_ROW):
                row, got = message[start:start + INT8_ROW], decoded[start:start + INT8_ROW]
                assert np.max(np.abs(got - row)) <= np.max(np.abs(row)) / 254 * 1.001


@pytest.mark.parametrize("wire", ["bfloat16", "int8"])
def test_error_feedback_carries_what_a_round_loses_into_the_next(wire):
    """One rank: the means of R rounds plus the error left sum to the R messages (to float32
    rounding), where without feedback the loss grows with R."""
    comm = Comm()
    try:
        rng = np.random.default_rng(1)
        messages = [rng.standard_normal(600) for _ in range(50)]
        error, sent = np.zeros(600), np.zeros(600)
        for message in messages:
            sent += compressed_mean(message.copy(), error, wire, comm, "average")
        lost = np.abs(sum(messages) - sent - error).max()
        without = np.abs(sum(messages) - sum(encode(m, wire)[1] for m in messages)).max()
        assert lost < 1e-4 < without
        assert comm.stats.totals("average").bytes == 50 * message_bytes(wire, 600)
    finally:
        comm.free()


def test_bfloat16_is_sent_without_importing_ml_dtypes():
    code = ("import sys; import hpcopt.cli, hpcopt.build; from hpcopt.comm.codec import encode; "
            "import numpy as np; encode(np.ones(3), 'bfloat16'); print('ml_dtypes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
