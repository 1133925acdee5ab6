"""The pipeline executor and PPRS under MPI, with Delta = world size stages (1..4 ranks); the
gradient and PPRS tests also on CuPy arrays (the ``xp`` fixture)."""

import numpy as np
import pytest

from hpcopt.algorithms.pprs import PPRS, PipelinedAGD, pprs_noise
from hpcopt.backend import get_backend
from hpcopt.comm import node_layout
from hpcopt.errors import HpcoptError
from hpcopt.nn import Sequential, mlp, softmax_cross_entropy
from hpcopt.nn.perturbation import AdditivePerturbation
from hpcopt.pipeline import KINDS, Pipeline, StagePlan, ideal_bubble
from hpcopt.problems.l1_chain import l1_chain
from hpcopt.problems.staged import StagedProblem, setup_stage
from hpcopt.rng import stream
from tests.conftest import host

pytestmark = pytest.mark.mpi

BATCH, FEATURES, CLASSES = 4, 5, 3
#: Against the NumPy references on a GPU: its BLAS adds in another order than the CPU's.
GPU_TOLERANCE = dict(rtol=1e-10, atol=1e-12)


def on_device(comm, xp):
    """Put ``comm`` on the GPU of its node-local rank when ``xp`` is CuPy."""
    if xp is not np:
        comm.backend = get_backend("gpu", local_rank=node_layout(comm.mpi)[0])


def tanh_mlp(samples, seed=0, perturbation=False, xp=np):
    """A float64 tanh MLP with 4 parameter layers and a different minibatch per sample (in
    ``xp``); with ``perturbation``, a trainable input perturbation first and the MLP frozen."""
    net = mlp(FEATURES, [7, 6, 4], CLASSES, activation="tanh")
    layers = net.layers
    if perturbation:
        layers = [AdditivePerturbation((BATCH, FEATURES), name="delta"), *layers]
    model = Sequential(layers)
    params = np.zeros(model.layout.size)
    model.init(params, stream(seed, "init"))
    params += 0.01 * stream(seed, "shift").standard_normal(params.size)  # delta != 0 too
    rng = np.random.default_rng(seed + 1)
    xs = xp.asarray(rng.standard_normal((samples, BATCH, FEATURES)))
    ys = xp.asarray(rng.integers(0, CLASSES, (samples, BATCH)))
    frozen = frozenset({"fc1", "fc2", "fc3", "fc4"}) if perturbation else frozenset()
    return StagedProblem("mlp", model, params, (BATCH, FEATURES), lambda k: xs[k],
                         lambda k, out: softmax_cross_entropy(out, ys[k]), frozen=frozen)


def serial_mean_gradient(problem, params, samples):
    """(1/K) sum_k of the single-process loss and gradient over the per-sample minibatches."""
    full, total, loss = np.zeros_like(params), np.zeros_like(params), 0.0
    model = problem.model
    model.bind(params, full)
    for k in range(samples):
        value, dout = problem.sink(k, model.forward(problem.source(k)))
        model.backward(dout)
        total += full
        loss += float(value)
    return loss / samples, total / samples


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("samples", [1, 3, 8])
@pytest.mark.parametrize("frozen", [False, True])
def test_pipelined_gradient_equals_single_process_gradient(comm, xp, kind, samples, frozen):
    on_device(comm, xp)
    problem = tanh_mlp(samples, perturbation=frozen, xp=xp)
    setup = setup_stage(problem, comm, kind=kind)
    pipe = setup.pipeline
    grad = xp.zeros(pipe.trainable_size)
    loss = pipe.gradient(setup.x0, grad, samples)
    reference = tanh_mlp(samples, perturbation=frozen)
    want_loss, want = serial_mean_gradient(reference, reference.params, samples)
    mine = pipe.global_trainable
    np.testing.assert_allclose(host(grad), want[mine], **(dict(rtol=1e-12, atol=1e-15)
                                                          if xp is np else GPU_TOLERANCE))
    assert comm.allreduce_scalar(loss, label="test") == pytest.approx(want_loss, rel=1e-12)
    trainable = comm.allreduce_scalar(pipe.trainable_size, label="test")
    assert trainable == problem.trainable_mask().sum()
    if frozen and comm.size > 1:
        assert (pipe.trainable_size > 0) == (comm.rank == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_no_deadlock_over_a_grid_of_sample_counts(comm, kind):
    problem = tanh_mlp(128, seed=3)
    setup = setup_stage(problem, comm, kind=kind)
    grad = np.zeros(setup.pipeline.trainable_size)
    for samples in (1, 2, 3, 4, 5, 7, 16, 33, 128):
        setup.pipeline.gradient(setup.x0, grad, samples)
        _, want = serial_mean_gradient(problem, problem.params, samples)
        np.testing.assert_allclose(grad, want[setup.pipeline.global_trainable], rtol=1e-12,
                                   atol=1e-15)


def test_forward_only_loss_and_messages_per_iteration(comm):
    samples, iterations = 5, 3
    problem = tanh_mlp(samples)
    setup = setup_stage(problem, comm, label="pprs")
    pipe = setup.pipeline
    want_loss, _ = serial_mean_gradient(problem, problem.params, 1)
    assert comm.allreduce_scalar(pipe.loss(setup.x0), label="test") == pytest.approx(want_loss)
    comm.stats.reset()
    algo = PPRS(samples=samples, smoothing=0.1, lr=0.01)
    state = algo.init(setup.x0, comm)
    for _ in range(iterations):
        algo.step(state, pipe.gradient, comm)
    rows = {(op, label): (calls, nbytes) for op, label, calls, nbytes, _ in comm.stats.as_rows()}
    assert {op for op, _ in rows} <= {"send", "recv", "wait"}  # no collective at all
    n = samples * iterations
    act, grad = 8 * int(np.prod(pipe.out_shape)), 8 * int(np.prod(pipe.in_shape))
    expected = {}
    if not pipe.last:
        expected[("send", "pprs.activation")] = (n, n * act)
        expected[("recv", "pprs.gradient")] = (n, n * act)
    if not pipe.first:
        expected[("recv", "pprs.activation")] = (n, n * grad)
        expected[("send", "pprs.gradient")] = (n, n * grad)
    assert {key: rows[key] for key in rows if key[0] != "wait"} == expected
    timing = pipe.timing
    assert timing.iterations == iterations + 1 and timing.samples == n + 1
    assert timing.busy > 0 and 0 <= timing.bubble() < 1
    assert ideal_bubble(comm.size, samples) == (comm.size - 1) / (samples + comm.size - 1)


def test_pprs_with_gamma_zero_and_one_sample_equals_pipelined_agd(comm):
    problem = l1_chain(blocks=4, block_dim=3, rows=20, seed=2)
    runs = []
    for algo in (PPRS(samples=1, smoothing=0.0, lr=0.02, momentum=0.8),
                 PipelinedAGD(lr=0.02, momentum=0.8)):
        setup = setup_stage(problem, comm)
        state = algo.init(setup.x0, comm)
        for _ in range(15):
            algo.step(state, setup.pipeline.gradient, comm)
        runs.append(state.x)
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.parametrize("outer", ["nesterov", "accelerated"])
def test_pprs_equals_serial_reference_with_noise_rebuilt_from_its_keys(comm, xp, outer):
    """The pipelined run (NumPy or CuPy) against a serial NumPy reference."""
    on_device(comm, xp)
    problem = l1_chain(blocks=4, block_dim=3, rows=20, seed=4)
    samples, steps, seed, d = 3, 6, 9, problem.params.size
    algo = PPRS(samples=samples, outer=outer, lr=0.05, momentum=0.5, smoothing=0.3, seed=seed,
                radius=problem.radius, lipschitz=problem.lipschitz, dimension=d)
    setup = setup_stage(l1_chain(blocks=4, block_dim=3, rows=20, seed=4, xp=xp), comm)
    state = algo.init(setup.x0, comm)
    for _ in range(steps):
        algo.step(state, setup.pipeline.gradient, comm)
    plan = StagePlan.balanced(problem.model, comm.size)
    blocks = [plan.param_slice(problem.model, s) for s in range(comm.size)]

    def smoothed_gradient(y, t, gamma):
        g, total = np.zeros(d), np.zeros(d)
        for k in range(samples):
            noise = np.concatenate([pprs_noise(seed, t, k, s, b.stop - b.start)
                                    for s, b in enumerate(blocks)])
            problem.value_and_grad(y + gamma * noise, g)
            total += g
        return total / samples

    x = prev = z = problem.params.copy()
    gsum, a = np.zeros(d), 1.0
    for t in range(steps):
        if outer == "nesterov":
            y = x + 0.5 * (x - prev)
            x, prev = y - 0.05 * smoothed_gradient(y, t, 0.3), x
        else:
            y = (1 - a) * x + a * z
            gsum = gsum + smoothed_gradient(y, t, algo.gamma_at(a)) / a
            a_next = 2 / (1 + np.sqrt(1 + 4 / a ** 2))
            z = problem.params - algo.eta(t + 1, a_next) * gsum
            x = (1 - a) * x + a * z
            a = a_next
    assert isinstance(state.x, xp.ndarray)
    np.testing.assert_allclose(host(state.x), x[setup.pipeline.global_trainable],
                               **(dict(rtol=1e-11, atol=1e-13) if xp is np else GPU_TOLERANCE))


@pytest.mark.parametrize("outer,samples,steps,reach", [("nesterov", 4, 60, 0.05),
                                                      ("accelerated", 4, 100, 0.35)])
def test_pprs_converges_on_the_l1_chain(comm, outer, samples, steps, reach):
    problem = l1_chain(blocks=4, block_dim=3, rows=24, seed=0)
    algo = PPRS(samples=samples, outer=outer, lr=0.01, momentum=0.9, smoothing=0.01, seed=1,
                radius=problem.radius, lipschitz=problem.lipschitz, dimension=problem.params.size)
    setup = setup_stage(problem, comm)
    state = algo.init(setup.x0, comm)
    start = comm.allreduce_scalar(setup.pipeline.loss(state.x), label="test")
    for _ in range(steps):
        algo.step(state, setup.pipeline.gradient, comm)
    end = comm.allreduce_scalar(setup.pipeline.loss(state.x), label="test")
    assert start == pytest.approx(problem.value(problem.params))
    assert end < reach * start  # f* = 0


def test_frozen_stages_stay_fixed_and_the_box_holds(comm):
    problem = tanh_mlp(4, perturbation=True)
    n = BATCH * FEATURES
    problem.lower = np.full(problem.params.size, -np.inf)
    problem.upper = np.full(problem.params.size, np.inf)
    problem.lower[:n], problem.upper[:n] = -0.05, 0.05
    setup = setup_stage(problem, comm)
    frozen_before = setup.pipeline.params.copy()
    algo = PPRS(samples=4, smoothing=0.01, lr=0.5)
    state = algo.init(setup.x0, comm, setup.box)
    losses = [comm.allreduce_scalar(algo.step(state, setup.pipeline.gradient, comm), label="test")
              for _ in range(20)]
    tr = setup.pipeline.trainable
    after = setup.pipeline.params
    np.testing.assert_array_equal(np.delete(after, np.arange(tr.start, tr.stop)),
                                  np.delete(frozen_before, np.arange(tr.start, tr.stop)))
    assert (np.abs(state.x) <= 0.05).all()
    assert losses[-1] < losses[0]


def test_world_size_must_equal_the_number_of_stages(comm):
    model = mlp(3, [3] * 5, 2)
    plan = StagePlan.explicit(model, list(range(2, 2 * comm.size + 1, 2)))  # size + 1 stages
    with pytest.raises(HpcoptError, match=f"{comm.size + 1} stage\\(s\\) but runs on {comm.size}"):
        Pipeline(model, plan, np.zeros(1), comm, (1, 3), source=lambda k: 0, sink=lambda k, o: 0)
    assert comm.stats.as_rows() == []
