"""The inner and outer optimizers without MPI: AdamW and the Nesterov outer step are PyTorch's
(torch.optim.AdamW, torch.optim.SGD on the pseudo-gradient), the outer step's state is shared
and allocated only where it is used, and options that do not apply are refused with one line."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt.algorithms.inner import adamw_step
from hpcopt.algorithms.muon import muon_step, newton_schulz5
from hpcopt.algorithms.outer import OuterOptimizer
from hpcopt.build import build_algorithm
from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from tests.registered import refused


def gradients(count: int, d: int = 7) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.standard_normal(d) * 10.0 ** rng.integers(-3, 2) for _ in range(count)]


@pytest.mark.extra
@pytest.mark.parametrize("lr, weight_decay, betas, eps", [
    (1e-2, 0.0, (0.9, 0.999), 1e-8),
    (3e-3, 0.1, (0.8, 0.95), 1e-6),
])
def test_adamw_is_pytorchs(lr, weight_decay, betas, eps):
    torch = pytest.importorskip("torch")
    x = np.linspace(-1, 1, 7)
    m, v = np.zeros_like(x), np.zeros_like(x)
    param = torch.nn.Parameter(torch.tensor(x.copy()))
    reference = torch.optim.AdamW([param], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    for k, g in enumerate(gradients(12), start=1):
        param.grad = torch.tensor(g.copy())
        reference.step()
        adamw_step(x, g.copy(), m, v, lr, beta1=betas[0], beta2=betas[1], eps=eps,
                   weight_decay=weight_decay, k1=k, k2=k)
    np.testing.assert_allclose(x, param.detach().numpy(), rtol=1e-13, atol=1e-15)
    state = reference.state[param]
    np.testing.assert_allclose(m, state["exp_avg"].numpy(), rtol=1e-13)
    np.testing.assert_allclose(v, state["exp_avg_sq"].numpy(), rtol=1e-13)


@pytest.mark.extra
@pytest.mark.parametrize("kind, nesterov", [("nesterov", True), ("sgd", False)])
def test_the_outer_step_is_pytorchs_sgd_on_the_pseudo_gradient(kind, nesterov):
    """DiLoCo's outer step: torch.optim.SGD(nesterov=True) on the anchor, with the gradient
    anchor - mean; sgd with momentum: the same with heavy ball."""
    torch = pytest.importorskip("torch")
    x0 = np.linspace(-1, 1, 7)
    outer = OuterOptimizer(kind, lr=0.7, momentum=0.9)
    state = outer.new_state(x0)
    anchor = state["anchor"]
    param = torch.nn.Parameter(torch.tensor(x0.copy()))
    reference = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=nesterov)
    for g in gradients(6):
        mean = anchor - g * 1e-2  # the round's average, as the ranks' models moved from anchor
        param.grad = torch.tensor(param.detach().numpy() - mean)
        reference.step()
        x = mean.copy()
        outer.step(x, state, np.empty_like(x), eta=0.1)
        np.testing.assert_array_equal(x, anchor)  # every rank continues from the new anchor
        np.testing.assert_allclose(anchor, param.detach().numpy(), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("kind, momentum, has_anchor, has_buffer", [
    ("average", 0.0, False, False),
    ("sgd", 0.0, True, False),
    ("sgd", 0.5, True, True),
    ("nesterov", 0.9, True, True),
    ("slowmo", 0.0, True, True),  # SlowMo's state always held its slow momentum buffer
])
def test_the_outer_state_is_allocated_only_where_it_is_used(kind, momentum, has_anchor, has_buffer):
    x = np.arange(4.0)
    state = OuterOptimizer(kind, 1.0, momentum).new_state(x)
    anchor, buffer = state["anchor"], state["outer_buffer"]
    assert (anchor is not None, buffer is not None) == (has_anchor, has_buffer)
    if anchor is not None:
        np.testing.assert_array_equal(anchor, x)
        assert anchor is not x
    if buffer is not None:
        assert not buffer.any() and buffer.dtype == x.dtype


def test_sgd_with_unit_lr_and_no_momentum_is_the_average_to_rounding():
    anchor, mean = np.linspace(-1, 1, 9), np.linspace(-0.5, 2, 9)
    x = mean.copy()
    OuterOptimizer("sgd", 1.0, 0.0).step(x, {"anchor": anchor, "outer_buffer": None},
                                         np.empty_like(x), eta=0.1)
    np.testing.assert_allclose(x, mean, rtol=0, atol=1e-15)


def test_diloco_is_a_preset_of_prsgd():
    diloco = build_config(None, {"algorithm": "diloco"}).algorithm
    prsgd = build_config(None, {"outer_optimizer": "nesterov", "outer_lr": "0.7",
                                "outer_momentum": "0.9", "inner_optimizer": "adamw",
                                "lr": "0.001", "weight_decay": "0.01"}).algorithm
    assert {k: v for k, v in diloco.__dict__.items() if k != "algorithm"} == \
        {k: v for k, v in prsgd.__dict__.items() if k != "algorithm"}


@pytest.mark.parametrize("options, lr, momentum", [
    ({}, 0.7, 0.9),                                   # DiLoCo's outer step
    ({"outer_lr": "0.5"}, 0.5, 0.9),
    ({"outer_momentum": "0.5"}, 1.0, 0.5),            # as before: a set momentum keeps lr 1
    ({"outer_lr": "0.3", "outer_momentum": "0.8"}, 0.3, 0.8),
])
def test_nesterov_takes_dilocos_outer_step_where_its_options_are_left(options, lr, momentum):
    algorithm = build_algorithm(build_config(None, {"outer_optimizer": "nesterov", **options}), 2, 16)
    assert algorithm.outer == OuterOptimizer("nesterov", lr, momentum)
    assert algorithm.describe_optimizers().endswith(f"outer nesterov (lr {lr:g}, mu {momentum:g})")


@pytest.mark.parametrize("kind", ["fedadam", "fedyogi"])
def test_fedadam_and_fedyogi_are_the_papers_update_with_their_defaults(kind):
    """Reddi et al. 2021, Algorithm 2 (m from 0, v from tau^2, no bias correction), over six
    rounds on an anchor that moves; left alone, the options give b1 0.9, b2 0.99, tau 1e-3 and
    our lr 0.01."""
    algorithm = build_algorithm(build_config(None, {"outer_optimizer": kind}), 2, 16)
    outer = algorithm.outer
    assert (outer.lr, outer.beta1, outer.beta2, outer.tau) == (0.01, 0.9, 0.99, 1e-3)
    assert algorithm.describe_optimizers() == f", outer {kind} (lr 0.01, betas 0.9, 0.99, tau 0.001)"
    assert algorithm.state_vectors() == (0, 3)
    x0 = np.linspace(-1, 1, 7)
    state = outer.new_state(x0)
    anchor, m, v = x0.copy(), np.zeros(7), np.full(7, 1e-6)
    for g in gradients(6):
        mean = state["anchor"] - g * 1e-2
        delta = anchor - mean
        m = 0.9 * m + 0.1 * delta
        v = (0.99 * v + 0.01 * delta ** 2 if kind == "fedadam"
             else v - 0.01 * delta ** 2 * np.sign(v - delta ** 2))
        anchor = anchor - 0.01 * m / (np.sqrt(v) + 1e-3)
        outer.step(mean, state, np.empty(7), eta=0.1)
        np.testing.assert_array_equal(mean, state["anchor"])
        np.testing.assert_allclose(state["anchor"], anchor, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(state["outer_exp_avg_sq"], v, rtol=1e-13)
    assert not np.allclose(state["outer_exp_avg_sq"], 1e-6)


@pytest.mark.parametrize("shape", [(6, 6), (12, 5), (4, 9)])
def test_newton_schulz_takes_the_singular_values_near_one_and_keeps_the_singular_vectors(shape):
    """NS5 of G = U S V^T is about U V^T: its singular values within about [0.7, 1.2] (the
    quintic's band, Jordan et al. 2024) and U^T NS5(G) V diagonal, whatever the scale of S."""
    rng = np.random.default_rng(1)
    g = rng.standard_normal(shape) * 1e-3
    u, singular, vt = np.linalg.svd(g, full_matrices=False)
    out = newton_schulz5(g)
    assert out.shape == shape
    values = np.linalg.svd(out, compute_uv=False)
    assert values.min() > 0.6 and values.max() < 1.25, values
    rotated = u.T @ out @ vt.T
    np.testing.assert_allclose(rotated, np.diag(np.diag(rotated)), atol=1e-10)


def test_muon_orthogonalises_the_matrices_and_steps_the_rest_with_sgd():
    """One heavy-ball Muon step: the (3, 2) weight's direction is NS5(b) sqrt(3 / 2), the bias's
    is b itself; the buffer is b = g (not the orthogonalised direction); decay is decoupled."""
    rng = np.random.default_rng(2)
    x, g = rng.standard_normal(8), rng.standard_normal(8)
    buffer = np.zeros(8)
    expected = x * (1 - 0.1 * 0.5)
    expected[:6] -= 0.1 * newton_schulz5(g[:6].reshape(3, 2)).ravel() * np.sqrt(1.5)
    expected[6:] -= 0.1 * g[6:]
    muon_step(x, g.copy(), buffer, 0.1, shapes=((3, 2), (2,)), momentum=0.9, nesterov=False,
              weight_decay=0.5)
    np.testing.assert_allclose(x, expected, rtol=1e-14)
    np.testing.assert_array_equal(buffer, g)


def test_muon_needs_the_parameter_shapes():
    algorithm = build_algorithm(build_config(None, {"inner_optimizer": "muon", "momentum": "0.9"}), 1, 8)
    with pytest.raises(HpcoptError, match="inner_optimizer muon needs the shapes"):
        algorithm.init(np.zeros(5), None)


@pytest.mark.parametrize("options, message", [
    ({"outer_optimizer": "adam"}, "unknown outer_optimizer 'adam' "
                                  r"\(choose from average, sgd, nesterov, slowmo, fedadam, fedyogi\)"),
    ({"outer_optimizer": "nesterov", "outer_beta2": 0.9},
     "outer_beta2 applies only to outer_optimizer fedadam, fedyogi, not nesterov"),
    ({"outer_tau": 0.1}, "outer_tau applies only to outer_optimizer fedadam, fedyogi, not average"),
    ({"outer_optimizer": "fedadam", "outer_beta2": 1}, r"outer_beta2 must be in \[0, 1\), got 1.0"),
    ({"outer_optimizer": "fedyogi", "outer_tau": 0}, "outer_tau must be > 0, got 0.0"),
    ({"outer_lr": 0.7}, "outer_lr applies only to outer_optimizer sgd, nesterov, slowmo, fedadam, "
                        "fedyogi, not average"),
    ({"outer_momentum": 0.9}, "outer_momentum applies only to outer_optimizer sgd, nesterov"),
    ({"outer_optimizer": "sgd", "outer_lr": 0}, "outer_lr must be > 0, got 0.0"),
    ({"outer_optimizer": "sgd", "outer_lr": "inf"}, "outer_lr must be > 0, got inf"),
    ({"outer_optimizer": "sgd", "outer_momentum": 1}, r"outer_momentum must be in \[0, 1\)"),
    ({"algorithm": "celgc", "outer_optimizer": "slowmo", "outer_momentum": -0.1},
     r"outer_momentum must be in \[0, 1\), got -0.1"),
    ({"algorithm": "slowmo", "outer_lr": 2}, refused("outer_lr", "slowmo")),
    ({"algorithm": "naive_clip", "interval": 1, "outer_optimizer": "sgd"},
     refused("outer_optimizer", "naive_clip")),
    ({"inner_optimizer": "adam"}, r"unknown inner_optimizer 'adam' \(choose from sgd, adamw, muon\)"),
    ({"inner_optimizer": "muon", "adam_beta1": 0.8},
     "adam_beta1 applies only to inner_optimizer adamw, not muon"),
    ({"adam_beta1": 0.8}, "adam_beta1 applies only to inner_optimizer adamw, not sgd"),
    ({"algorithm": "celgc", "adam_eps": 1e-6}, "adam_eps applies only to inner_optimizer adamw"),
    ({"inner_optimizer": "adamw", "adam_beta2": 1}, r"adam_beta2 must be in \[0, 1\), got 1.0"),
    ({"inner_optimizer": "adamw", "adam_eps": 0}, "adam_eps must be > 0, got 0.0"),
    ({"inner_optimizer": "adamw", "momentum": 0.9}, "momentum applies only to inner_optimizer sgd"),
    ({"second_moment_policy": "average"}, "second_moment_policy applies only to inner_optimizer adamw"),
    ({"inner_optimizer": "adamw", "second_moment_policy": "drop"}, "unknown second_moment_policy 'drop'"),
    ({"algorithm": "slowmo", "weight_decay": -1}, "weight_decay must be >= 0, got -1.0"),
    ({"algorithm": "pprs", "inner_optimizer": "adamw"}, refused("inner_optimizer", "pprs")),
])
def test_options_that_do_not_apply_are_refused(options, message):
    with pytest.raises(HpcoptError, match=message):
        build_config(None, {k: str(v) for k, v in options.items()})


@pytest.mark.parametrize("options, outer", [
    ({}, "outer nesterov (lr 0.7, mu 0.9)"),  # DiLoCo's own
    ({"outer_momentum": "0.5"}, "outer nesterov (lr 0.7, mu 0.5)"),
    ({"outer_optimizer": "fedadam"}, "outer fedadam (lr 0.01, betas 0.9, 0.99"),  # once lr 0.7: diverged
    ({"outer_optimizer": "fedadam", "outer_lr": "0.7"}, "outer fedadam (lr 0.7, betas 0.9, 0.99"),  # set: kept
    ({"outer_optimizer": "sgd"}, "outer sgd (lr 1)"),  # once heavy ball with DiLoCo's lr and mu
    ({"outer_optimizer": "average"}, ""),  # once refused: "outer_lr applies only to ..."
])
def test_dilocos_outer_defaults_do_not_leak_into_another_outer_optimizer(options, outer):
    """``--algorithm diloco``'s outer lr 0.7 and mu 0.9 are its Nesterov's: with another
    ``--outer-optimizer``, those the user leaves unset take that optimizer's own."""
    algorithm = build_algorithm(build_config(None, {"algorithm": "diloco", **options}), 2, 10)
    assert algorithm.outer.describe().startswith(outer), algorithm.outer.describe()
