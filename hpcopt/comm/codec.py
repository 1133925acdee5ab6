"""The wire's codec: what a message of n values is sent as (Q), and what it arrives as (D).

Q and D per wire type (``WIRES``; bytes a rank sends for n values)::

    float32   the float32 cast                                                        4 n
    bfloat16  the bfloat16 cast (round to nearest even, as ml-dtypes casts), D the
              cast back to float32                                                    2 n
    float16   the float16 cast                                                        2 n
    int8      per row of ``INT8_ROW`` values: s = max|m| / 127 (float32),
              q = rint(m / s) in [-127, 127], D = q s               n + 4 ceil(n / 256)

A message is cast to float32 first (a float64 message: float16 rounds its float32 value). The
bytes sent are the n codes in order, then for int8 the ceil(n / 256) row scales (float32).

Encoding and decoding cost less than the bytes they save. A ``Codec`` serves one wire, one
message size and one array module (NumPy or CuPy: ``hpcopt.backend.array_module``); it keeps
its buffers and reuses them round after round, and every operation writes into one of them
(``out=``), so a round allocates nothing the size of the message. On NumPy it runs block by
block (``BLOCK`` values, a multiple of ``INT8_ROW``): a block's scratch stays in the core's cache
from one operation to the next, and main memory sees the message read once, the payload and the
error written once (docs/design.md, "Passes over the parameters"). The results are bit for bit
those of the whole-vector casts (tests/unit/test_codec.py):

- bfloat16 by integer operations on the float32 bits u (Eigen's ``float_to_bfloat16_rtne``, the
  cast ml-dtypes runs): b = (u + 0x7FFF + ((u >> 16) & 1)) >> 16, a NaN as 0x7FC0 with its sign
  (looked for by one max per block, set only where there is one); D(b) = b << 16, which is
  u + the bias with its lower half cleared;
- int8: |m| and one max per row give the scales, the quotient and rint run in place, and where
  every scale of the block is 0 or a normal float32 the clip is left out (|m / s| <= 127 (1 +
  2^-23) rounds to at most 127, and no quotient is NaN): the codes are cast straight into the
  payload and D is the rounded quotient (its -0 made +0, as the int8 code's float) times the
  scale; a block with a subnormal, infinite or NaN scale takes the clip and D from the codes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import lru_cache
from types import ModuleType
from typing import Any

import numpy as np

from ..backend import array_module

Array = Any

WIRES = ("float32", "bfloat16", "float16", "int8")
#: Values per int8 row (one float32 scale each).
INT8_ROW = 256
#: Values per block of a NumPy codec: a block of its scratch (1 MB in float32) stays in the cache.
BLOCK = 1 << 18
#: The bits of bfloat16's NaN (a NaN keeps its sign).
BF16_NAN = 0x7FC0
FLOAT32_TINY, FLOAT32_MAX = np.finfo(np.float32).tiny, np.finfo(np.float32).max


def message_bytes(wire: str, n: int) -> int:
    """Bytes a rank sends for a message of ``n`` values."""
    if wire == "int8":
        return n + 4 * math.ceil(n / INT8_ROW)
    return n * (4 if wire == "float32" else 2)


class Codec:
    """Q and D of ``wire`` for messages of ``size`` values in arrays of ``xp``, in buffers kept
    across calls (module docstring). ``payload`` holds the bytes of the last ``encode_``."""

    def __init__(self, wire: str, size: int, xp: ModuleType = np) -> None:
        if wire not in WIRES:
            raise ValueError(f"no codec for wire {wire!r} (the codec's wires: {', '.join(WIRES)})")
        self.wire, self.size, self.xp = wire, size, xp
        self.block = max(1, min(size, BLOCK) if xp is np else size)
        rows = math.ceil(self.block / INT8_ROW) if wire == "int8" else 0
        self.payload = xp.zeros(message_bytes(wire, size), dtype=xp.uint8)
        self._work = xp.zeros(max(self.block, rows * INT8_ROW), dtype=xp.float32)
        self._cast: Array | None = None  # a block cast to float32, made for the first message not in it
        if wire == "int8":
            self._scales = xp.zeros(math.ceil(size / INT8_ROW), dtype=xp.float32)
            self._codes = xp.zeros(rows * INT8_ROW, dtype=xp.int8)
            self._divisors = xp.zeros(rows, dtype=xp.float32)
            self._usual = xp.zeros(rows, dtype=bool)

    # -- the public passes -------------------------------------------------------------------

    def encode_(self, message: Array, error: Array) -> Array:
        """``payload`` <- Q(message) (a flat message of ``size`` values, any float dtype), and
        ``error`` <- message - D(payload) (error feedback); returns ``payload``, valid until this
        codec's next ``encode_``."""
        for part, decoded in self._encoded(message):
            self.xp.subtract(message[part], decoded, out=error[part])
        return self.payload

    def encode(self, message: Array) -> tuple[Array, Array]:
        """(the bytes sent, D(Q(message)) in float32) of a flat message, as new arrays."""
        decoded = self.xp.empty(self.size, dtype=self.xp.float32)
        for part, block in self._encoded(message):
            decoded[part] = block
        return self.payload.copy(), decoded

    def decode_(self, payload: Array, out: Array) -> Array:
        """``out`` (float32, ``size`` values) <- D of the bytes ``encode_`` sent; returns ``out``."""
        for part, decoded in self._decoded(payload):
            out[part] = decoded
        return out

    def add_decoded_(self, payload: Array, total: Array) -> Array:
        """``total`` (float32) += D of the bytes ``encode_`` sent; returns ``total``."""
        for part, decoded in self._decoded(payload):
            self.xp.add(total[part], decoded, out=total[part])
        return total

    # -- per block -------------------------------------------------------------------------

    def _blocks(self) -> Iterator[slice]:
        return (slice(start, min(start + self.block, self.size))
                for start in range(0, self.size, self.block))

    def _encoded(self, message: Array) -> Iterator[tuple[slice, Array]]:
        """(the block, its D(Q) in float32: scratch) for each block of ``message``, its codes
        written into ``payload`` (then the int8 scales)."""
        quantize: Callable[[slice, Array], Array] = getattr(self, "_q_" + self.wire)
        for part in self._blocks():
            yield part, quantize(part, message[part])
        if self.wire == "int8":
            self.payload[self.size:] = self._scales.view(self.xp.uint8)

    def _decoded(self, payload: Array) -> Iterator[tuple[slice, Array]]:
        if self.wire == "int8":
            self._scales.view(self.xp.uint8)[...] = payload[self.size:]
        dequantize: Callable[[slice, Array], Array] = getattr(self, "_d_" + self.wire)
        for part in self._blocks():
            yield part, dequantize(part, payload)

    def _float32(self, values: Array) -> Array:
        """The block ``values`` in float32: itself, or its cast into the scratch."""
        if values.dtype == self.xp.float32 and values.flags.c_contiguous:
            return values
        if self._cast is None:
            self._cast = self.xp.empty(self._work.size, dtype=self.xp.float32)
        cast = self._cast[:values.size]
        self.xp.copyto(cast, values, casting="unsafe")
        return cast

    def _q_float32(self, part: slice, values: Array) -> Array:
        codes = self.payload.view(self.xp.float32)[part]
        self.xp.copyto(codes, values, casting="unsafe")
        return codes

    def _d_float32(self, part: slice, payload: Array) -> Array:
        return payload.view(self.xp.float32)[part]

    def _q_float16(self, part: slice, values: Array) -> Array:
        xp, work = self.xp, self._work[:values.size]
        codes = self.payload.view(xp.float16)[part]
        xp.copyto(codes, self._float32(values), casting="unsafe")
        xp.copyto(work, codes)
        return work

    def _d_float16(self, part: slice, payload: Array) -> Array:
        work = self._work[:part.stop - part.start]
        self.xp.copyto(work, payload.view(self.xp.float16)[part])
        return work

    def _q_bfloat16(self, part: slice, values: Array) -> Array:
        """u + 0x7FFF + ((u >> 16) & 1) in the scratch, its upper half the codes, its lower half
        cleared D."""
        xp = self.xp
        floats = self._float32(values)
        bits, sums = floats.view(xp.uint32), self._work[:values.size].view(xp.uint32)
        codes = self.payload.view(xp.uint16)[part]
        xp.right_shift(bits, 16, out=sums)
        xp.bitwise_and(sums, 1, out=sums)
        xp.add(sums, bits, out=sums)
        xp.add(sums, 0x7FFF, out=sums)
        xp.right_shift(sums, 16, out=codes, casting="unsafe")
        xp.bitwise_and(sums, 0xFFFF0000, out=sums)
        if bool(xp.isnan(xp.max(floats))):  # NaN: 0x7FC0 with its sign
            where = xp.isnan(floats)
            codes[where] = xp.bitwise_or(xp.signbit(floats[where]).astype(xp.uint16) << 15, BF16_NAN)
            sums[where] = codes[where].astype(xp.uint32) << 16
        return sums.view(xp.float32)

    def _d_bfloat16(self, part: slice, payload: Array) -> Array:
        xp = self.xp
        sums = self._work[:part.stop - part.start].view(xp.uint32)
        xp.left_shift(payload.view(xp.uint16)[part], 16, out=sums, dtype=xp.uint32)
        return sums.view(xp.float32)

    def _q_int8(self, part: slice, values: Array) -> Array:
        """The block's row scales, codes and D; its rows padded with zeros in the scratch."""
        xp, n = self.xp, values.size
        rows = math.ceil(n / INT8_ROW)
        work, floats = self._work[:rows * INT8_ROW], self._float32(values)
        grid = work.reshape(rows, INT8_ROW)
        scales = self._scales[part.start // INT8_ROW:][:rows]
        divisors, usual = self._divisors[:rows], self._usual[:rows]
        xp.abs(floats, out=work[:n])
        work[n:] = 0
        xp.max(grid, axis=1, out=scales)
        xp.divide(scales, xp.float32(127), out=scales)
        xp.greater(scales, 0, out=usual)
        divisors[...] = 1
        xp.copyto(divisors, scales, where=usual)  # s, or 1 where s is not > 0
        if n == work.size:
            xp.divide(floats.reshape(rows, INT8_ROW), divisors[:, None], out=grid)
        else:
            xp.copyto(work[:n], floats)
            xp.divide(grid, divisors[:, None], out=grid)
        xp.rint(work, out=work)
        codes = self.payload[part].view(xp.int8)
        if self._usual_scales(scales, usual):  # no quotient beyond +-127.5, none NaN: no clip
            xp.add(work, 0, out=work)  # -0 -> +0: the float of the int8 code
            xp.copyto(codes, work[:n], casting="unsafe")
            xp.multiply(grid, scales[:, None], out=grid)
            return work[:n]
        xp.clip(work, -127, 127, out=work)
        padded = self._codes[:rows * INT8_ROW]
        xp.copyto(padded, work, casting="unsafe")
        codes[...] = padded[:n]
        xp.multiply(padded.reshape(rows, INT8_ROW), scales[:, None], out=grid)
        return work[:n]

    def _usual_scales(self, scales: Array, usual: Array) -> bool:
        """Whether every scale is 0 or a normal float32 (not subnormal, infinite or NaN): then
        |m / s| <= 127 (1 + 2^-23) rounds to at most 127 and no quotient is NaN. ``usual`` is
        scratch."""
        xp = self.xp
        xp.less_equal(scales, FLOAT32_MAX, out=usual)
        xp.logical_and(usual, scales >= FLOAT32_TINY, out=usual)
        xp.logical_or(usual, scales == 0, out=usual)
        return bool(xp.all(usual))

    def _d_int8(self, part: slice, payload: Array) -> Array:
        xp, n = self.xp, part.stop - part.start
        rows = math.ceil(n / INT8_ROW)
        work, codes = self._work[:rows * INT8_ROW], payload[part].view(xp.int8)
        if n != work.size:
            padded = self._codes[:rows * INT8_ROW]
            padded[:n] = codes
            padded[n:] = 0
            codes = padded
        scales = self._scales[part.start // INT8_ROW:][:rows]
        xp.multiply(codes.reshape(rows, INT8_ROW), scales[:, None], out=work.reshape(rows, INT8_ROW))
        return work[:n]


@lru_cache(maxsize=16)
def codec_for(wire: str, size: int, xp: ModuleType = np) -> Codec:
    """The codec of ``wire`` for ``size`` values in ``xp``'s arrays, made once and kept (the 16
    last used: a run's whole-model and fragment or chunk sizes)."""
    return Codec(wire, size, xp)


def encode(message: Array, wire: str) -> tuple[Array, Array]:
    """(the bytes sent, D(Q(message)) in float32) of a flat message, as new arrays."""
    return codec_for(wire, message.size, array_module(message)).encode(message)


def decode(payload: Array, wire: str, n: int) -> Array:
    """D of the bytes ``encode`` sent for ``n`` values, in float32, as a new array."""
    xp = array_module(payload)
    return codec_for(wire, n, xp).decode_(payload, xp.empty(n, dtype=xp.float32))
