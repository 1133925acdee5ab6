"""Pipeline Parallel Random Smoothing (PPRS) and the pipelined GD / Nesterov AGD baselines.

Colin, Dos Santos, Scaman, "Theoretical Limits of Pipeline Parallel Optimization and
Application to Distributed Deep Learning", NeurIPS 2019.

Every stage s (= rank) runs the same update on its own trainable block of the parameters; the
pipeline (``hpcopt.pipeline.Pipeline.gradient``) supplies the gradient, and nothing else is
communicated. PPRS averages K perturbed gradients, pipelined one behind the other::

    g_t = (1/K) sum_k grad f(y_t + gamma_t X_k)
    X_k's block on stage s ~ N(0, I) from stream(seed, "pprs", t, k, s)

so each stage draws its own noise and the noise is never sent. Two outer loops:

``nesterov`` (the practical mode; fixed lr, momentum mu and gamma)::

    y_t = x_t + mu (x_t - x_{t-1});  x_{t+1} = P(y_t - lr g_t)

``accelerated`` [reconstructed: the DRS-style scheme of Scaman et al. 2018 with the theory's
schedules; the paper's own text was not at hand, see ALGORITHMS.md §3]::

    alpha_0 = 1,  alpha_{t+1} = 2 / (1 + sqrt(1 + 4 / alpha_t^2));  x_0 = z_0 = theta_0
    y_t = (1 - alpha_t) x_t + alpha_t z_t;   gamma_t = smoothing * alpha_t  (default R d^(-1/4))
    G_t = G_{t-1} + g_t / alpha_t;           eta_t = R alpha_t / (2 L (d^(1/4) + sqrt((t+1)/K)))
    z_{t+1} = P(theta_0 - eta_{t+1} G_t);    x_{t+1} = (1 - alpha_t) x_t + alpha_t z_{t+1}

P projects onto the stage's box (an l_inf ball intersected with the valid range; identity when
unconstrained). The baselines take one unperturbed gradient per iteration (K = 1, gamma = 0):
``PipelinedAGD`` is the ``nesterov`` loop above, and with momentum 0 it is projected GD.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np

from ..errors import HpcoptError
from ..rng import stream
from .base import PIPELINE, check_momentum, context, option, positive_finite
from .state import REFUSE, SAME, counter, scalar, scratch, vector

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any
T = TypeVar("T")
Perturb = Callable[[int, Array], None]
OUTER_LOOPS = ("nesterov", "accelerated")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")  # hpcopt.pipeline.schedules.KINDS
NOISE_PURPOSE = "pprs"
#: gamma of the nesterov loop when ``smoothing`` is left at AUTO
NESTEROV_SMOOTHING = 1e-3
AUTO = -1.0


class StagedOracle(Protocol):
    """``Pipeline.gradient``: this stage's block of (1/K) sum_k grad f(point + perturbation_k)."""

    def __call__(self, point: Array, grad_out: Array, samples: int = 1,
                 perturb: Perturb | None = None) -> float: ...


@dataclass(frozen=True, eq=False)
class Box:
    """Coordinate-wise bounds lower <= x <= upper on this stage's block (arrays or scalars)."""

    lower: Any
    upper: Any

    def project_(self, x: Array) -> Array:
        """x <- clip(x, lower, upper) in place."""
        return x.clip(self.lower, self.upper, out=x)


@dataclass
class PipelineState:
    """What a stage carries between iterations (the checkpoint saves the declared fields, per
    stage: ``hpcopt.algorithms.state``)."""

    x: Array = vector(REFUSE)             # x_t, this stage's trainable block
    y: Array = scratch()            # the point where the gradient is taken
    grad: Array = scratch()         # g_t
    prev: Array | None = vector(REFUSE)   # nesterov: x_{t-1}
    z: Array | None = vector(REFUSE)      # accelerated: z_t
    anchor: Array | None = vector(REFUSE)  # accelerated: theta_0
    grad_sum: Array | None = vector(REFUSE)  # accelerated: G_t
    noise_host: np.ndarray | None = scratch()  # PPRS: where noise is drawn (CPU: d, GPU: K d pinned)
    noise: Array | None = scratch()  # PPRS on GPU: gamma_t X_k for k < K on the device (K x d)
    box: Box | None = scratch()
    step: int = counter(SAME)
    alpha: float = scalar(SAME, 1.0)


def _held(value: T | None, name: str) -> T:
    """The PipelineState field ``name``, one that only some loops hold (None in the others):
    a state made by the algorithm's ``init`` holds it wherever the step reads it."""
    if value is None:
        raise RuntimeError(f"PipelineState.{name} is None: the state was not made by this "
                           "algorithm's init (or for another outer loop or momentum)")
    return value


def pprs_noise(seed: int, step: int, sample: int, stage: int, size: int) -> np.ndarray:
    """X_k's block on stage s at iteration t: float64 N(0, I) from stream(seed, "pprs", t, k, s)."""
    return stream(seed, NOISE_PURPOSE, step, sample, stage).standard_normal(size)


def theory_horizon(radius: float, lipschitz: float, dimension: int, eps: float) -> tuple[int, int]:
    """(T, K) = (ceil(20 R L d^(1/4) / eps), ceil(5 R L d^(-1/4) / eps)): the theory's defaults."""
    root = dimension ** 0.25
    return (math.ceil(20 * radius * lipschitz * root / eps),
            math.ceil(5 * radius * lipschitz / (root * eps)))


def _new_state(x0: Array, comm: Comm, box: Box | None, *, prev: bool = False,
               accelerated: bool = False) -> PipelineState:
    xp = comm.backend.xp
    if box is not None:
        box.project_(x0)
    return PipelineState(
        x=x0, y=xp.empty_like(x0), grad=xp.zeros_like(x0),
        prev=x0.copy() if prev else None,
        z=x0.copy() if accelerated else None,
        anchor=x0.copy() if accelerated else None,
        grad_sum=xp.zeros_like(x0) if accelerated else None, box=box)


def _nesterov_step(state: PipelineState, oracle: StagedOracle, lr: float, momentum: float,
                   samples: int, perturb: Perturb | None) -> float:
    """y = x + mu (x - x_prev); g = oracle(y); x_prev = x; x = P(y - lr g)."""
    x, y = state.x, state.y
    y[...] = x
    if momentum:
        y -= _held(state.prev, "prev")
        y *= momentum
        y += x
    loss = oracle(y, state.grad, samples, perturb)
    if momentum:
        _held(state.prev, "prev")[...] = x
    x[...] = y
    x -= lr * state.grad
    if state.box is not None:
        state.box.project_(x)
    state.step += 1
    return loss


@dataclass(frozen=True, kw_only=True)
class _Pipelined:
    """Options every pipeline algorithm has: the step size and the pipeline schedule."""

    parallelism: ClassVar[str] = PIPELINE
    clips: ClassVar[bool] = False  # pipeline algorithms never clip
    implied: ClassVar[dict[str, Any]] = {}

    lr: float = option(1e-3, "learning rate eta")
    pipeline: str = option("gpipe", "pipeline schedule: gpipe (fill-drain) | 1f1b")

    def __post_init__(self) -> None:
        positive_finite("lr", self.lr)
        if self.pipeline not in PIPELINE_SCHEDULES:
            raise HpcoptError(f"unknown pipeline schedule {self.pipeline!r} "
                              f"(choose from {', '.join(PIPELINE_SCHEDULES)})")

    @property
    def samples_per_iteration(self) -> int:
        """K: the samples an iteration streams through the pipeline."""
        return 1

    def step_size(self, state: PipelineState) -> float:
        """The step size of the next iteration (the trace's lr column)."""
        return self.lr


@dataclass(frozen=True, kw_only=True)
class PipelinedGD(_Pipelined):
    """Pipelined projected GD: one gradient per iteration."""

    name: ClassVar[str] = "pipelined_gd"

    def init(self, x0: Array, comm: Comm, box: Box | None = None) -> PipelineState:
        """State from this stage's block x0 (projected onto ``box``); no communication."""
        return _new_state(x0, comm, box)

    def step(self, state: PipelineState, oracle: StagedOracle, comm: Comm) -> float:
        """One iteration; returns the loss on the last stage, 0.0 on the others."""
        return _nesterov_step(state, oracle, self.lr, 0.0, 1, None)


@dataclass(frozen=True, kw_only=True)
class PipelinedAGD(_Pipelined):
    """Pipelined projected Nesterov AGD, one gradient per iteration."""

    name: ClassVar[str] = "pipelined_agd"

    momentum: float = option(0.9, "heavy-ball momentum mu; 0 = plain SGD")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_momentum(self.momentum, False)
        if self.momentum == 0:
            raise HpcoptError("pipelined_agd needs --momentum in (0, 1), e.g. 0.9 "
                              "(with momentum 0 it is --algorithm pipelined_gd)")

    def init(self, x0: Array, comm: Comm, box: Box | None = None) -> PipelineState:
        """State from this stage's block x0 (projected onto ``box``); no communication."""
        return _new_state(x0, comm, box, prev=True)

    def step(self, state: PipelineState, oracle: StagedOracle, comm: Comm) -> float:
        """One iteration; returns the loss on the last stage, 0.0 on the others."""
        return _nesterov_step(state, oracle, self.lr, self.momentum, 1, None)


@dataclass(frozen=True, kw_only=True)
class PPRS(_Pipelined):
    """PPRS hyper-parameters (see the module docstring for both outer loops).

    ``samples`` is K. ``nesterov`` uses ``lr``, ``momentum`` and gamma = ``smoothing``.
    ``accelerated`` uses the context: ``radius`` R (>= ||theta_0 - theta*||), ``lipschitz`` L,
    ``dimension`` d (all stages' trainable parameters together), and gamma_t = smoothing *
    alpha_t. ``smoothing`` AUTO (-1) is 1e-3 for nesterov and R d^(-1/4) for accelerated.
    """

    name: ClassVar[str] = "pprs"

    momentum: float = option(0.9, "heavy-ball momentum mu; 0 = plain SGD")
    samples: int = option(10, "K perturbed samples per iteration")
    smoothing: float = option(AUTO, "gamma (accelerated: gamma_t = smoothing * alpha_t); "
                                    "-1 = 1e-3 for nesterov, R d^(-1/4) for accelerated")
    outer: str = option("nesterov", "outer loop: nesterov (fixed lr, momentum, gamma) | accelerated")
    radius: float | None = context(None)
    lipschitz: float | None = context(None)
    dimension: int | None = context(None)
    seed: int = context(0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.samples < 1:
            raise HpcoptError(f"samples K must be >= 1, got {self.samples}")
        if self.outer not in OUTER_LOOPS:
            raise HpcoptError(f"unknown outer loop {self.outer!r} "
                              f"(choose from {', '.join(OUTER_LOOPS)})")
        if self.seed < 0:
            raise HpcoptError(f"seed must be >= 0, got {self.seed}")
        if not (self.smoothing == AUTO or (self.smoothing >= 0 and math.isfinite(self.smoothing))):
            raise HpcoptError(f"smoothing (gamma) must be >= 0 (or -1: the outer loop's default), "
                              f"got {self.smoothing}")
        check_momentum(self.momentum, False)

    @property
    def samples_per_iteration(self) -> int:
        return self.samples

    def _check_context(self) -> None:
        """The accelerated loop needs R, L and d (from the problem; checked at init)."""
        if self.outer == "accelerated" and not (
                self.radius and self.radius > 0 and self.lipschitz and self.lipschitz > 0
                and self.dimension and self.dimension >= 1):
            raise HpcoptError("the accelerated outer loop needs radius > 0, lipschitz > 0 and "
                              f"dimension >= 1, got R={self.radius}, L={self.lipschitz}, "
                              f"d={self.dimension}")

    @property
    def smoothing_scale(self) -> float:
        """gamma (nesterov) or the factor of alpha_t (accelerated), AUTO resolved."""
        if self.smoothing != AUTO:
            return self.smoothing
        if self.outer == "nesterov":
            return NESTEROV_SMOOTHING
        self._check_context()
        assert self.radius is not None and self.dimension is not None
        return self.radius * self.dimension ** -0.25

    def gamma_at(self, alpha: float) -> float:
        """gamma_t: fixed (nesterov) or smoothing * alpha_t (accelerated)."""
        return self.smoothing_scale * (1.0 if self.outer == "nesterov" else alpha)

    def step_size(self, state: PipelineState) -> float:
        """``lr`` (nesterov), or eta_t (accelerated)."""
        return self.lr if self.outer == "nesterov" else self.eta(state.step, state.alpha)

    def eta(self, t: int, alpha: float) -> float:
        """eta_t = R alpha_t / (2 L (d^(1/4) + sqrt((t + 1) / K))) (accelerated loop)."""
        assert self.radius is not None and self.lipschitz is not None and self.dimension is not None
        return self.radius * alpha / (2 * self.lipschitz * (self.dimension ** 0.25
                                                            + math.sqrt((t + 1) / self.samples)))

    def init(self, x0: Array, comm: Comm, box: Box | None = None) -> PipelineState:
        """State from this stage's block x0 (projected onto ``box``); no communication."""
        self._check_context()
        accelerated = self.outer == "accelerated"
        state = _new_state(x0, comm, box, prev=not accelerated and self.momentum > 0,
                           accelerated=accelerated)
        backend, size = comm.backend, x0.shape[0]
        if backend.is_gpu:  # all K blocks of an iteration, drawn on the host, copied at once
            state.noise_host = backend.empty_pinned(self.samples * size, np.float64)
            state.noise = backend.xp.empty((self.samples, size), np.float64)
        else:  # one block, drawn and added per sample
            state.noise_host = np.empty(size)
        return state

    def perturbation(self, state: PipelineState, stage: int, gamma: float, comm: Comm) -> Perturb:
        """perturb(k, out): out += gamma X_k, X_k = pprs_noise(seed, t, k, stage).

        On CPU each call draws its block into one scratch vector. On the GPU the first call of
        an iteration draws all K blocks gamma X_0..X_{K-1} on the host, from the same seeded
        NumPy streams (so a GPU run sees exactly the CPU run's noise; CuPy's generators would
        give other numbers), into one page-locked K x d float64 buffer, and copies it to the
        device in one transfer: one host-to-device copy per iteration instead of K, at the cost
        of K x d float64 on each stage's device. Later calls only add row k on the device.
        Either way the noise stays float64 until it is added and is drawn inside the pipeline's
        forward passes (the stage's busy time).
        """
        step, host = state.step, _held(state.noise_host, "noise_host")

        def draw(k: int, out: np.ndarray) -> None:
            stream(self.seed, NOISE_PURPOSE, step, k, stage).standard_normal(out=out)

        if not comm.backend.is_gpu:
            def perturb(k: int, out: Array) -> None:
                draw(k, host)
                out += np.multiply(host, gamma, out=host)

            return perturb
        blocks, noise = host.reshape(self.samples, -1), _held(state.noise, "noise")
        drawn = False

        def perturb_on_device(k: int, out: Array) -> None:
            nonlocal drawn
            if not drawn:
                for j in range(self.samples):
                    draw(j, blocks[j])
                np.multiply(blocks, gamma, out=blocks)
                comm.backend.copy_from_host_(noise, host)
                drawn = True
            out += noise[k]

        return perturb_on_device

    def step(self, state: PipelineState, oracle: StagedOracle, comm: Comm) -> float:
        """One iteration (K pipelined samples); the mean loss on the last stage, else 0.0."""
        gamma = self.gamma_at(state.alpha)
        perturb = self.perturbation(state, comm.rank, gamma, comm)
        if self.outer == "nesterov":
            return _nesterov_step(state, oracle, self.lr, self.momentum, self.samples, perturb)
        a, x, y = state.alpha, state.x, state.y
        z, anchor = _held(state.z, "z"), _held(state.anchor, "anchor")
        grad_sum = _held(state.grad_sum, "grad_sum")
        y[...] = x
        y *= 1 - a
        y += a * z
        loss = oracle(y, state.grad, self.samples, perturb)
        grad_sum += state.grad / a  # in place: state.grad_sum
        a_next = 2 / (1 + math.sqrt(1 + 4 / a ** 2))
        z[...] = anchor
        z -= self.eta(state.step + 1, a_next) * grad_sum
        if state.box is not None:
            state.box.project_(z)
        x *= 1 - a
        x += a * z
        state.alpha = a_next
        state.step += 1
        return loss
