"""Numbers stored in tests/data by a run on another machine, and what of them is portable.

A float result depends on the machine's arithmetic as well as on hpcopt: OpenBLAS picks its
kernels by CPU (``OPENBLAS_CORETYPE`` overrides the choice) and numpy its SIMD loops
(``NPY_DISABLE_CPU_FEATURES`` turns some off), and kernels that sum in another order round
differently. A model stored after a few steps on one CPU differs from the same run on another
in its last bits: measured after 4 to 10 steps of the runs of tests/data, on every core type
of numpy's bundled OpenBLAS an AVX-512 CPU runs (Prescott, Nehalem, Sandybridge, Haswell,
SkylakeX) and without numpy's AVX-512 and AVX2 loops, by at most 2 ulp of the vector's largest
entry. So a test compares stored numbers to a few ulp of that scale (``assert_near_stored``),
and holds the bitwise promise between two paths it computes on the machine it runs on.
"""

from __future__ import annotations

import numpy as np

#: How far a recomputed vector may lie from the stored one, in ulp of its largest entry: the
#: measured 2, with room for kernels not measured here.
ULPS = 8


def assert_near_stored(actual: np.ndarray, stored: np.ndarray, name: str = "") -> None:
    """``actual`` within ULPS ulp of ``stored``'s largest magnitude, entry by entry, with its
    dtype and shape. Not ulp of each entry: an entry near 0 is a small difference of large
    terms and carries their rounding (measured: up to 512 of its own ulp)."""
    actual, stored = np.asarray(actual), np.asarray(stored)
    assert (actual.dtype, actual.shape) == (stored.dtype, stored.shape), name
    tolerance = ULPS * float(np.spacing(np.abs(stored).max()))
    worst = float(np.abs(actual.astype(np.float64) - stored.astype(np.float64)).max())
    assert worst <= tolerance, (f"{name}: {worst:.3g} off the stored values, more than {ULPS} ulp "
                                f"of their largest ({tolerance:.3g})")
