"""A torch module trained by PR-SGD and CELGC under MPI at any world size equals a serial
float64 reference: N copies of the module in plain PyTorch, each on its rank's shard in its
sampler's order, updated and averaged in NumPy."""

import copy

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

torch = pytest.importorskip("torch")

from hpcopt.algorithms.local_clip import LocalClip  # noqa: E402
from hpcopt.algorithms.local_sgd import LocalSGD  # noqa: E402
from hpcopt.data.partition import partition_indices  # noqa: E402
from hpcopt.data.sampler import MinibatchSampler  # noqa: E402
from hpcopt.torch import TensorData, torch_workload  # noqa: E402
from tests.reference import celgc_reference  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.extra]

nn = torch.nn
SEED, BATCH, SAMPLES = 3, 6, 96


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Up to four ranks on shared cores: one BLAS and one torch thread each."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(threads)


def mlp():
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def mlp_batch_norm():
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def dataset():
    g = torch.Generator().manual_seed(7)
    return TensorData(torch.randn(SAMPLES, 5, generator=g, dtype=torch.float64),
                      torch.randint(0, 3, (SAMPLES,), generator=g))


def float_buffers(module):
    return [b for b in module.buffers() if b.is_floating_point()]


class ReferenceWorker:
    """Rank ``rank``'s oracle in plain PyTorch float64: its own copy of the module, its shard
    (the iid partition) in the order MinibatchSampler draws."""

    def __init__(self, factory, rank, size):
        torch.manual_seed(SEED)
        self.module = factory().double()
        data = dataset()
        shard = partition_indices("iid", SAMPLES, rank, size, SEED)
        self.inputs, self.targets = data.inputs[shard], data.targets[shard]
        self.sampler = MinibatchSampler(np.arange(shard.size), BATCH, SEED, rank)

    def __call__(self, x, g):
        params = list(self.module.parameters())
        nn.utils.vector_to_parameters(torch.from_numpy(x.copy()), params)
        index = torch.from_numpy(self.sampler.next_batch())
        self.module.zero_grad()
        nn.CrossEntropyLoss()(self.module(self.inputs[index]), self.targets[index]).backward()
        g[...] = nn.utils.parameters_to_vector([p.grad for p in params]).numpy()


def prsgd_reference(factory, size, steps, interval, lr, momentum=0.0, nesterov=False,
                    momentum_policy="keep"):
    """The N models (all equal after the last round) and batch-norm statistics of PR-SGD."""
    workers = [ReferenceWorker(factory, i, size) for i in range(size)]
    x0 = nn.utils.parameters_to_vector(workers[0].module.parameters()).detach().numpy()
    x = [x0.copy() for _ in workers]
    b = [np.zeros_like(x0) for _ in workers]
    for t in range(steps):
        for i, worker in enumerate(workers):
            g = np.zeros_like(x0)
            worker(x[i], g)
            if momentum:
                b[i] = momentum * b[i] + g
                g = g + momentum * b[i] if nesterov else b[i]
            x[i] = x[i] - lr * g
        if (t + 1) % interval == 0:
            mean = sum(x) / size
            x = [mean.copy() for _ in workers]
            if momentum_policy == "average":
                mean_b = sum(b) / size
                b = [mean_b.copy() for _ in workers]
            for stats in zip(*(float_buffers(w.module) for w in workers)):
                average = sum(s.clone() for s in stats) / size
                for s in stats:
                    s.copy_(average)
    buffers = [b.numpy().copy() for b in float_buffers(workers[0].module)]
    return x[0], np.concatenate(buffers) if buffers else None


def train(run, algorithm, comm, steps):
    state = algorithm.init(run.x0, comm, buffers=run.buffers)
    for _ in range(steps):
        algorithm.step(state, run.problem.oracle, comm)
    return state


CASES = [
    (mlp, dict(interval=4, lr=0.2)),
    (mlp, dict(interval=3, lr=0.1, momentum=0.9, nesterov=True, momentum_policy="average")),
    (mlp_batch_norm, dict(interval=2, lr=0.1, momentum=0.5)),
]


@pytest.mark.parametrize("factory, options", CASES)
def test_prsgd_on_a_torch_module_matches_the_serial_reference(comm, factory, options):
    steps = 12
    run = torch_workload(factory, nn.CrossEntropyLoss(), dataset(), comm, batch_size=BATCH,
                          seed=SEED, dtype="float64")
    state = train(run, LocalSGD(**options), comm, steps)
    expected_x, expected_buffers = prsgd_reference(factory, comm.size, steps, **options)
    np.testing.assert_allclose(state.x, expected_x, rtol=1e-10, atol=1e-12)
    if expected_buffers is not None:
        np.testing.assert_allclose(state.buffers, expected_buffers, rtol=1e-10, atol=1e-12)
        assert run.problem.model.module[1].num_batches_tracked.item() == steps
    # the module is the algorithm's vector, and a round is one allreduce of it
    assert state.x is run.x0
    assert run.problem.model.module[0].weight.data_ptr() == state.x.ctypes.data
    rounds = steps // options["interval"]
    assert [r[2:4] for r in comm.stats.as_rows() if r[1] == "average"] == [(rounds, rounds * state.x.nbytes)]


def test_celgc_on_a_torch_module_matches_the_serial_reference(comm):
    steps, options = 10, dict(interval=3, lr=0.3, gamma=0.2, momentum=0.5, weight_decay=0.01)
    run = torch_workload(mlp, nn.CrossEntropyLoss(), dataset(), comm, batch_size=BATCH,
                          seed=SEED, dtype="float64")
    state = train(run, LocalClip(**options), comm, steps)
    workers = [ReferenceWorker(mlp, i, comm.size) for i in range(comm.size)]
    x0 = nn.utils.parameters_to_vector(copy.deepcopy(workers[0].module).parameters()).detach().numpy()
    models, clips = celgc_reference(x0, workers, steps, options["interval"], lambda t: options["lr"],
                                    options["gamma"], options["lr"], momentum=options["momentum"],
                                    weight_decay=options["weight_decay"])
    np.testing.assert_allclose(state.x, models[comm.rank], rtol=1e-10, atol=1e-12)
    assert int(state.clip_count) == clips[comm.rank]
    assert 0 < sum(clips) < steps * comm.size  # the threshold matters, but not always


def test_a_command_line_torch_model_resumes_bitwise(comm, shared_dir):
    """``--model torch:...`` through hpcopt.train: the batch-norm statistics, the momentum and the
    integer buffers (ranks/hidden) go through a checkpoint, and the resumed run is the
    uninterrupted one, bit for bit."""
    import h5py

    from hpcopt.config import build_config
    from tests.runs import fresh_train

    def config(steps, out):
        return build_config(None, {"model": "torch:tests.torch_models:bn_cnn", "dataset": "digits",
                                   "steps": steps, "interval": "4", "lr": "0.1", "momentum": "0.9",
                                   "checkpoint_every": "6", "batch_size": "8", "out": str(out),
                                   "progress": "false"})

    _, whole = fresh_train(config("12", shared_dir / "whole"))
    fresh_train(config("6", shared_dir / "part"))
    summary, resumed = fresh_train(config("12", shared_dir / "part"), resume=shared_dir / "part")
    assert summary.steps == 12 and summary.final.accuracy > 0
    for name in ("x", "momentum", "buffers"):
        np.testing.assert_array_equal(getattr(resumed, name), getattr(whole, name))
    with h5py.File(shared_dir / "part" / "checkpoints" / "step-000000012.h5") as f:
        assert f["ranks/hidden"].shape[0] == comm.size  # num_batches_tracked, per rank
        assert "model/params/1.running_mean" not in f  # buffers are not parameters


def test_a_factory_that_is_not_importable_or_not_a_module_is_refused(comm):
    from hpcopt.config import build_config
    from hpcopt.errors import HpcoptError
    from tests.runs import fresh_train

    for spec, message in (("torch:tests.torch_models:missing", "cannot import missing"),
                          ("torch:tests.torch_models:not_a_module", "returned str, not a torch.nn.Module")):
        with pytest.raises(HpcoptError, match=message):
            fresh_train(build_config(None, {"model": spec, "dataset": "digits", "steps": "2"}))
