"""Time limits of the subprocesses the suite launches, scaled by one environment variable.

``HPCOPT_TEST_TIMEOUT_SCALE`` (default 1) multiplies every limit: set it above 1 on a slow or
heavily loaded machine. The limits are only there so that a hang fails instead of blocking the
suite; the defaults hold on a 2-core machine at a load average of about 8.
"""

from __future__ import annotations

import os

SCALE_VARIABLE = "HPCOPT_TEST_TIMEOUT_SCALE"


def scale() -> float:
    """The factor ``HPCOPT_TEST_TIMEOUT_SCALE`` sets (1 when unset)."""
    text = os.environ.get(SCALE_VARIABLE, "").strip()
    try:
        value = float(text) if text else 1.0
    except ValueError:
        raise ValueError(f"{SCALE_VARIABLE} must be a number, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"{SCALE_VARIABLE} must be > 0, got {text!r}")
    return value


def scaled(seconds: float) -> float:
    """``seconds`` times the scale factor."""
    return seconds * scale()
