"""The wire's codec (hpcopt/comm/codec.py): bfloat16 by integer operations gives ml-dtypes' cast
bit for bit (every rounding case of every exponent, NaN, infinities, subnormals, a large random
sample; every code decoded), every wire's payload, D and error feedback equal the whole-vector
casts it replaces (tests/reference.py) bit for bit at sizes around its blocks and rows, on NumPy
and CuPy arrays, and a round through a codec allocates nothing the size of the message."""

from __future__ import annotations

import tracemalloc
import warnings

import ml_dtypes
import numpy as np
import pytest

from hpcopt.comm.codec import BLOCK, INT8_ROW, WIRES, Codec, codec_for, decode, encode, message_bytes
from tests.reference import whole_vector_decode, whole_vector_encode

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-40, -3e-39,
                     1.1754942e-38, 3.4028235e38, -3.4028235e38, 3.3961776e38, 65504.0, 1.0, -1.0],
                    dtype=np.float32)
SIZES = [1, 5, INT8_ROW - 1, INT8_ROW, INT8_ROW + 1, 1000, BLOCK + 1, 2 * BLOCK + 300]


def bfloat16_bits(floats: np.ndarray) -> np.ndarray:
    """ml-dtypes' bfloat16 codes of float32 values."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its cast warns on NaN
        return floats.astype(ml_dtypes.bfloat16).view(np.uint16)


def rounding_cases() -> np.ndarray:
    """Every upper half (sign, exponent, 7 mantissa bits: NaN, infinities, subnormals, zeros)
    with the lower halves that decide a rounding: 0, 1, just below, at and above the half, all
    ones; then 2**22 random bit patterns."""
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    lower = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    edges = (upper[:, None] | lower[None, :]).reshape(-1)
    sample = np.random.default_rng(0).integers(0, 1 << 32, 1 << 22, dtype=np.uint32)
    return np.concatenate([edges, sample]).view(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bfloat16_by_integer_operations_is_ml_dtypes_cast_bit_for_bit(dtype):
    floats = rounding_cases()
    codec = Codec("bfloat16", floats.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN cast to float32, inf - inf
        message = floats.astype(dtype)
        error = np.empty_like(message)
        payload = codec.encode_(message, error)
    expected = bfloat16_bits(floats)
    np.testing.assert_array_equal(payload.view(np.uint16), expected)
    subnormal = (floats != 0) & (np.abs(floats) < np.finfo(np.float32).tiny)
    assert np.isnan(floats).sum() > 1000 and np.isinf(floats).sum() == 2 and subnormal.sum() > 1000
    decoded = (expected.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(error.view(np.uint8), (message - decoded).view(np.uint8))


def test_every_bfloat16_code_decodes_as_ml_dtypes_casts_it():
    codes = np.arange(1 << 16, dtype=np.uint16)
    decoded = Codec("bfloat16", codes.size).decode_(codes.view(np.uint8), np.empty(codes.size, np.float32))
    expected = codes.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(decoded.view(np.uint32), expected.view(np.uint32))


def messages(n: int, dtype) -> list[np.ndarray]:
    """Normal values over 60 orders of magnitude, the same with special values strewn in, zeros
    of both signs, subnormal rows."""
    rng = np.random.default_rng(n)
    wide = (rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))).astype(np.float32)
    strewn = wide.copy()
    where = rng.integers(0, n, max(1, n // 50))
    strewn[where] = rng.choice(SPECIALS, where.size)
    signed_zeros = np.where(rng.random(n) < 0.5, np.float32(0), np.float32(-0.0))
    subnormal = (rng.standard_normal(n) * 1e-39).astype(np.float32)
    return [m.astype(dtype) for m in (wide, strewn, signed_zeros, subnormal)]


def host(array, xp) -> np.ndarray:
    return array if xp is np else xp.asnumpy(array)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_wire_gives_the_bits_of_the_whole_vector_casts(xp, wire, dtype):
    """Payload, D and the error e = m - D(Q(m)) of ``encode_``, and D of ``decode_``,
    ``add_decoded_`` and the functions ``encode`` / ``decode``, against tests/reference.py."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference's casts of NaN and infinities
        for n in SIZES:
            codec = codec_for(wire, n, xp)
            for message in messages(n, dtype):
                payload, decoded = whole_vector_encode(message, wire)
                device = xp.asarray(message)
                error = xp.empty_like(device)
                sent = codec.encode_(device, error)
                np.testing.assert_array_equal(host(sent, xp), payload, err_msg=f"{wire} {n}")
                np.testing.assert_array_equal(host(error, xp).view(np.uint8),
                                              (message - decoded).view(np.uint8))
                got_payload, got_decoded = encode(device, wire)
                np.testing.assert_array_equal(host(got_payload, xp), payload)
                np.testing.assert_array_equal(host(got_decoded, xp).view(np.uint32), decoded.view(np.uint32))
                arrived = whole_vector_decode(payload, wire, n)
                np.testing.assert_array_equal(host(decode(xp.asarray(payload), wire, n), xp).view(np.uint32),
                                              arrived.view(np.uint32))
                total = np.full(n, 0.5, dtype=np.float32)
                summed = host(codec.add_decoded_(xp.asarray(payload), xp.array(total)), xp)
                np.testing.assert_array_equal(summed.view(np.uint32), (total + arrived).view(np.uint32))


@pytest.mark.parametrize("wire", WIRES)
def test_a_round_through_a_codec_allocates_nothing_the_size_of_the_message(wire):
    """After its first use a codec's encode_ and add_decoded_ of a float64 message of 2,000,000
    values (16 MB) allocate less than 256 KB (NumPy's buffers for a cast inside an operation; the
    whole-vector casts made several copies of the message), and its payload is the same buffer
    round after round."""
    n = 2_000_000
    message = np.random.default_rng(1).standard_normal(n)
    error, total = np.zeros(n), np.zeros(n, dtype=np.float32)
    codec = codec_for(wire, n)
    first = codec.encode_(message, error)
    codec.add_decoded_(first, total)
    tracemalloc.start()
    try:
        for _ in range(3):
            payload = codec.encode_(message, error)
            codec.add_decoded_(payload, total)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 << 10, peak
    assert payload is first and payload.size == message_bytes(wire, n) and codec_for(wire, n) is codec
