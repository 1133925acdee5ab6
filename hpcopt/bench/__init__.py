"""``hpcopt bench {allreduce,p2p,scaling}``: benchmarks that ship with the package.

``allreduce`` and ``p2p`` run under ``mpiexec`` (every rank takes part, rank 0 prints);
``scaling`` is started as one process and launches ``mpiexec`` itself, once per configuration.
The repository's ``benchmarks/speed/p2p.py`` and ``scaling.py`` are thin wrappers around these.
"""

from __future__ import annotations

from collections.abc import Sequence

KINDS = ("allreduce", "p2p", "scaling")


def run_bench(kind: str, argv: Sequence[str]) -> int:
    """Run benchmark ``kind`` with its own command-line options ``argv``."""
    if kind == "allreduce":
        from .allreduce import main
    elif kind == "p2p":
        from .p2p import main
    else:
        from .scaling import main
    return main(list(argv))
