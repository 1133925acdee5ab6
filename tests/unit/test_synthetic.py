"""Synthetic problems: gradients against finite differences, x_star a true minimizer."""

import numpy as np
import pytest

from hpcopt.data.synthetic import SyntheticProblem, least_squares, logistic_regression
from hpcopt.errors import HpcoptError

PROBLEMS = {
    "least_squares": lambda: least_squares(n=60, d=5, noise=0.3, seed=1),
    "least_squares_wide": lambda: least_squares(n=4, d=9, noise=0.3, seed=1),
    "logistic": lambda: logistic_regression(n=80, d=6, l2=1e-2, seed=2),
    "logistic_weak_l2": lambda: logistic_regression(n=300, d=20, l2=1e-5, seed=3),
}


def central_differences(f, x, eps=1e-6):
    grad = np.zeros_like(x)
    for i in range(x.size):
        step = np.zeros_like(x)
        step[i] = eps
        grad[i] = (f(x + step) - f(x - step)) / (2 * eps)
    return grad


@pytest.fixture(params=sorted(PROBLEMS))
def problem(request) -> SyntheticProblem:
    return PROBLEMS[request.param]()


def test_gradient_matches_finite_differences(problem):
    x = np.random.default_rng(0).standard_normal(problem.x_star.size)
    idx = np.array([0, 3, 2, 3])
    for rows in (None, idx):
        numeric = central_differences(lambda z: problem.loss(z, rows), x)
        np.testing.assert_allclose(problem.gradient(x, rows), numeric, rtol=1e-6, atol=1e-7)


def test_x_star_is_a_minimizer(problem):
    assert np.linalg.norm(problem.gradient(problem.x_star)) < 1e-10
    assert problem.f_star == pytest.approx(problem.loss(problem.x_star), abs=1e-15)
    rng = np.random.default_rng(1)
    for _ in range(5):
        nearby = problem.x_star + 1e-3 * rng.standard_normal(problem.x_star.size)
        assert problem.loss(nearby) > problem.f_star


def test_least_squares_matches_the_normal_equations():
    p = least_squares(n=50, d=4, noise=0.5, seed=0)
    a, b = p.features, p.targets
    np.testing.assert_allclose(p.x_star, np.linalg.solve(a.T @ a, a.T @ b), rtol=1e-10)
    assert p.loss(p.x_star) == pytest.approx(np.sum((a @ p.x_star - b) ** 2) / 100)
    assert least_squares(n=50, d=4, noise=0.0, seed=0).f_star < 1e-25


def test_logistic_regression_data_and_tight_optimum():
    p = logistic_regression(n=200, d=8, l2=1e-3, seed=4)
    assert set(np.unique(p.targets)) == {0, 1} and p.targets.dtype == np.int64
    assert p.features.dtype == np.float64 and p.features.shape == (200, 8)
    assert np.linalg.norm(p.gradient(p.x_star)) < 1e-12
    # the loss at 0 is log 2 for any data; the optimum is strictly better
    assert p.loss(np.zeros(8)) == pytest.approx(np.log(2))
    assert p.f_star < np.log(2)


def test_problems_are_deterministic_per_seed():
    a, b = logistic_regression(50, 3, 0.1, seed=9), logistic_regression(50, 3, 0.1, seed=9)
    assert np.array_equal(a.features, b.features) and np.array_equal(a.x_star, b.x_star)
    assert not np.array_equal(a.features, logistic_regression(50, 3, 0.1, seed=10).features)


@pytest.mark.parametrize("make, message", [
    (lambda: logistic_regression(10, 2, 0.0, 0), "l2 must be positive"),
    (lambda: least_squares(10, 2, -1.0, 0), "noise must be non-negative"),
    (lambda: least_squares(0, 2, 0.1, 0), "n >= 1 and d >= 1"),
])
def test_bad_parameters_are_user_errors(make, message):
    with pytest.raises(HpcoptError, match=message):
        make()
