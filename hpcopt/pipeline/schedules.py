"""Pipeline schedules as data: per stage, the ordered list of (op, sample) it executes.

Stage s of Delta runs forward ``F`` and backward ``B`` passes of samples 0..K-1. Cross-stage
dependencies: F(s, k) needs F(s-1, k); B(s, k) needs B(s+1, k) (and F(s, k) on the same stage).

- ``gpipe`` (fill-drain, GPipe; Huang et al. 2019; PPRS, Colin et al. 2019, Fig. 2): all K
  forwards, then all K backwards, both in sample order. Up to K samples in flight per stage.
- ``1f1b`` (PipeDream-Flush; Narayanan et al. 2021): min(K, Delta-s-1) warm-up forwards, then
  one forward and one backward alternately, then the remaining backwards. At most Delta - s
  samples in flight on stage s, the same makespan as fill-drain when F and B cost the same.

With unit-time F and B both take 2 (K + Delta - 1) units, so every stage idles a fraction
(Delta - 1) / (K + Delta - 1) of the iteration: the pipeline bubble.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import HpcoptError

FORWARD, BACKWARD = "F", "B"
KINDS = ("gpipe", "1f1b")

Op = tuple[str, int]


def schedule(kind: str, stage: int, num_stages: int, samples: int) -> list[Op]:
    """The ops stage ``stage`` of ``num_stages`` runs, in order, for ``samples`` samples."""
    if kind not in KINDS:
        raise HpcoptError(f"unknown pipeline schedule {kind!r} (choose from {', '.join(KINDS)})")
    if num_stages < 1 or samples < 1 or not 0 <= stage < num_stages:
        raise ValueError(f"need 0 <= stage < num_stages and samples >= 1, got stage {stage}, "
                         f"{num_stages} stages, {samples} samples")
    if kind == "gpipe":
        return [(FORWARD, k) for k in range(samples)] + [(BACKWARD, k) for k in range(samples)]
    warmup = min(samples, num_stages - stage - 1)
    ops = [(FORWARD, k) for k in range(warmup)]
    for k in range(samples - warmup):
        ops += [(FORWARD, warmup + k), (BACKWARD, k)]
    return ops + [(BACKWARD, k) for k in range(samples - warmup, samples)]


def max_in_flight(ops: list[Op]) -> int:
    """The most samples forwarded but not yet backwarded at any point of ``ops``."""
    in_flight = peak = 0
    for op, _ in ops:
        in_flight += 1 if op == FORWARD else -1
        peak = max(peak, in_flight)
    return peak


def ideal_bubble(num_stages: int, samples: int) -> float:
    """(Delta - 1) / (K + Delta - 1): the idle share of each stage with equal-cost ops."""
    return (num_stages - 1) / (samples + num_stages - 1)


@dataclass(frozen=True)
class Simulation:
    """Earliest-start execution of a schedule: finish time of every op, makespan, busy time."""

    forward_finish: tuple[tuple[float, ...], ...]   # [stage][sample]
    backward_finish: tuple[tuple[float, ...], ...]  # [stage][sample]
    makespan: float
    busy: tuple[float, ...]

    def bubble(self, stage: int) -> float:
        return 1.0 - self.busy[stage] / self.makespan


def schedules(kind: str, num_stages: int, samples: int) -> list[list[Op]]:
    """Every stage's op list."""
    return [schedule(kind, s, num_stages, samples) for s in range(num_stages)]


def simulate(ops: Sequence[Sequence[Op]], forward_time: float = 1.0,
             backward_time: float = 1.0) -> Simulation:
    """Run every stage's op list in order, each op as soon as its inputs exist (no latency).

    Mirrors the MPI executor: a stage blocks only waiting for a neighbour's message. Raises
    RuntimeError on a deadlock (no stage can run its next op) or a malformed schedule (a
    backward before its forward, a sample run twice or never on some stage).
    """
    num_stages = len(ops)
    samples = 1 + max(k for stage_ops in ops for _, k in stage_ops)
    unset = -1.0
    fwd = [[unset] * samples for _ in range(num_stages)]
    bwd = [[unset] * samples for _ in range(num_stages)]
    position, clock = [0] * num_stages, [0.0] * num_stages
    last = num_stages - 1
    remaining = sum(len(o) for o in ops)
    sweeps = (range(num_stages), range(last, -1, -1))  # forwards flow down, backwards up
    passes = 0
    while remaining:
        done_before = remaining
        for s in sweeps[passes % 2]:
            mine, stage_ops, t = fwd[s], ops[s], clock[s]
            while position[s] < len(stage_ops):
                op, k = stage_ops[position[s]]
                if op == FORWARD:
                    ready = fwd[s - 1][k] if s else 0.0
                    if ready == unset or mine[k] != unset:
                        break
                    t = mine[k] = max(t, ready) + forward_time
                else:
                    ready = bwd[s + 1][k] if s < last else 0.0
                    if ready == unset or mine[k] == unset or bwd[s][k] != unset:
                        break
                    t = bwd[s][k] = max(t, ready) + backward_time
                position[s] += 1
                remaining -= 1
            clock[s] = t
        passes += 1
        if remaining == done_before:  # nothing changed, so no sweep order can progress
            raise RuntimeError(f"deadlock with {num_stages} stages and {samples} samples: stage "
                               f"positions {position}")
    if any(unset in row for row in fwd + bwd):
        raise RuntimeError("some sample is not run forward and backward on every stage")
    busy = tuple(samples * (forward_time + backward_time) for _ in range(num_stages))
    return Simulation(tuple(map(tuple, fwd)), tuple(map(tuple, bwd)), max(clock), busy)
