"""Streaming DiLoCo: the model synchronized one fragment at a time, each fragment's reduction
overlapped with the inner steps that follow it.

Douillard, Donchev, Rush, Kale, Charles, Garrett, Teston, Lacey, McIlroy, Shen, Ramé, Szlam,
Ranzato, Barham, "Streaming DiLoCo with overlapping communication: Towards a Distributed Free
Lunch", arXiv 2501.18512, 2025. The flat vector is cut into P contiguous fragments on parameter
boundaries, of about equal size (``fragment_bounds``). With H = ``interval``, tau = ``overlap``,
alpha = ``fragment_mix``, fragment p (offset o_p = floor(p H / P)) on every rank i::

    after local step s with s = o_p (mod H), s >= 1:
        send_i,p <- x_i,p;  start the sum over ranks of send_i,p    (Iallreduce, label "fragments")
    after local step s + tau (the same step when tau = 0):
        xbar_p = (1/N) sum_j send_j,p
        the outer step on (anchor_p, its state_p) from xbar_p        (eta = lr_{s-1}; average: xbar_p)
        x_i,p <- (1 - alpha) x_i,p + alpha x0_p                      (x0_p the new anchor; 1: replace)
        or, ``overlap_rule = "delayed"`` (tau > 0):
        x_i,p <- x_i,p + alpha (x0_p - send_i,p)                      (the tau steps' progress kept)

Here alpha weights the global fragment; the paper's alpha, and torchft's
``fragment_update_alpha`` (``lerp`` of the global towards the local parameters), weight the
local one: ``fragment_mix`` = 1 - their alpha (docs/algorithms.md).

The ``delayed`` rule is delayed averaging (Zhou et al., "DaSGD: Squeezing SGD Parallelization
Performance in Distributed Training Using Delayed Averaging", arXiv 2006.00441, 2020; with
tau = H, Shen et al., "CoCoD-SGD", IJCAI 2019): a rank keeps the steps it took while the mean
was in flight. With one fragment (P = 1) it is PR-SGD whose round overlaps the next tau inner
steps (``--overlap tau --overlap-rule delayed``).

Each fragment has its own slice of the outer optimizer's state (anchor, buffer, moments), so the
outer step (``hpcopt.algorithms.outer``) applies per fragment (Nesterov per fragment, as the
paper), taken where every round takes it (``Rounds.outer_step``). The
constraints: 1 <= P <= H (distinct offsets), 0 <= tau < H (a fragment's reduction lands before
its next one starts; tau <= H // P keeps at most one fragment in flight, the paper's setting),
0 < alpha <= 1. A round is still H steps: it counts ``rounds`` and synchronizes batch-norm
statistics (``buffer_policy``), blocking. At the end of a run the reductions in flight are
completed and applied, then the plain average ends it (``finish``).

On several nodes, ``node_round = "rails"`` sums a fragment in flight node-aware (a sum in the
node, an allreduce across nodes by each rank's 1/K of it, a gather in the node:
hpcopt/comm/node_reduce.py) instead of one Iallreduce of every rank, another order of the sum.

With a ``wire`` (``hpcopt.comm.wire``, tau = 0 only) a fragment's round is sent through it when
it is due, blocking: of anchor_p - x_i,p (without an anchor: x_i,p), with the fragment's slice
of the error feedback e_i, then the outer step and the mix above.

Which fragment is in flight after which step is a function of the step alone, so a checkpoint
holds only what each rank sent (``state.in_flight``, a per-rank vector); a resumed run posts the
same reductions again from it (the same inputs on as many ranks: the same bits) when they are
due. A reduction is counted when it completes, so a checkpoint taken while one is in flight
holds none of it and the resumed run counts it once, as the uninterrupted run. On another
number of ranks (``resume --ranks-changed``) a checkpoint with none in flight carries over
(``in_flight`` reset: nothing reads it again); one with a reduction in flight is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..comm.node_reduce import RailsSum
from ..errors import HpcoptError
from .base import context, option
from .reducers import PLAIN, Reducer
from .state import RESET, SCRATCH, VECTOR, Declared

if TYPE_CHECKING:
    from ..comm import Comm, Reduction
    from .when import RoundCalls

Array = Any

FRAGMENT_LABEL = "fragments"
#: The trace column of the most bytes in flight (hpcopt.io.trace.PEAK_COLUMN: the file format's
#: name; io imports nothing of the algorithms, nor they of it)
PEAK_COLUMN = "peak_bytes_in_flight"
#: The state a streaming run keeps: what this rank sent of each fragment (read only to post again
#: a reduction in flight at a checkpoint: reset on another number of ranks, where a checkpoint
#: with one in flight is refused, hpcopt.run.rescale), and the reductions in flight (run-time
#: objects, ``InFlight``).
FRAGMENT_FIELDS = (("in_flight", VECTOR, RESET), ("reductions", SCRATCH, None))
#: The trace column of a streaming run: the most bytes a rank had in flight at once over the
#: round up to the row's step.
#: How a reduction that overlapped tau > 0 inner steps lands (``overlap_rule``): ``replace``, the
#: local fragment mixed towards the new global one (Streaming DiLoCo: the tau steps' local
#: progress on it is dropped at alpha = 1); ``delayed``, the round's correction x0_p - send_i,p
#: added to the local fragment (delayed averaging: the tau steps' progress is kept).
OVERLAP_RULES = ("replace", "delayed")


#: Why each option refused with streaming stays refused, in one line.
NOT_STREAMED = {
    "local_steps": "every rank sends a fragment at the same step (ranks with their own round "
                   "lengths would post different reductions)",
    "momentum_policy": "it acts at a whole-model round's end, which streaming spreads over the "
                       "fragments' steps",
    "second_moment_policy": "it acts at a whole-model round's end, which streaming spreads over "
                            "the fragments' steps",
    "wire": "only with overlap 0: a compressed fragment's reduction is blocking, so there is no "
            "reduction in flight to overlap (nor one a resumed run could post again)",
    "participation": "only with overlap 0: a subset's reduction is blocking, so there is no "
                     "reduction in flight to overlap (nor one a resumed run could post again)",
}


def streamed(options: Any) -> bool:
    """Whether these options (an algorithm's, or a config's ``[algorithm]`` section, which has
    every algorithm's) stream the rounds: any of the three changed from the whole-model round."""
    return (options.fragments, options.overlap, options.fragment_mix) != (1, 0, 1.0)


def fragment_bounds(sizes: tuple[int, ...], fragments: int) -> tuple[tuple[int, int], ...]:
    """(start, stop) of ``fragments`` contiguous pieces of a flat vector of parameters of these
    ``sizes``, cut at the parameter boundaries nearest to the equal shares p d / P."""
    if fragments > len(sizes):
        raise HpcoptError(f"fragments {fragments} is more than the model's {len(sizes)} parameters "
                          "(a fragment holds whole parameters)")
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    total, cuts = int(offsets[-1]), [0]
    for p in range(1, fragments):
        first, last = cuts[-1] + 1, len(sizes) - (fragments - p)  # leave one parameter to each
        share = p * total / fragments
        cuts.append(first + int(np.argmin(np.abs(offsets[first:last + 1] - share))))
    cuts.append(len(sizes))
    return tuple((int(offsets[a]), int(offsets[b])) for a, b in zip(cuts, cuts[1:]))


@dataclass(frozen=True, kw_only=True)
class FragmentOptions:
    """The streaming options of PR-SGD's rounds (prsgd, diloco, slowmo); the defaults (1, 0, 1)
    are the whole-model round."""

    fragments: int = option(1, "streaming: fragments P of the model (on parameter boundaries), "
                               "fragment p synchronized every interval steps at offset p*interval/P")
    overlap: int = option(0, "streaming: inner steps tau a fragment's reduction overlaps before "
                             "its outer update (0: the same step; < interval)")
    fragment_mix: float = option(1.0, "streaming: weight a of the new GLOBAL fragment in the local "
                                      "one (1: replace). NOT the Streaming DiLoCo paper's or torchft's "
                                      "alpha, which weights the LOCAL one: a = 1 - alpha")
    overlap_rule: str = option("replace", "streaming, overlap > 0: how a reduction lands tau steps "
                                          "after its send: replace (x <- (1-a) x + a x0, Streaming "
                                          "DiLoCo) | delayed (x <- x + a (x0 - sent): the local "
                                          "progress made meanwhile is kept; delayed averaging)")
    parameter_sizes: tuple[int, ...] = context(())  # the model's parameters, in the flat vector

    @property
    def streaming(self) -> bool:
        return streamed(self)

    def describe_fragments(self) -> str:
        """For ``describe``: the streaming settings (empty without)."""
        if not self.streaming:
            return ""
        rule = "" if self.overlap_rule == "replace" else f" {self.overlap_rule}"
        return f", fragments {self.fragments} (overlap {self.overlap}{rule}, mix {self.fragment_mix:g})"

    def check_fragments(self, interval: int, refused: dict[str, bool]) -> None:
        """HpcoptError for values out of range, or for an option named in ``refused`` (True:
        changed from what streaming builds) when streaming, with the reason (``NOT_STREAMED``)."""
        if self.fragments < 1:
            raise HpcoptError(f"fragments must be >= 1, got {self.fragments}")
        if self.fragments > interval:
            raise HpcoptError(f"fragments {self.fragments} must be <= interval {interval} "
                              "(one fragment starts at each of its offsets p*interval/fragments)")
        if not 0 <= self.overlap < interval:
            raise HpcoptError(f"overlap must be in [0, interval {interval}), got {self.overlap}")
        if not 0 < self.fragment_mix <= 1:
            raise HpcoptError(f"fragment_mix must be in (0, 1], got {self.fragment_mix}")
        if self.overlap_rule not in OVERLAP_RULES:
            raise HpcoptError(f"unknown overlap_rule {self.overlap_rule!r} (choose from "
                              f"{', '.join(OVERLAP_RULES)})")
        if self.overlap_rule != "replace" and self.overlap == 0:
            raise HpcoptError(f"overlap_rule {self.overlap_rule} needs overlap > 0 (at overlap 0 the "
                              "model sent is the current one, and the rules are one)")
        for name, changed in refused.items():
            if self.streaming and changed:
                raise HpcoptError(f"{name} is not built with fragments, overlap or fragment_mix: "
                                  f"{NOT_STREAMED[name]}")
        if self.parameter_sizes:
            fragment_bounds(self.parameter_sizes, self.fragments)  # its check against the model

    def fragment_schedule(self, interval: int, reducer: Reducer = PLAIN,
                          rails: bool = False) -> FragmentSchedule:
        """When each fragment is sent and applied (``parameter_sizes`` must be known), and how
        its mean is taken (``rails``: in flight on several nodes by the rails)."""
        return FragmentSchedule(fragment_bounds(self.parameter_sizes, self.fragments), interval,
                                self.overlap, self.fragment_mix, reducer, self.overlap_rule, rails)


@dataclass
class InFlight:
    """A rank's reductions in flight (fragment -> its Reduction) and their results (like x);
    run-time objects, rebuilt at every start."""

    received: Array
    pending: dict[int, Reduction] = field(default_factory=dict)


@dataclass(frozen=True)
class FragmentSchedule:
    """The fragments' (start, stop) in the flat vector, the interval H, overlap tau, mix alpha,
    the reducer of a fragment's round (``hpcopt.algorithms.reducers``: plain, in flight;
    a wire, blocking, tau = 0) and how a reduction lands (``OVERLAP_RULES``); ``rails``: a plain
    reducer's sums in flight take the node-aware path on several nodes (``Comm.iallreduce``'s
    ``rails``, hpcopt/comm/node_reduce.py), moved on after every step."""

    bounds: tuple[tuple[int, int], ...]
    interval: int
    overlap: int
    mix: float
    reducer: Reducer = PLAIN
    rule: str = "replace"
    rails: bool = False

    def offset(self, p: int) -> int:
        return p * self.interval // len(self.bounds)

    def sent_at(self, step: int) -> int | None:
        """The fragment sent after local step ``step`` (1-based count), if any."""
        if step < 1:
            return None
        due = step % self.interval
        for p in range(len(self.bounds)):
            if self.offset(p) == due:
                return p
        return None

    def in_flight(self, step: int) -> list[tuple[int, int]]:
        """(fragment, step it was sent) of the reductions in flight after ``step``'s own, oldest
        first."""
        found = []
        for sent in range(max(1, step - self.overlap + 1), step + 1):
            p = self.sent_at(sent)
            if p is not None:
                found.append((p, sent))
        return found

    def peak_bytes(self, step: int, itemsize: int) -> int:
        """The most bytes in flight at once over the round of H steps up to ``step``: those
        between two steps, and within a step those after its completion and its post (tau = 0:
        the fragment the step sends)."""
        first = max(1, step - self.interval + 1)
        if self.overlap == 0:
            sent = (self.sent_at(s) for s in range(first, step + 1))
            sizes = [self.size(p) for p in sent if p is not None]
        else:
            sizes = [sum(self.size(p) for p, _ in self.in_flight(s)) for s in range(first - 1, step + 1)]
        return max(sizes, default=0) * itemsize

    def size(self, p: int) -> int:
        start, stop = self.bounds[p]
        return stop - start

    # -- the timing of a round (``hpcopt.algorithms.when.Timing``) --------------------------------

    declared: ClassVar[tuple[Declared, ...]] = FRAGMENT_FIELDS

    def new_state(self, x: Array) -> dict[str, Any]:
        """The state's ``in_flight`` vector and the run-time buffers, for a model like ``x`` (on
        the host: ``Config`` refuses streaming on a GPU)."""
        return {"in_flight": np.zeros_like(x), "reductions": InFlight(np.zeros_like(x))}

    def before_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """Nothing: the fragments take their turns after the steps (whatever the phase of the
        algorithm's whole-model rounds)."""

    def pending(self, state: Any, comm: Comm) -> bool:
        """None: what is in flight at the end is completed by ``drain``."""
        return False

    def after_step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """A group round when one is due (not at a round's end), the fragments' turn, and every
        interval steps the round's end (``rounds.end_round``)."""
        if state.steps_in_round < self.interval:
            rounds.group_round(state.x, state.steps_in_round, comm)
        self.step(state, comm, rounds)
        if state.steps_in_round == self.interval:
            rounds.end_round(state, comm)

    def synchronized(self, state: Any) -> bool:
        """Only at the start: the fragments take turns."""
        return state.step == 0

    def trace_columns(self) -> tuple[str, ...]:
        """peak_bytes_in_flight (through a wire the fragments' rounds are blocking: none in
        flight, no column)."""
        return (PEAK_COLUMN,) if self.reducer.in_flight else ()

    def trace_row(self, state: Any) -> dict[str, Any]:
        """peak_bytes_in_flight over the round up to ``state``'s step."""
        if not self.trace_columns():
            return {}
        return {PEAK_COLUMN: self.peak_bytes(state.step, state.x.itemsize)}

    def step(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """After local step ``state.step``: apply the fragment due, then send the one due (tau
        = 0: send it, then apply it). ``rounds`` is the algorithm: its ``outer_step`` and
        ``lr_at``."""
        step, overlap = state.step, self.overlap
        if self.rails:
            for reduction in state.reductions.pending.values():
                comm.advance(reduction)
        done = self.sent_at(step - overlap)
        if done is not None and overlap > 0:  # first: it leaves the wire before the next starts
            self._apply(done, step - overlap, state, comm, rounds)
        p = self.sent_at(step)
        if p is not None:
            start, stop = self.bounds[p]
            state.in_flight[start:stop] = state.x[start:stop]
            if not self.reducer.in_flight:
                self._apply_blocking(p, step, state, comm, rounds)
                return
            self._post(p, state, comm)
            if overlap == 0:
                self._apply(p, step, state, comm, rounds)

    def drain(self, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """Complete and apply every reduction still in flight (the end of a run)."""
        for p, sent in self.in_flight(state.step):
            self._apply(p, sent, state, comm, rounds)

    def _post(self, p: int, state: Any, comm: Comm) -> None:
        start, stop = self.bounds[p]
        reductions = state.reductions
        reductions.pending[p] = comm.iallreduce(state.in_flight[start:stop],
                                                reductions.received[start:stop], FRAGMENT_LABEL,
                                                stages=RailsSum if self.rails else None)

    def _apply(self, p: int, sent: int, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """Complete fragment p's reduction (posted again from ``in_flight`` after a resume),
        take its outer step and mix it into x."""
        reductions = state.reductions
        if p not in reductions.pending:  # sent before the checkpoint this run resumed from
            self._post(p, state, comm)
        comm.complete(reductions.pending.pop(p))
        start, stop = self.bounds[p]
        mean = reductions.received[start:stop]
        if comm.size > 1:
            mean /= comm.size
        self._mix(p, sent, mean, state, rounds)

    def _apply_blocking(self, p: int, sent: int, state: Any, comm: Comm, rounds: RoundCalls) -> None:
        """Fragment p's round by a blocking reducer (a wire: of the pseudo-gradients anchor_p -
        x_i,p, or without an anchor of x_i,p, with the slice of the error feedback e_i), then
        its outer step and mix."""
        start, stop = self.bounds[p]
        part = slice(start, stop)
        mean = state.reductions.received[part]
        mean[...] = state.x[part]
        self.reducer.mean_(mean, state, part, comm, FRAGMENT_LABEL)
        self._mix(p, sent, mean, state, rounds)

    def _mix(self, p: int, sent: int, mean: Array, state: Any, rounds: RoundCalls) -> None:
        """Fragment p's outer step from its round's ``mean`` (sent after step ``sent``), then
        x_i,p <- (1 - alpha) x_i,p + alpha x0_p; under the ``delayed`` rule (tau > 0)
        x_i,p <- x_i,p + alpha (x0_p - send_i,p)."""
        start, stop = self.bounds[p]
        rounds.outer_step(state, rounds.lr_at(sent - 1), mean, slice(start, stop))
        x = state.x[start:stop]
        if self.rule == "delayed" and self.overlap > 0:
            mean -= state.in_flight[start:stop]
            if self.mix != 1:
                mean *= self.mix
            x += mean
        elif self.mix == 1:
            x[...] = mean
        else:
            x *= 1 - self.mix
            mean *= self.mix
            x += mean
