"""PPRS and the pipelined baselines against plain re-statements of their update rules (no MPI),
on NumPy and on CuPy arrays (the ``xp`` fixture)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from hpcopt.algorithms.pprs import PPRS, Box, PipelinedAGD, PipelinedGD, pprs_noise, theory_horizon
from hpcopt.backend import CPU, array_module, get_backend
from hpcopt.errors import HpcoptError
from tests.conftest import host


def fake_comm(xp, rank=0):
    return SimpleNamespace(rank=rank, backend=CPU if xp is np else get_backend("gpu"))


class L1Oracle:
    """grad of sum_i |x_i - c_i| at each perturbed point, averaged; records the perturbations
    (as host copies)."""

    def __init__(self, center):
        self.center, self.seen = center, []

    def __call__(self, point, grad_out, samples=1, perturb=None):
        xp = array_module(grad_out)
        center = xp.asarray(self.center)
        grad_out[...] = 0
        for k in range(samples):
            theta = point.copy()
            if perturb is not None:
                perturb(k, theta)
            self.seen.append((host(point.copy()), host(theta)))
            grad_out += xp.sign(theta - center)
        grad_out /= samples
        return float(xp.abs(point - center).sum())


def run(xp, algo, x0, steps, rank=0, box=None, center=None):
    """``steps`` iterations from ``x0`` (host) on ``xp`` arrays; the state's vectors stay there."""
    oracle = L1Oracle(np.linspace(-1, 1, x0.size) if center is None else center)
    comm = fake_comm(xp, rank)
    state = algo.init(xp.asarray(x0).copy(), comm, box)
    for _ in range(steps):
        algo.step(state, oracle, comm)
    assert isinstance(state.x, xp.ndarray)
    return state, oracle


def test_noise_comes_from_its_key_and_is_never_shared_between_stages(xp):
    algo = PPRS(samples=3, smoothing=0.5, lr=0.1, seed=11)
    state, oracle = run(xp, algo, np.zeros(5), steps=2, rank=2)
    expected = [0.5 * pprs_noise(11, t, k, 2, 5) for t in range(2) for k in range(3)]
    assert len(oracle.seen) == len(expected)
    for (point, theta), want in zip(oracle.seen, expected):
        np.testing.assert_array_equal(theta, point + want)
    other, _ = run(xp, algo, np.zeros(5), steps=2, rank=1)
    assert not np.allclose(host(other.x), host(state.x))
    again, _ = run(xp, algo, np.zeros(5), steps=2, rank=2)
    np.testing.assert_array_equal(host(again.x), host(state.x))


def test_noise_of_an_iteration_reaches_the_device_in_one_copy(xp):
    """All K blocks of an iteration are drawn on the host and copied over together."""
    if xp is np or not getattr(xp, "EMULATED", False):
        pytest.skip("counts host-to-device copies: needs the emulated CuPy's counters")
    algo = PPRS(samples=4, smoothing=0.5, lr=0.1, seed=2)
    comm = fake_comm(xp)
    state = algo.init(xp.zeros(6), comm)
    oracle = L1Oracle(np.zeros(6))
    oracle.center = xp.asarray(oracle.center)  # so that only the noise is copied
    xp.reset_transfers()
    for _ in range(3):
        algo.step(state, oracle, comm)
    assert xp.transfers["h2d"] == 3


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_pprs_with_gamma_zero_and_one_sample_is_pipelined_agd(xp, momentum):
    x0 = np.random.default_rng(0).standard_normal(7)
    box = Box(-0.8, 0.9)
    pprs, _ = run(xp, PPRS(samples=1, smoothing=0.0, lr=0.05, momentum=momentum), x0, 25, box=box)
    baseline = PipelinedAGD(lr=0.05, momentum=momentum) if momentum else PipelinedGD(lr=0.05)
    agd, _ = run(xp, baseline, x0, 25, box=box)
    np.testing.assert_array_equal(host(pprs.x), host(agd.x))


def test_agd_is_projected_nesterov_and_momentum_zero_is_projected_gd(xp):
    x0, c = np.array([2.0, -3.0, 0.1]), np.array([0.5, 0.5, 0.5])
    lr, mu = 0.1, 0.8
    state, _ = run(xp, PipelinedAGD(lr=lr, momentum=mu), x0, 6, box=Box(-1.0, 1.0), center=c)
    x, prev = np.clip(x0, -1, 1), np.clip(x0, -1, 1)
    for _ in range(6):
        y = x + mu * (x - prev)
        x, prev = np.clip(y - lr * np.sign(y - c), -1, 1), x
    np.testing.assert_allclose(host(state.x), x, rtol=1e-15)
    gd, _ = run(xp, PipelinedGD(lr=lr), x0, 6, center=c)
    x = x0.copy()
    for _ in range(6):
        x = x - lr * np.sign(x - c)
    np.testing.assert_allclose(host(gd.x), x, rtol=1e-15)


def test_accelerated_loop_matches_its_formulas(xp):
    r, lip, d, k, seed, steps = 2.0, 3.0, 16, 4, 5, 8
    x0 = np.linspace(-0.5, 0.5, d)
    c = np.linspace(-1, 1, d)
    algo = PPRS(samples=k, outer="accelerated", radius=r, lipschitz=lip, dimension=d, seed=seed)
    state, _ = run(xp, algo, x0, steps, box=Box(-0.9, 0.9), center=c)
    x = z = np.clip(x0, -0.9, 0.9)
    theta0, gsum, a = x.copy(), np.zeros(d), 1.0
    for t in range(steps):
        y = (1 - a) * x + a * z
        gamma = r * d ** -0.25 * a
        g = np.mean([np.sign(y + gamma * pprs_noise(seed, t, j, 0, d) - c)
                     for j in range(k)], axis=0)
        gsum = gsum + g / a
        a_next = 2 / (1 + math.sqrt(1 + 4 / a ** 2))
        eta = r * a_next / (2 * lip * (d ** 0.25 + math.sqrt((t + 2) / k)))
        z = np.clip(theta0 - eta * gsum, -0.9, 0.9)
        x = (1 - a) * x + a * z
        a = a_next
    np.testing.assert_allclose(host(state.x), x, rtol=1e-13)
    assert state.step == steps and state.alpha == pytest.approx(a)


def test_alpha_schedule_solves_the_estimate_sequence_equation():
    a = 1.0
    for _ in range(50):
        nxt = 2 / (1 + math.sqrt(1 + 4 / a ** 2))
        assert (1 - nxt) / nxt ** 2 == pytest.approx(1 / a ** 2)
        a = nxt
    assert a == pytest.approx(2 / 52, rel=0.1)


def test_init_projects_and_keeps_the_buffer(xp):
    x0 = xp.asarray([3.0, -3.0, 0.0])
    state = PPRS().init(x0, fake_comm(xp), Box(xp.asarray([-1, -1, -1.0]), 1.0))
    assert state.x is x0
    np.testing.assert_array_equal(host(x0), [1, -1, 0])


def test_theory_horizon():
    assert theory_horizon(1.0, 1.0, 16, 0.1) == (400, 25)


@pytest.mark.parametrize("kwargs,match", [
    ({"samples": 0}, "samples K"),
    ({"outer": "heavy"}, "unknown outer loop"),
    ({"lr": 0.0}, "lr must be"),
    ({"momentum": 1.0}, "momentum"),
    ({"smoothing": -0.5}, "smoothing"),
    ({"outer": "accelerated", "radius": 1, "lipschitz": 1, "dimension": 4, "smoothing": -2},
     "smoothing"),
])
def test_bad_hyper_parameters_are_user_errors(kwargs, match):
    with pytest.raises(HpcoptError, match=match):
        PPRS(**kwargs)


def test_the_accelerated_loop_needs_its_context_when_it_starts(xp):
    with pytest.raises(HpcoptError, match="needs radius"):
        PPRS(outer="accelerated").init(xp.zeros(3), fake_comm(xp))


def test_accelerated_smoothing_defaults_to_r_d_quarter_and_nesterov_to_1e_3():
    """gamma_t = R d^(-1/4) alpha_t unless smoothing is given (the configured default, -1)."""
    algo = PPRS(outer="accelerated", radius=2.0, lipschitz=1.0, dimension=16, smoothing=-1.0)
    assert algo.gamma_at(0.5) == 2.0 * 16 ** -0.25 * 0.5
    assert PPRS(outer="accelerated", radius=2.0, lipschitz=1.0, dimension=16,
                smoothing=0.3).gamma_at(0.5) == 0.3 * 0.5
    assert PPRS().gamma_at(0.5) == 1e-3 and PPRS(smoothing=0.2).gamma_at(0.5) == 0.2


def test_accelerated_pprs_meets_its_theoretical_accuracy_on_the_l1_chain(xp):
    """With the theory's T and K for eps, f(x_T) - f* <= eps (one stage, serial)."""
    from hpcopt.comm import Comm
    from hpcopt.problems.l1_chain import l1_chain
    from hpcopt.problems.staged import setup_stage

    problem = l1_chain(blocks=4, block_dim=3, rows=24, seed=0, xp=xp)
    d, eps = problem.params.size, 0.5 * problem.value(xp.asarray(problem.params))
    steps, samples = theory_horizon(problem.radius, problem.lipschitz, d, eps)
    assert (steps, samples) == (299, 22)
    comm = Comm(backend=fake_comm(xp).backend)
    try:
        setup = setup_stage(problem, comm)
        algo = PPRS(samples=samples, outer="accelerated", radius=problem.radius,
                    lipschitz=problem.lipschitz, dimension=d, seed=1)
        state = algo.init(setup.x0, comm)
        for _ in range(steps):
            algo.step(state, setup.pipeline.gradient, comm)
        assert setup.pipeline.loss(state.x) - problem.f_star <= eps
    finally:
        comm.free()
