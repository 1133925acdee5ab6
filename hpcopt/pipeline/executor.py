"""The pipeline executor: this rank's stage, run through a schedule with non-blocking p2p.

Stage s = comm.rank owns the flat parameter block of its layers (``params``). For each sample k
it receives the activation from stage s-1 (stage 0 reads ``source(k)``), runs its layers forward
and sends the result to stage s+1 (the last stage calls ``sink(k, out) -> (loss, dL/dout)``);
backward, it receives dL/d(output) from s+1, back-propagates, accumulates the parameter
gradient and sends dL/d(input) to s-1. Messages are tagged by sample (tag k + 1).

Every in-flight sample has a slot (sample k uses slot k mod n, n = the schedule's peak number
in flight on this stage): its own copies of the layers (their forward caches), receive buffers
for its activation and its gradient, and, for perturbed gradients, its own copy of the trainable
parameters. Slots are allocated once and reused; a slot's receives for sample k + n are posted
when sample k's backward has finished with it. Sends are never waited on before the end of the
iteration, so a stage blocks only on a receive, exactly as in ``schedules.simulate`` (the unit
tests simulate both schedules for every Delta <= 8 and K <= 128: no deadlock). Traffic is
counted under ``<label>.activation`` and ``<label>.gradient``; the time spent waiting is this
stage's idle time (``timing``).

On GPU (``comm.backend``) the block, the slots' buffers, activations and gradients are device
arrays, ``source`` and ``sink`` must give device arrays, and messages go through
``Comm.isend``/``Comm.irecv_`` (straight through or staged, hpcopt/comm/staging.py).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from ..comm import Comm
from ..errors import HpcoptError
from ..nn import Layer, Sequential
from .schedules import FORWARD, KINDS, Op, max_in_flight, schedule
from .split import StagePlan

Array = Any
T = TypeVar("T")
Shape = tuple[int, ...]
Perturb = Callable[[int, Array], None]
Source = Callable[[int], Array]
Sink = Callable[[int, Array], tuple[Any, Array]]

SETUP_TAG = 0
_MAX_DIMS = 8


@dataclass
class StageTiming:
    """Busy and idle (waiting on a neighbour) seconds of this stage, summed over iterations."""

    busy: float = 0.0
    idle: float = 0.0
    iterations: int = 0
    samples: int = 0

    def bubble(self) -> float:
        """Measured idle share, to compare with ``schedules.ideal_bubble``."""
        total = self.busy + self.idle
        return self.idle / total if total else 0.0

    def reset(self) -> None:
        self.busy = self.idle = 0.0
        self.iterations = self.samples = 0


Views = list[tuple[dict[str, Array], dict[str, Array]]]


def _given(value: T | None, what: str) -> T:
    """``value``, which is set wherever the schedule uses it: the source on stage 0, the sink on
    the last stage (both checked at construction), a slot's receives once ``_post`` posted them."""
    if value is None:
        raise RuntimeError(f"pipeline stage: {what} is not set where the schedule needs it")
    return value


def _clone(layer: Layer) -> Layer:
    """An independent copy of ``layer`` (own forward caches and workspaces, nested layers
    included) that shares, rather than copies, the arrays it and its children are bound to and
    their fixed data (``Layer.constants``)."""
    shared: dict[int, Any] = {}
    parts = [layer]
    while parts:
        part = parts.pop()
        parts.extend(getattr(part, "children", ()))
        for bound in ("params", "grads", "buffers"):
            for view in getattr(part, bound, {}).values():
                shared[id(view)] = view
        for name in getattr(part, "constants", ()):
            value = getattr(part, name)
            shared[id(value)] = value
    return copy.deepcopy(layer, shared)


class _Slot:
    """The private state of one in-flight sample on this stage."""

    def __init__(self, layers: Sequence[Layer], act_in: Array | None,
                 grad_in: Array | None) -> None:
        self.layers = [_clone(layer) for layer in layers]
        self.act_in, self.grad_in = act_in, grad_in
        self.act_req: MPI.Request | None = None
        self.grad_req: MPI.Request | None = None
        self.dout: Array | None = None
        self.noisy: Array | None = None         # perturbed copy of the trainable block
        self.noisy_views: Views | None = None

    def bind(self, views: Views) -> None:
        for layer, (params, grads) in zip(self.layers, views):
            layer.bind(params, grads)

    def forward(self, x: Array, train: bool = True) -> Array:
        for layer in self.layers:
            x = layer.forward(x, train)
        return x

    def backward(self, dy: Array, need_input_grad: bool) -> Array | None:
        last = len(self.layers) - 1
        for i in range(last, -1, -1):
            dy = self.layers[i].backward(dy, need_input_grad=need_input_grad or i > 0)
        return dy


class Pipeline:
    """This rank's stage of a pipelined sequential model.

    ``params`` is this stage's block of the model's flat parameter vector (see
    ``StagePlan.param_slice``); the pipeline keeps it and, per call, writes the point into its
    trainable part (``trainable``, a slice of the block; the rest belongs to frozen layers).
    ``source`` is needed on stage 0, ``sink`` on the last stage; ``input_shape`` is the shape of
    ``source(k)`` (every sample has the same shape). Construction exchanges the activation shapes
    along the pipeline (label ``<label>.setup``).
    """

    def __init__(self, model: Sequential, plan: StagePlan, params: Array, comm: Comm,
                 input_shape: Sequence[int], *, source: Source | None = None,
                 sink: Sink | None = None, frozen: Collection[str] = (), kind: str = "1f1b",
                 label: str = "pipeline") -> None:
        plan.check_world_size(comm.size)
        if kind not in KINDS:
            raise HpcoptError(f"unknown pipeline schedule {kind!r} (choose from {', '.join(KINDS)})")
        self.comm, self.kind, self.label = comm, kind, label
        self.stage, self.num_stages = comm.rank, plan.num_stages
        self.first, self.last = self.stage == 0, self.stage == plan.num_stages - 1
        if self.first and source is None or self.last and sink is None:
            raise ValueError("stage 0 needs a source and the last stage a sink")
        self.source, self.sink = source, sink
        # checks that hold for every stage, made on every rank: all raise together, before any
        # communication
        stateful = [layer.name for layer in model.layers if layer.buffer_shapes()]
        if stateful:
            raise HpcoptError(f"layers with running statistics ({stateful}) are not supported in "
                              "pipeline stages yet")
        self.trainable = plan.trainable_slices(model, frozen)[self.stage]
        self.layers = plan.layers(model, self.stage)
        self.layout = Sequential(self.layers).layout
        if params.ndim != 1 or params.shape[0] != self.layout.size:
            raise ValueError(f"stage {self.stage} needs a flat block of {self.layout.size} "
                             f"parameters, got shape {params.shape}")
        self.params = params
        offset = plan.param_slice(model, self.stage).start
        #: the trainable block's place in the whole model's flat parameter vector
        self.global_trainable = slice(offset + self.trainable.start, offset + self.trainable.stop)
        self.scratch = comm.backend.xp.zeros_like(params)  # layer gradients land here
        self._plain = self._views(None)
        self.timing = StageTiming()
        self._slots: list[_Slot] = []
        self._schedules: dict[tuple[int, bool], tuple[list[Op], int]] = {}
        tag_ub = comm.mpi.Get_attr(MPI.TAG_UB)
        if tag_ub is None:  # MPI defines TAG_UB on every communicator
            raise RuntimeError("the MPI library gives no TAG_UB attribute for this communicator")
        self._tag_limit = int(tag_ub)
        self.in_shape, self.out_shape = self._exchange_shapes(tuple(input_shape))

    @property
    def trainable_size(self) -> int:
        return self.trainable.stop - self.trainable.start

    def gradient(self, point: Array, grad_out: Array, samples: int = 1,
                 perturb: Perturb | None = None) -> float:
        """grad_out <- (1/K) sum_k grad_theta f(theta_k), theta_k = point, + perturb(k) if given.

        ``point`` and ``grad_out`` are this stage's trainable block (zero-size when frozen).
        ``perturb(k, out)`` adds sample k's perturbation in place to ``out`` (= point). Returns
        the mean loss over the K samples on the last stage, 0.0 on the others (so a sum over
        ranks gives it everywhere).
        """
        return self._run(samples, point, grad_out, perturb)

    def loss(self, point: Array) -> float:
        """f(point) by one forward pass (sample 0): the loss on the last stage, 0.0 elsewhere."""
        return self._run(1, point, None, None)

    # -- internals -------------------------------------------------------------------------

    def _views(self, noisy: Array | None) -> Views:
        """Per layer, (parameter views, gradient views); trainable ones into ``noisy`` if given."""
        slices, shapes = self.layout.slices(), dict(self.layout.entries)
        t0, t1 = self.trainable.start, self.trainable.stop
        views: Views = []
        for layer in self.layers:
            params, grads = {}, {}
            for name, _ in layer.param_shapes():
                key = f"{layer.name}.{name}"
                s, shape = slices[key], shapes[key]
                if noisy is not None and t0 <= s.start and s.stop <= t1 and t0 < t1:
                    source = noisy[s.start - t0:s.stop - t0]
                else:
                    source = self.params[s]
                params[name] = source.reshape(shape)
                grads[name] = self.scratch[s].reshape(shape)
            views.append((params, grads))
        return views

    def _exchange_shapes(self, input_shape: Shape) -> tuple[Shape, Shape]:
        """Receive this stage's input shape from s-1, find the output shape, send it to s+1."""
        label = f"{self.label}.setup"
        message = np.zeros(_MAX_DIMS + 1, dtype=np.int64)
        if self.first:
            in_shape = input_shape
        else:
            self.comm.waitall([self.comm.irecv_(message, self.stage - 1, SETUP_TAG, label)], label)
            in_shape = tuple(int(n) for n in message[1:1 + int(message[0])])
        probe = _Slot(self.layers, None, None)
        probe.bind(self._plain)
        zeros = self.comm.backend.xp.zeros(in_shape, self.params.dtype)
        out_shape = tuple(probe.forward(zeros, train=False).shape)
        if not self.last:
            if len(out_shape) > _MAX_DIMS:
                raise ValueError(f"activations of more than {_MAX_DIMS} dimensions: {out_shape}")
            message[0], message[1:1 + len(out_shape)] = len(out_shape), out_shape
            self.comm.waitall([self.comm.isend(message, self.stage + 1, SETUP_TAG, label)], label)
        return in_shape, out_shape

    def _plan(self, samples: int, backward: bool) -> tuple[list[Op], int]:
        """This stage's ops and slot count for K samples (forward-only: one slot per sample)."""
        key = (samples, backward)
        if key not in self._schedules:
            if samples < 1 or samples + 1 > self._tag_limit:
                raise HpcoptError(f"samples per iteration must be in 1..{self._tag_limit - 1}, "
                                  f"got {samples}")
            if backward:
                ops = schedule(self.kind, self.stage, self.num_stages, samples)
                self._schedules[key] = (ops, max_in_flight(ops))
            else:
                self._schedules[key] = ([(FORWARD, k) for k in range(samples)], samples)
        ops, slots = self._schedules[key]
        xp, dtype = self.comm.backend.xp, self.params.dtype
        while len(self._slots) < slots:
            self._slots.append(_Slot(self.layers,
                                     None if self.first else xp.empty(self.in_shape, dtype),
                                     None if self.last else xp.empty(self.out_shape, dtype)))
        return ops, slots

    def _post(self, slot: _Slot, k: int, backward: bool) -> None:
        """Post the receives of sample k into its slot."""
        if not self.first:
            slot.act_req = self.comm.irecv_(slot.act_in, self.stage - 1, k + 1,
                                            f"{self.label}.activation")
        if backward and not self.last:
            slot.grad_req = self.comm.irecv_(slot.grad_in, self.stage + 1, k + 1,
                                             f"{self.label}.gradient")

    def _bind(self, slot: _Slot, k: int, point: Array, perturb: Perturb | None) -> None:
        """Point the slot's layers at sample k's parameters: plain, or point + perturb(k)."""
        if perturb is None or self.trainable_size == 0:
            slot.bind(self._plain)
            return
        noisy, views = slot.noisy, slot.noisy_views
        if noisy is None or views is None:  # both made at the slot's first perturbed sample
            noisy = slot.noisy = self.comm.backend.xp.empty_like(point)
            views = slot.noisy_views = self._views(noisy)
        noisy[...] = point
        perturb(k, noisy)
        slot.bind(views)

    def _send(self, array: Array, slot: _Slot, dest: int, k: int, label: str,
              pending: list[tuple[MPI.Request, Array]]) -> None:
        """Isend ``array`` in the stage's dtype (copied if it aliases a slot buffer that will be
        received into)."""
        xp = self.comm.backend.xp
        for buffer in (slot.act_in, slot.grad_in):
            if buffer is not None and xp.may_share_memory(array, buffer):
                array = array.copy()
                break
        array = xp.ascontiguousarray(array, dtype=self.params.dtype)
        pending.append((self.comm.isend(array, dest, k + 1, label), array))

    def _run(self, samples: int, point: Array, grad_out: Array | None,
             perturb: Perturb | None) -> float:
        """One iteration of the schedule (forward only when ``grad_out`` is None)."""
        backward = grad_out is not None
        ops, n = self._plan(samples, backward)
        comm, stage, tr = self.comm, self.stage, self.trainable
        act_label, grad_label = f"{self.label}.activation", f"{self.label}.gradient"
        if point.shape != (self.trainable_size,):
            raise ValueError(f"stage {stage}: point has shape {point.shape}, "
                             f"expected ({self.trainable_size},)")
        start = time.perf_counter()
        idle = 0.0
        if self.trainable_size:
            self.params[tr] = point
        if grad_out is not None:
            grad_out[...] = 0
        acts: list[tuple[MPI.Request, Array]] = []
        grads: list[tuple[MPI.Request, Array]] = []
        losses: list[Any] = []
        for k in range(min(n, samples)):
            self._post(self._slots[k], k, backward)
        for op, k in ops:
            slot = self._slots[k % n]
            if op == FORWARD:
                if self.first:
                    x = _given(self.source, "the source (stage 0)")(k)
                else:
                    t = time.perf_counter()
                    comm.waitall([_given(slot.act_req, "the slot's activation receive")], act_label)
                    idle += time.perf_counter() - t
                    x = slot.act_in
                self._bind(slot, k, point, perturb)
                out = slot.forward(x, train=backward)
                if self.last:
                    loss, dout = _given(self.sink, "the sink (last stage)")(k, out)
                    losses.append(loss)
                    slot.dout = dout if backward else None
                else:
                    self._send(out, slot, stage + 1, k, act_label, acts)
            else:
                if self.last:
                    dy, slot.dout = slot.dout, None
                else:
                    t = time.perf_counter()
                    comm.waitall([_given(slot.grad_req, "the slot's gradient receive")], grad_label)
                    idle += time.perf_counter() - t
                    dy = slot.grad_in
                dx = slot.backward(dy, need_input_grad=not self.first)
                if self.trainable_size:
                    grad_out += self.scratch[tr]
                if not self.first:
                    self._send(dx, slot, stage - 1, k, grad_label, grads)
                if k + n < samples:
                    self._post(slot, k + n, backward)
        t = time.perf_counter()
        for sent, label in ((acts, act_label), (grads, grad_label)):
            if sent:
                comm.waitall([request for request, _ in sent], label)
        idle += time.perf_counter() - t
        if grad_out is not None and samples > 1:
            grad_out /= samples
        elapsed = time.perf_counter() - start
        self.timing.idle += idle
        self.timing.busy += elapsed - idle
        self.timing.iterations += 1
        self.timing.samples += samples
        if not self.last:
            return 0.0
        # added in float64 in sample order, after one copy of all K losses to the host
        return sum(self.comm.backend.floats_to_host(losses)) / samples
