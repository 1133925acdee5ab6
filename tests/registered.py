"""What the registry holds, for tests that must not list every algorithm by name: one more
algorithm (a module dropped into hpcopt/algorithms/, an entry point, ``register``) changes
which algorithms an option applies to, and the messages that name them."""

from __future__ import annotations

from hpcopt.config import algorithm_options


def users(key: str) -> tuple[str, ...]:
    """The registered algorithms that have the ``[algorithm]`` option ``key``."""
    return algorithm_options()[key].users


def refused(key: str, algorithm: str) -> str:
    """The error for option ``key`` changed in a run of ``algorithm``, which does not have it."""
    return f"{key} applies only to --algorithm {' or '.join(users(key))}, not {algorithm}"
