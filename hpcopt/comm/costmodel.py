"""Alpha-beta network cost model: what a run's communication would cost on another network.

A message of n bytes between two ranks costs ``alpha + n * beta`` (latency alpha in seconds,
inverse bandwidth beta in seconds per byte). Allreduce of n bytes over p ranks:

- ring (reduce-scatter + allgather): ``2 (p-1) alpha + 2 (p-1)/p * n * beta``
- tree (recursive doubling):         ``ceil(log2 p) * (alpha + n * beta)``
- auto: the cheaper of the two (what MPI libraries choose between, roughly by size); a fit
  (``fit_allreduce``) is made in the same form, so a fitted profile prices its measurements

Other operations ``Comm`` counts: broadcast (binomial tree) ``ceil(log2 p) (alpha + n beta)``;
barrier ``ceil(log2 p) alpha``; allgather of n bytes a rank (ring) ``(p-1)(alpha + n beta)``;
gather/scatter of n bytes a rank (tree) ``ceil(log2 p) alpha + (p-1) n beta``; alltoall of n
bytes a rank sends in all ``(p-1) alpha + n beta``; a send
``alpha + n beta`` (receives and waits cost nothing more: the transfer is the send's); any
other collective as an allreduce of its bytes. p is the world's size, or, for a label used on
a group's communicator (two-level averaging: "group_average"), the group's (``CommStats.ranks``).
A non-blocking allreduce (``iallreduce``: streaming fragments, hpcopt/algorithms/streaming.py)
is hidden behind the computation it overlapped only as far as MPI moves it on meanwhile: a
label's modelled seconds are ``M - min(H, f M)``, M its calls' modelled seconds, H the measured
seconds between their posts and their waits (their seconds in flight, ``in_flight``, less the
seconds the rank was held in them), summed over the label's calls, and f the fraction measured
hidden for the run's progress mode (``HIDDEN``; ``comm.core.progress_mode``): MPICH progresses
a non-blocking collective only inside MPI calls unless its progress thread, or hpcopt's
communication thread (``hpcopt.comm.progress``), runs.

Nodes (``NodeLayout``): a run whose ranks sit on several nodes is priced where its bytes went.
A call on a communicator within one node (``Comm.in_node``: the counters' in-node calls and
bytes) costs its formula on the layout's memory profile (``MEMORY``, the ``shm`` profile, unless
the network profile names one: ``memory_alpha``, ``memory_beta``) over its ranks; a
call on a communicator spanning m nodes with k of its ranks on each (m = min(nodes, p), k =
p / m) costs two levels, as MPI libraries run them: the formula over k ranks on that memory,
plus the formula over the m nodes on the network profile, where an allgather or gather moves
the k ranks' bytes of a node together (k n a node); a send costs ``alpha + n beta`` on the
network. A label whose calls K communicators carry at once through every node's link (the rails
of hpcopt/comm/wire_nodes.py: ``CommStats.rails``) moves K times its bytes across each link in
that time: its network level is priced on K n bytes (the K rails share one link). Without a
layout (a run on one node, and every run before the split was counted)
every call is priced on the network over its ranks, as if each rank had a node of its own:
how a run here is projected onto a cluster.

A run with ``--network PROFILE`` carries, per trace row and label, the modelled seconds of the
calls and bytes counted so far beside the measured ones (``comm_modelled``); ``project_wall``
turns a trace's wall clock into the one the run would have had on another network (measured
computation + modelled communication), which is how one run here projects time-to-accuracy
onto a cluster.

References: Thakur, Rabenseifner, Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 2005; Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms", JPDC 2009.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import HpcoptError
from .core import IN_FLIGHT, OWN

ALGORITHMS = ("ring", "tree", "auto")


class CallCounter(Protocol):
    """What the models read of a ``CommStats`` counter (``hpcopt.comm.OpCounter``)."""

    @property
    def calls(self) -> int: ...

    @property
    def bytes(self) -> int: ...

    @property
    def seconds(self) -> float: ...

    @property
    def in_node_calls(self) -> int: ...

    @property
    def in_node_bytes(self) -> int: ...


@dataclass(frozen=True)
class NetworkProfile:
    """Latency ``alpha`` (s) and inverse bandwidth ``beta`` (s/byte) of one link; ``memory``:
    what in-node calls cost under a ``NodeLayout`` (None: ``MEMORY``)."""

    name: str
    alpha: float
    beta: float
    memory: NetworkProfile | None = None

    def __post_init__(self) -> None:
        if not (self.alpha >= 0 and self.beta >= 0 and math.isfinite(self.alpha + self.beta)):
            raise HpcoptError(f"network profile {self.name!r} needs alpha >= 0 and beta >= 0")

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
        raise HpcoptError(f"unknown allreduce algorithm {algorithm!r} (choose from {', '.join(ALGORITHMS)})")


#: Named profiles. ``shm`` was fitted to benchmarks/speed/allreduce.py on the 2-core development
#: machine (MPICH 5.0.2 shared memory); the network ones are nominal link figures.
PROFILES = {
    "shm": NetworkProfile("shm", alpha=2.0e-6, beta=1 / 8.0e9),
    "ib100": NetworkProfile("ib100", alpha=1.5e-6, beta=1 / 12.5e9),   # 100 Gb/s InfiniBand
    "eth10": NetworkProfile("eth10", alpha=30e-6, beta=1 / 1.25e9),    # 10 Gb/s Ethernet
    "eth1": NetworkProfile("eth1", alpha=50e-6, beta=1 / 0.125e9),     # 1 Gb/s Ethernet
}


#: What in-node calls cost under a ``NodeLayout``: node-shared memory.
MEMORY = PROFILES["shm"]


@dataclass(frozen=True)
class NodeLayout:
    """A run's ranks on ``nodes`` nodes of ``per_node`` ranks (module docstring: Nodes)."""

    nodes: int
    per_node: int
    memory: NetworkProfile = MEMORY

    def spanning(self, op: str, calls: int, nbytes: float, ranks: int, network: NetworkProfile,
                 algorithm: str = "auto", rails: int = 1) -> float:
        """Modelled seconds of ``calls`` calls of ``op`` on a communicator of ``ranks`` ranks
        that spans nodes: within each node on ``memory``, across them on ``network``, where
        ``rails`` such communicators share each node's link at once."""
        if calls == 0 or op in ("send", "isend"):
            return op_seconds(op, calls, nbytes * rails, ranks, network, algorithm)
        spanned = max(1, min(self.nodes, ranks))
        local = max(1, ranks // spanned)
        gathers = op in ("allgather", "iallgather", "gather", "scatter")
        return (op_seconds(op, calls, nbytes, local, self.memory, algorithm)
                + op_seconds(op, calls, nbytes * rails * (local if gathers else 1), spanned, network,
                             algorithm))


def node_layout_of(nodes: Sequence[int], memory: NetworkProfile | None = None) -> NodeLayout | None:
    """The layout of a run whose rank r is on node ``nodes[r]`` (``comm.core.node_indices``),
    its in-node calls priced on ``memory`` (None: ``MEMORY``); None on one node. Nodes of
    unequal sizes count as nodes of the largest."""
    counts = [nodes.count(node) for node in set(nodes)]
    return NodeLayout(len(counts), max(counts), memory or MEMORY) if len(counts) > 1 else None


def get_profile(spec: str) -> NetworkProfile:
    """A named profile, or user values ``alpha=2e-6,bandwidth=5e9`` (or ``beta=...``), and
    optionally the in-node profile the same way, ``memory_alpha=..,memory_bandwidth=..`` (or
    ``memory_beta=...``; without them in-node calls cost ``MEMORY``)."""
    if spec in PROFILES:
        return PROFILES[spec]
    if "=" not in spec:
        raise HpcoptError(f"unknown network profile {spec!r} (named: {', '.join(PROFILES)}; "
                          "or give alpha=SECONDS,bandwidth=BYTES_PER_SECOND)")
    values: dict[str, float] = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise HpcoptError(f"network profile value {item!r} is not a number") from None
    keys = {"alpha", "beta", "bandwidth"}
    if set(values) - keys - {f"memory_{key}" for key in keys}:
        raise HpcoptError(f"a custom network profile takes {', '.join(sorted(keys))} and the same with "
                          f"memory_, not {spec!r}")
    memory = None
    if any(key.startswith("memory_") for key in values):
        memory = NetworkProfile("custom-memory", *_alpha_beta(values, "memory_"))
    return NetworkProfile("custom", *_alpha_beta(values, ""), memory)


def _alpha_beta(values: Mapping[str, float], prefix: str) -> tuple[float, float]:
    """alpha and beta from ``values``' PREFIXalpha and exactly one of PREFIXbeta, PREFIXbandwidth."""
    alpha, beta, bandwidth = (f"{prefix}{key}" for key in ("alpha", "beta", "bandwidth"))
    if alpha not in values or (beta in values) == (bandwidth in values):
        raise HpcoptError(f"a custom network profile needs {alpha} and exactly one of {beta}, {bandwidth}")
    return values[alpha], values[beta] if beta in values else 1 / values[bandwidth]


def profile_attrs(profile: NetworkProfile, algorithm: str = "auto",
                  layout: NodeLayout | None = None) -> dict[str, float | str]:
    """The trace attributes that name the profile a run was modelled on (and its nodes)."""
    nodes = {} if layout is None else {"network_nodes": layout.nodes, "network_per_node": layout.per_node,
                                       "network_memory_alpha": layout.memory.alpha,
                                       "network_memory_beta": layout.memory.beta}
    return {"network": profile.name, "network_alpha": profile.alpha, "network_beta": profile.beta,
            "network_allreduce": algorithm, **nodes}



def large_message_form(ranks: int, algorithm: str = "auto") -> str:
    """The formula ``NetworkProfile.allreduce`` prices large allreduces over ``ranks`` ranks with:
    ``algorithm`` itself, or under auto the one with the smaller bandwidth term (tree where
    ceil(log2 p) <= 2 (p-1)/p, that is p = 2, where its latency term is the smaller too)."""
    if algorithm != "auto":
        return algorithm
    return "tree" if math.ceil(math.log2(max(ranks, 2))) <= 2 * (ranks - 1) / ranks else "ring"


def _form_coefficients(ranks: int, form: str) -> tuple[float, float]:
    """(latency hops, bandwidth share) of a ring or tree allreduce over ``ranks`` ranks: its
    time is ``hops alpha + share n beta``."""
    if form == "tree":
        levels = float(math.ceil(math.log2(ranks)))
        return levels, levels
    return 2.0 * (ranks - 1), 2 * (ranks - 1) / ranks


def _latency(nbytes: np.ndarray, seconds: np.ndarray, beta: float, ranks: int, algorithm: str) -> float:
    """The alpha with which ``algorithm``'s price of the small sizes is their measured time (the
    median over them): under auto the price is the cheaper form's, which is the time exactly
    when alpha is the larger of the two forms' own alphas."""
    forms = ("ring", "tree") if algorithm == "auto" else (algorithm,)
    alphas = []
    for form in forms:
        hops, share = _form_coefficients(ranks, form)
        alphas.append((seconds - share * nbytes * beta) / hops)
    return max(0.0, float(np.median(np.max(alphas, axis=0))))


def fit_allreduce(sizes: Iterable[float], seconds: Iterable[float], ranks: int,
                  name: str = "fitted", bandwidth_from: float = 0.0,
                  layout: NodeLayout | None = None, algorithm: str = "auto") -> NetworkProfile:
    """Least-squares alpha and beta from measured allreduce times (relative errors), in the form
    the model prices them with (``large_message_form``: ring, or tree at 2 ranks under auto), so
    that the fitted profile gives the measured times back.

    Each measurement is weighted by 1/time so small and large messages count alike. With
    ``bandwidth_from`` (bytes), the fit uses only the sizes from there up, where transfer
    dominates and the bandwidth is pinned down well, and alpha is then set from the smaller
    sizes, so that the model's price of them is their time (``_latency``; auto prices small
    messages with the tree). A fit over large sizes alone cannot resolve the latency (it comes
    out 0 and small messages are priced far too low). With ``layout`` (allreduces over its
    nodes x per_node ranks, ``ranks`` its nodes), the network level of ``NodeLayout.spanning``:
    each time less its in-node level (the allreduce over per_node ranks on ``layout.memory``),
    which the model adds back.
    """
    n = np.asarray(list(sizes), dtype=float)
    t = np.asarray(list(seconds), dtype=float)
    if layout is not None:
        in_node = np.array([layout.memory.allreduce(size, layout.per_node, algorithm) for size in n])
        t = np.maximum(t - in_node, 1e-3 * t)
    if ranks < 2 or n.size != t.size or np.any(t <= 0) or np.count_nonzero(n >= bandwidth_from) < 2:
        raise HpcoptError("fitting needs >= 2 ranks and >= 2 positive (size, time) measurements"
                          + (f" from {bandwidth_from:g} bytes up" if bandwidth_from else ""))
    hops, share = _form_coefficients(ranks, large_message_form(ranks, algorithm))
    large = n >= bandwidth_from
    design = np.column_stack([np.full(int(large.sum()), hops), share * n[large]])
    weights = 1 / t[large]
    coef, *_ = np.linalg.lstsq(design * weights[:, None], t[large] * weights, rcond=None)
    alpha, beta = (max(0.0, float(c)) for c in coef)
    if bandwidth_from and not large.all():
        alpha = _latency(n[~large], t[~large], beta, ranks, algorithm)
    return NetworkProfile(name, alpha, beta)


def predict_allreduce_seconds(calls: int, nbytes: int, ranks: int, profile: NetworkProfile,
                              algorithm: str = "auto") -> float:
    """Modelled time of ``calls`` allreduces that moved ``nbytes`` in total (equal sizes)."""
    if calls == 0:
        return 0.0
    return calls * profile.allreduce(nbytes / calls, ranks, algorithm)


def op_seconds(op: str, calls: int, nbytes: float, ranks: int, profile: NetworkProfile,
               algorithm: str = "auto") -> float:
    """Modelled seconds of ``calls`` calls of one ``Comm`` operation moving ``nbytes`` in total
    (equal sizes; for allgathers the bytes each rank contributes)."""
    if calls == 0:
        return 0.0
    size = nbytes / calls
    if op in ("send", "isend"):
        return calls * profile.p2p(size)
    if op in ("recv", "irecv", "wait", IN_FLIGHT, OWN) or ranks <= 1:
        return 0.0
    steps = math.ceil(math.log2(ranks))
    if op == "allreduce":
        return calls * profile.allreduce(size, ranks, algorithm)
    if op == "bcast":
        return calls * steps * profile.p2p(size)
    if op == "barrier":
        return calls * steps * profile.alpha
    if op in ("allgather", "iallgather"):
        return calls * (ranks - 1) * profile.p2p(size)
    if op == "alltoall":  # nbytes: what a rank sends to the p - 1 others in all
        return calls * ((ranks - 1) * profile.alpha + size * profile.beta)
    if op in ("gather", "scatter"):
        return calls * (steps * profile.alpha + (ranks - 1) * size * profile.beta)
    return calls * profile.allreduce(size, ranks, algorithm)  # any other collective: as an allreduce


def network_delay(profile: NetworkProfile, ranks: int,
                  algorithm: str = "auto") -> Callable[[str, int, int], float]:
    """The delay of one call of (op, bytes, the ranks it spans; 0: ``ranks``) on ``profile``:
    ``CommStats.delay`` in delay mode."""
    return lambda op, nbytes, span: op_seconds(op, 1, nbytes, span or ranks, profile, algorithm)


def placed_seconds(op: str, calls: int, nbytes: float, in_node_calls: int, in_node_bytes: float,
                   ranks: int, profile: NetworkProfile, algorithm: str = "auto",
                   layout: NodeLayout | None = None, rails: int = 1) -> float:
    """``op_seconds`` of calls of which ``in_node_calls`` (moving ``in_node_bytes``) were on
    communicators within one node: on ``layout`` those cost memory speed and the others
    ``NodeLayout.spanning`` (``rails``: as many communicators sharing each link at once);
    without a layout all of them cost ``op_seconds`` on ``profile``."""
    if layout is None:
        return op_seconds(op, calls, nbytes, ranks, profile, algorithm)
    return (op_seconds(op, in_node_calls, in_node_bytes, ranks, layout.memory, algorithm)
            + layout.spanning(op, calls - in_node_calls, nbytes - in_node_bytes, ranks, profile, algorithm,
                              rails))


def comm_modelled(counters: Mapping[tuple[str, str], CallCounter], ranks: int, profile: NetworkProfile,
                  algorithm: str = "auto", label_ranks: Mapping[str, int] | None = None,
                  layout: NodeLayout | None = None, hidden: float = 1.0,
                  label_rails: Mapping[str, int] | None = None) -> dict[str, float]:
    """label -> modelled seconds, from ``CommStats.counters`` ((op, label) -> calls, bytes,
    seconds): a non-blocking allreduce's less the computation it overlapped, at most ``hidden``
    of its modelled seconds (``HIDDEN``: the fraction measured hidden; module docstring);
    a label of ``label_ranks`` (``CommStats.ranks``: a group's average) spans its own ranks,
    every other one ``ranks``; with ``layout`` priced where the bytes went (``placed_seconds``),
    a label of ``label_rails`` (``CommStats.rails``) on that many communicators sharing each
    node's link. Summed in sorted (op, label) order, so that a resumed run's counters, restored in another
    order, give the same bits."""
    spans = label_ranks or {}
    out: dict[str, float] = {}
    priced: dict[tuple[str, str], float] = {}
    for (op, label), counter in sorted(counters.items()):
        seconds = priced[op, label] = placed_seconds(op, counter.calls, counter.bytes, counter.in_node_calls,
                                                     counter.in_node_bytes, spans.get(label, ranks), profile,
                                                     algorithm, layout, (label_rails or {}).get(label, 1))
        out[label] = out.get(label, 0.0) + seconds
    for (op, label), counter in counters.items():
        held = counters.get(("iallreduce", label))
        if op == IN_FLIGHT and held is not None:
            out[label] -= min(counter.seconds - held.seconds, hidden * priced["iallreduce", label])
    return out


#: The fraction of a non-blocking allreduce's seconds the computation between its post and its
#: wait hid, per ``progress_mode``: streaming DiLoCo's fragments measured on emulated 100 Mbit/s
#: links, OSU's overlap 1 - held / unhidden. Progressed only inside MPI calls nothing (-0.15 to
#: 0.06: the transfer waits for the wait); with MPICH's progress thread the median, 0.24, of
#: 0.20 and 0.27 (2 x 2 ranks, medians of 3 runs: docs/results/costmodel.md) and 0.68 and 0.15
#: (2 x 2 and 4 x 2 ranks: benchmarks/cluster/study.py's first run, docs/results/clusters.md).
#: At 1 Gbit/s on 2 shared cores the thread slowed the fragments instead (held longer than
#: unhidden), which a hidden fraction cannot express. With hpcopt's communication thread
#: (``comm-thread``, hpcopt.comm.progress) the median, 0.93, of the runs' own measure
#: 1 - held / own (own: the reductions' seconds from post to completion, as the thread saw them)
#: of 0.93, 0.94 and 0.85: PR-SGD I=8 with its round in flight for 7 steps, 2 x 2, 2 x 1 and
#: 2 x 2 ranks at 100 Mbit/s, medians of 3 runs at a load of 22-32 on 2 cores
#: (benchmarks/cluster/overlap.py, docs/algorithms.md).
HIDDEN = {"calls": 0.0, "thread": 0.24, "comm-thread": 0.93}


def main_ops(counters: Mapping[tuple[str, str], CallCounter]) -> dict[str, str]:
    """label -> the operation that moved its bytes (most bytes, then most calls): what a trace
    stores so that its per-label calls and bytes can be modelled on any profile later."""
    best: dict[str, tuple[bool, int, int, str]] = {}
    for (op, label), counter in counters.items():
        costs = op not in ("recv", "irecv", "wait")  # a send's transfer is modelled at the send
        key = (costs, counter.bytes, counter.calls, op)
        if label not in best or key > best[label]:
            best[label] = key
    return {label: key[3] for label, key in best.items()}


def trace_modelled(comm: Mapping[str, Mapping[str, np.ndarray]], ops: Mapping[str, str], ranks: int,
                   profile: NetworkProfile, algorithm: str = "auto",
                   label_ranks: Mapping[str, int] | None = None,
                   layout: NodeLayout | None = None) -> np.ndarray:
    """Per trace row, the modelled communication seconds on ``profile`` of all labels but the
    set-up ones (``SETUP_LABELS``), from the trace's cumulative calls and bytes per label and
    its ``ops`` (label -> operation); ``label_ranks`` and ``layout`` as in ``comm_modelled``
    (a trace without the in-node counters counts every call as spanning nodes). The trace's
    non-blocking allgather counts a post and a wait per row, so half of its calls are
    modelled. A trace holds no seconds in flight: its non-blocking allreduces (streaming
    fragments) are modelled here unhidden, an upper bound of the run's own ``comm_modelled``."""
    spans = label_ranks or {}
    rows = next(iter(comm.values()))["calls"].size if comm else 0
    total = np.zeros(rows)
    for label, fields in comm.items():
        if label in SETUP_LABELS:
            continue
        op = ops.get(label, "allreduce")
        calls = fields["calls"].astype(float)
        node_calls = fields["in_node_calls"].astype(float) if "in_node_calls" in fields else np.zeros(rows)
        node_bytes = fields["in_node_bytes"] if "in_node_bytes" in fields else np.zeros(rows)
        if op == "iallgather":  # post + wait per row: the operation is every other call
            calls, node_calls = calls / 2, node_calls / 2
        for i in range(rows):
            total[i] += placed_seconds(op, int(round(calls[i])), float(fields["bytes"][i]),
                                       int(round(node_calls[i])), float(node_bytes[i]),
                                       spans.get(label, ranks), profile, algorithm, layout)
    return total


#: Labels of the set-up traffic a training run does before its wall clock starts (agreeing on
#: errors, the run directory, the initial model, the start barrier): left out of projections.
SETUP_LABELS = ("preflight", "setup", "init", "start")


def trace_comm_seconds(comm: Mapping[str, Mapping[str, np.ndarray]], field: str = "seconds") -> np.ndarray:
    """Per trace row, the communication seconds (``seconds`` measured, or ``modelled``) of all
    labels but the set-up ones."""
    rows = [fields[field] for label, fields in comm.items() if label not in SETUP_LABELS]
    return np.sum(rows, axis=0) if rows else np.zeros(0)


def project_wall(wall: np.ndarray, measured_comm: np.ndarray, modelled_comm: np.ndarray) -> np.ndarray:
    """Wall clock on another network: measured time minus measured communication plus the
    modelled communication there (computation taken as unchanged; waiting for a slower rank,
    which the measured communication includes, is then counted as communication and removed)."""
    return np.asarray(wall) - np.asarray(measured_comm) + np.asarray(modelled_comm)


# -- the wall clock per step -------------------------------------------------------------------

@dataclass(frozen=True)
class StepModel:
    """The wall seconds a training run is modelled to take per step: its computation plus its
    communication, less what overlap hid.

    ``compute`` is the seconds of one local step (forward, backward, update) on the run's own
    cores and their load, measured where nothing is communicated (``fit_compute``: the ranks
    of a run on the same cores share them, so a step's seconds there hold that sharing, and
    whatever else runs on the cores). A window of ``steps`` steps whose calls the model prices
    at ``modelled`` seconds (``comm_modelled`` or the trace's ``modelled`` counters: a
    non-blocking reduction already less the computation that hid it, ``HIDDEN``) takes::

        wall = steps * compute + modelled

    every rank waiting in each call until the last has arrived, so a call's price is paid once
    per call and not per rank. ``round_compute`` adds what a round spends outside its calls on
    the slowest rank's path (a compressed round's encoding and decoding: ``fit_round_compute``),
    once per round of the window. What the model leaves out, and the check against measured wall
    time shows: an outer optimizer's step, and a slower rank's extra computation between calls.
    """

    compute: float
    round_compute: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("a step's compute", self.compute), ("a round's compute", self.round_compute)):
            if not (value >= 0 and math.isfinite(value)):
                raise HpcoptError(f"{name} seconds must be finite and >= 0, got {value}")

    def wall(self, steps: float, modelled: float, rounds: float = 0) -> float:
        """Modelled wall seconds of ``steps`` steps and ``rounds`` rounds whose calls are
        modelled at ``modelled`` s."""
        return steps * self.compute + rounds * self.round_compute + modelled

    def per_step(self, steps: float, modelled: float, rounds: float = 0) -> float:
        """Modelled wall seconds per step of such a window."""
        return self.wall(steps, modelled, rounds) / steps if steps else math.nan


def fit_compute(wall: float, measured_comm: float, steps: float) -> StepModel:
    """The step model of a run that communicates (almost) nothing: its wall seconds over
    ``steps`` steps less the seconds its calls took (``measured_comm``), per step."""
    if steps <= 0 or wall < 0:
        raise HpcoptError("fitting a step's compute seconds needs > 0 steps and a wall time >= 0")
    return StepModel(max(0.0, wall - measured_comm) / steps)


def fit_round_compute(seconds: float, modelled: float) -> float:
    """A round's seconds outside its calls: its measured wall seconds (the slowest rank's, the
    round alone, ``benchmarks/cluster/wire_rounds.py``) less the modelled seconds of its calls
    (``comm_modelled`` of its counters), at least 0."""
    return max(0.0, seconds - modelled)


def trace_window(steps: np.ndarray, wall: np.ndarray, modelled: np.ndarray,
                 first: int = 0) -> tuple[float, float, float]:
    """(steps, measured wall seconds, modelled seconds of the calls) between trace row ``first``
    and the last row: the window that leaves a run's start-up (the first row's steps) out."""
    if steps.size <= first + 1:
        raise HpcoptError(f"a trace window needs more than {first + 1} rows, the trace has {steps.size}")
    return (float(steps[-1] - steps[first]), float(wall[-1] - wall[first]),
            float(modelled[-1] - modelled[first]))
