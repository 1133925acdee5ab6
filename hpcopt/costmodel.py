"""Alpha-beta network cost model: what a run's communication would cost on another network.

A message of n bytes between two ranks costs ``alpha + n * beta`` (latency alpha in seconds,
inverse bandwidth beta in seconds per byte). Allreduce of n bytes over p ranks:

- ring (reduce-scatter + allgather): ``2 (p-1) alpha + 2 (p-1)/p * n * beta``
- tree (recursive doubling):         ``ceil(log2 p) * (alpha + n * beta)``
- auto: the cheaper of the two (what MPI libraries choose between, roughly by size)

References: Thakur, Rabenseifner, Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 2005; Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms", JPDC 2009.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from .errors import UserError

ALGORITHMS = ("ring", "tree", "auto")


@dataclass(frozen=True)
class NetworkProfile:
    """Latency ``alpha`` (s) and inverse bandwidth ``beta`` (s/byte) of one link."""

    name: str
    alpha: float
    beta: float

    def __post_init__(self) -> None:
        if not (self.alpha >= 0 and self.beta >= 0 and math.isfinite(self.alpha + self.beta)):
            raise UserError(f"network profile {self.name!r} needs alpha >= 0 and beta >= 0")

    @property
    def bandwidth(self) -> float:
        """Bytes per second (inf when beta = 0)."""
        return 1 / self.beta if self.beta else math.inf

    def p2p(self, nbytes: float) -> float:
        return self.alpha + nbytes * self.beta

    def allreduce(self, nbytes: float, ranks: int, algorithm: str = "auto") -> float:
        """Modelled seconds for one allreduce of ``nbytes`` over ``ranks`` ranks."""
        if ranks <= 1:
            return 0.0
        if algorithm == "ring":
            return 2 * (ranks - 1) * self.alpha + 2 * (ranks - 1) / ranks * nbytes * self.beta
        if algorithm == "tree":
            return math.ceil(math.log2(ranks)) * (self.alpha + nbytes * self.beta)
        if algorithm == "auto":
            return min(self.allreduce(nbytes, ranks, "ring"), self.allreduce(nbytes, ranks, "tree"))
        raise UserError(f"unknown allreduce algorithm {algorithm!r} (choose from {', '.join(ALGORITHMS)})")


#: Named profiles. ``shm`` was fitted to benchmarks/allreduce.py on the 2-core development
#: machine (MPICH 5.0.2 shared memory); the network ones are nominal link figures.
PROFILES = {
    "shm": NetworkProfile("shm", alpha=2.0e-6, beta=1 / 8.0e9),
    "ib100": NetworkProfile("ib100", alpha=1.5e-6, beta=1 / 12.5e9),   # 100 Gb/s InfiniBand
    "eth10": NetworkProfile("eth10", alpha=30e-6, beta=1 / 1.25e9),    # 10 Gb/s Ethernet
    "eth1": NetworkProfile("eth1", alpha=50e-6, beta=1 / 0.125e9),     # 1 Gb/s Ethernet
}


def get_profile(spec: str) -> NetworkProfile:
    """A named profile, or user values ``alpha=2e-6,bandwidth=5e9`` (or ``beta=...``)."""
    if spec in PROFILES:
        return PROFILES[spec]
    if "=" not in spec:
        raise UserError(f"unknown network profile {spec!r} (named: {', '.join(PROFILES)}; "
                        "or give alpha=SECONDS,bandwidth=BYTES_PER_SECOND)")
    values: dict[str, float] = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise UserError(f"network profile value {item!r} is not a number") from None
    unknown = set(values) - {"alpha", "beta", "bandwidth"}
    if unknown or "alpha" not in values or ("beta" in values) == ("bandwidth" in values):
        raise UserError("a custom network profile needs alpha and exactly one of beta, bandwidth")
    beta = values["beta"] if "beta" in values else 1 / values["bandwidth"]
    return NetworkProfile("custom", values["alpha"], beta)


def fit_allreduce(sizes: Iterable[float], seconds: Iterable[float], ranks: int,
                  name: str = "fitted") -> NetworkProfile:
    """Least-squares alpha and beta from measured allreduce times (ring form, relative errors).

    Each measurement is weighted by 1/time so small and large messages count alike.
    """
    n = np.asarray(list(sizes), dtype=float)
    t = np.asarray(list(seconds), dtype=float)
    if ranks < 2 or n.size < 2 or n.size != t.size or np.any(t <= 0):
        raise UserError("fitting needs >= 2 ranks and >= 2 positive (size, time) measurements")
    design = np.column_stack([np.full_like(n, 2 * (ranks - 1)), 2 * (ranks - 1) / ranks * n])
    weights = 1 / t
    coef, *_ = np.linalg.lstsq(design * weights[:, None], t * weights, rcond=None)
    alpha, beta = (max(0.0, float(c)) for c in coef)
    return NetworkProfile(name, alpha, beta)


def predict_allreduce_seconds(calls: int, nbytes: int, ranks: int, profile: NetworkProfile,
                              algorithm: str = "auto") -> float:
    """Modelled time of ``calls`` allreduces that moved ``nbytes`` in total (equal sizes)."""
    if calls == 0:
        return 0.0
    return calls * profile.allreduce(nbytes / calls, ranks, algorithm)
