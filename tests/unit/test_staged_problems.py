"""Staged problems: losses and gradients against finite differences, bounds, known optima."""

import numpy as np
import pytest

from hpcopt.data.datasets import load_dataset
from hpcopt.nn.margin import attack_margin, multiclass_hinge
from hpcopt.problems.attack import adversarial_attack, train_classifier
from hpcopt.problems.few_shot import accuracy, few_shot
from hpcopt.problems.l1_chain import l1_chain


def finite_differences(f, x, eps=1e-6):
    out = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = eps
        out[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return out


@pytest.mark.parametrize("loss", [multiclass_hinge, attack_margin])
def test_margin_losses_gradients_match_finite_differences(loss):
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((6, 4)) * 3, rng.integers(0, 4, 6)
    value, grad = loss(logits, labels)
    numeric = finite_differences(lambda z: float(loss(z.reshape(6, 4), labels)[0]), logits.ravel())
    np.testing.assert_allclose(grad.ravel(), numeric, atol=1e-8)
    margins = logits[np.arange(6), labels] - np.where(np.eye(4)[labels] > 0, -np.inf, logits).max(1)
    expected = {multiclass_hinge: np.maximum(0, 1 - margins).mean(),
                attack_margin: np.maximum(margins, 0.0).mean()}[loss]
    assert float(value) == pytest.approx(expected)


def test_l1_chain_has_its_known_minimum_and_lipschitz_bound():
    problem = l1_chain(blocks=3, block_dim=2, rows=10, seed=1)
    star = problem.extras["theta_star"]
    assert problem.value(star) == pytest.approx(0.0, abs=1e-14)
    assert problem.radius == pytest.approx(np.linalg.norm(star))
    rng = np.random.default_rng(2)
    for _ in range(5):
        x, g = rng.standard_normal(6), np.zeros(6)
        value = problem.value_and_grad(x, g)
        assert value > 0 and np.linalg.norm(g) <= problem.lipschitz
        np.testing.assert_allclose(g, finite_differences(problem.value, x), atol=1e-7)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_attack_problem_freezes_the_classifier_and_bounds_the_perturbation(digits):
    model, params = train_classifier(digits, hidden=(16,), epochs=2, seed=0)
    images = digits.x_test[:3] / 16
    problem = adversarial_attack(model, params, images, digits.y_test[:3], eps=0.1)
    n = images.size
    assert problem.frozen == {"fc1", "fc2"}
    mask = problem.trainable_mask()
    assert mask[:n].all() and not mask[n:].any()
    np.testing.assert_array_equal(problem.params[n:], params)
    lower, upper = problem.lower[:n], problem.upper[:n]
    assert (lower <= 0).all() and (upper >= 0).all() and (upper - lower <= 0.2 + 1e-15).all()
    assert (images.ravel() + lower >= 0).all() and (images.ravel() + upper <= 1).all()
    x, g = problem.params.copy(), np.zeros_like(problem.params)
    x[:n] = np.random.default_rng(0).uniform(lower, upper)
    problem.value_and_grad(x, g)

    def f(delta):
        y = x.copy()
        y[:n] = delta
        return problem.value(y)

    np.testing.assert_allclose(g[:n], finite_differences(f, x[:n]), atol=1e-6)


def test_few_shot_problem_uses_a_few_samples_per_class(digits):
    problem = few_shot(digits, shots=3, hidden=(8,), seed=4)
    features = problem.source(0)
    assert features.shape == (30, 64) and problem.input_shape == (30, 64)
    assert 0 <= features.min() and features.max() <= 1
    x, g = problem.params.copy(), np.zeros_like(problem.params)
    assert problem.value_and_grad(x, g) > 0 and np.abs(g).sum() > 0
    acc = accuracy(problem, x, problem.extras["test_features"], problem.extras["test_labels"])
    assert 0 <= acc <= 1
