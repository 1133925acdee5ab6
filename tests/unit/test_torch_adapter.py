"""hpcopt.torch: a torch module on flat vectors gives torch's own gradients, shares memory
both ways, never updates frozen parameters, keeps integer buffers exact, resumes bitwise and
exports its state_dict without pickle."""

import copy

import numpy as np
import pytest

pytestmark = pytest.mark.extra
torch = pytest.importorskip("torch")

from hpcopt.algorithms.local_clip import LocalClip  # noqa: E402
from hpcopt.algorithms.local_sgd import LocalSGD  # noqa: E402
from hpcopt.errors import HpcoptError  # noqa: E402
from hpcopt.torch import (  # noqa: E402
    TensorData,
    TorchModel,
    load_state_dict,
    save_state_dict,
    torch_workload,
)
from hpcopt.torch.adapter import SPLIT  # noqa: E402

nn = torch.nn


def mlp():
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 3))


def conv_net():
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 3))


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 7, num_layers=2, batch_first=True)
        self.head = nn.Linear(7, 3)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


def inputs_for(name, n, generator):
    shape = {"mlp": (n, 6), "conv": (n, 2, 6, 6), "lstm": (n, 4, 5)}[name]
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


FACTORIES = {"mlp": mlp, "conv": conv_net, "lstm": LSTMClassifier}


def data(name, n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorData(inputs_for(name, n, g), torch.randint(0, 3, (n,), generator=g))


@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_oracle_gradient_is_torch_autograd_gradient(comm, name, dtype):
    run = torch_workload(FACTORIES[name], nn.CrossEntropyLoss(), data(name), comm, batch_size=8,
                          seed=1, dtype=dtype)
    reference = copy.deepcopy(run.problem.model.module)
    grads = np.full_like(run.x0, np.nan)  # stale values must not leak into the gradient
    state = run.problem.sampler.state()
    loss = run.problem.oracle(run.x0, grads)
    run.problem.sampler.restore(state)  # the same batch and dropout mask for the reference
    inputs, targets = run.problem.batches.next_batch()
    torch.default_generator.manual_seed(_seed_of(run, state))
    expected = nn.CrossEntropyLoss()(reference(inputs), targets)
    expected.backward()
    flat = torch.cat([p.grad.reshape(-1) for p in reference.parameters()]).numpy()
    assert grads.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(grads, flat)
    assert float(loss) == expected.item()


def _seed_of(run, state):
    from hpcopt.torch.problem import _mix

    return _mix(state["seed"], state["rank"], state["epoch"], state["position"])


def test_parameters_and_flat_vector_share_memory_both_ways():
    model = TorchModel(mlp().double())
    x = model.parameters_vector()
    grads = np.zeros_like(x)
    model.bind(x, grads)
    first = model.module[0]
    x[:3] = [1.5, 2.5, 3.5]
    assert first.weight.view(-1)[:3].tolist() == [1.5, 2.5, 3.5]
    with torch.no_grad():
        model.module[3].bias.fill_(-7.0)
    assert (x[-3:] == -7.0).all()
    assert first.weight.data_ptr() == x.ctypes.data
    assert first.weight.grad.data_ptr() == grads.ctypes.data
    grads[...] = np.nan  # stale values, overwritten even where the loss does not reach
    model.backward(model.module[:2](torch.randn(4, 6, dtype=torch.float64)).sum())
    assert first.weight.grad.data_ptr() == grads.ctypes.data
    assert np.isfinite(grads).all() and np.abs(grads).sum() > 0
    assert not model.module[3].weight.grad.any()  # the last layer took no part


class Tied(nn.Module):
    """An embedding whose weight is also the output layer's (as the word LSTM's and the GPT's)."""

    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids):
        return self.out(torch.tanh(self.embed(ids)))


def test_a_tied_parameter_gets_autograd_s_summed_gradient_once():
    model = TorchModel(Tied().double())
    reference = copy.deepcopy(model.module)
    x = model.parameters_vector()
    grads = np.full_like(x, np.nan)
    model.bind(x, grads)
    ids = torch.tensor([[0, 3, 4], [1, 1, 2]])
    model.backward(model.module(ids).square().sum())
    reference(ids).square().sum().backward()
    np.testing.assert_array_equal(grads, reference.embed.weight.grad.reshape(-1).numpy())


def test_a_backward_of_one_s_own_accumulates_into_the_bound_gradient_as_in_torch():
    model = TorchModel(mlp().double())
    x = model.parameters_vector()
    grads = np.zeros_like(x)
    model.bind(x, grads)
    model.module.eval()
    batch = torch.randn(4, 6, dtype=torch.float64)
    model.backward(model.module(batch).sum())
    once = grads.copy()
    model.module(batch).sum().backward()  # plain autograd: adds into .grad, the bound views
    np.testing.assert_array_equal(grads, 2 * once)
    assert model.module[0].weight.grad.data_ptr() == grads.ctypes.data


def test_glibc_malloc_settings_of_the_environment_are_left_alone(monkeypatch):
    from hpcopt.torch.allocator import glibc, keep_freed_memory, user_settings

    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    assert not user_settings()
    assert keep_freed_memory.__wrapped__() == glibc()
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")
    assert user_settings() and not keep_freed_memory.__wrapped__()
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert user_settings() and not keep_freed_memory.__wrapped__()


def test_binding_another_vector_rebinds_and_the_same_vector_is_free(monkeypatch):
    import hpcopt.torch.adapter as adapter

    model = TorchModel(mlp().double())
    a, b = model.parameters_vector(), model.parameters_vector() + 1
    model.bind(a)
    rebinds = []
    monkeypatch.setattr(adapter, "_point", lambda *args: rebinds.append(args))
    model.bind(a)
    assert rebinds == []
    monkeypatch.undo()
    model.bind(b)
    assert model.module[0].weight.data_ptr() == b.ctypes.data
    with pytest.raises(ValueError, match="float32"):
        model.bind(a.astype(np.float32))


def frozen_net():
    net = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 2))
    net[0].requires_grad_(False)
    return net


@pytest.mark.parametrize("algorithm", [
    LocalSGD(lr=0.1, interval=2, momentum=0.9),
    LocalClip(lr=0.1, interval=2, gamma=0.5, weight_decay=0.1, momentum=0.5),
])
def test_frozen_parameters_are_outside_the_vector_and_never_change(comm, algorithm):
    g = torch.Generator().manual_seed(3)
    data = TensorData(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    run = torch_workload(frozen_net, nn.CrossEntropyLoss(), data, comm, batch_size=8, dtype="float64")
    module = run.problem.model.module
    frozen = [p.detach().clone() for p in module[0].parameters()]
    trained = module[2].weight.detach().clone()
    assert run.problem.model.layout.names == ["1.weight", "1.bias", "2.weight", "2.bias"]
    assert run.problem.model.frozen_layout.names == ["0.weight", "0.bias"]
    assert run.problem.model.buffer_layout.names == ["1.running_mean", "1.running_var"]
    state = algorithm.init(run.x0, comm, buffers=run.buffers)
    for _ in range(5):
        algorithm.step(state, run.problem.oracle, comm)
    for before, after in zip(frozen, module[0].parameters()):
        assert torch.equal(before, after)
        assert after.grad is None
    assert not torch.equal(trained, module[2].weight)
    assert module[2].weight.data_ptr() == state.x[run.problem.model.layout.slices()["2.weight"]].ctypes.data
    assert module[1].num_batches_tracked.item() == 5


def test_integer_buffers_travel_exactly_through_a_float32_vector():
    model = TorchModel(conv_net(), dtype="float32")
    counter = model.module[1].num_batches_tracked
    counter.fill_(3 * SPLIT + 12345 + (1 << 40))
    vector = model.counters()
    assert vector.dtype == np.float32 and vector.size == 2
    counter.zero_()
    model.load_counters(vector)
    assert counter.item() == 3 * SPLIT + 12345 + (1 << 40)
    with pytest.raises(HpcoptError, match="integer buffer"):
        model.load_counters(np.zeros(4, np.float32))


def test_non_float_and_mixed_parameters_are_refused():
    net = nn.Linear(3, 2)
    net.register_parameter("steps", nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False))
    with pytest.raises(ValueError, match=r"float32 or float64 parameters only; .*steps \(torch.int64\)"):
        TorchModel(net)
    mixed = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="same dtype.*1.weight \\(torch.float64\\)"):
        TorchModel(mixed)
    with pytest.raises(ValueError, match="float16 is not supported"):
        TorchModel(nn.Linear(3, 2), dtype="float16")


def test_dtype_converts_the_module_and_the_data(comm):
    run = torch_workload(mlp, nn.CrossEntropyLoss(), data("mlp"), comm, batch_size=4, dtype="float32")
    assert run.x0.dtype == np.float32
    assert all(p.dtype == torch.float32 for p in run.problem.model.module.parameters())
    assert run.problem.batches.inputs.dtype == torch.float32
    assert run.problem.batches.targets.dtype == torch.int64


def test_a_resumed_sampler_gives_the_same_gradients_dropout_included(comm):
    def make():
        return torch_workload(mlp, nn.CrossEntropyLoss(), data("mlp", n=24), comm, batch_size=8,
                               seed=5, dtype="float64")

    first, second = make(), make()
    grads = np.zeros_like(first.x0)
    for _ in range(4):  # into the second epoch (3 batches per epoch)
        first.problem.oracle(first.x0, grads)
    second.problem.sampler.restore(first.problem.sampler.state())
    expected, got = np.zeros_like(grads), np.zeros_like(grads)
    first.problem.oracle(first.x0, expected)
    second.problem.oracle(second.x0, got)
    np.testing.assert_array_equal(got, expected)


def test_batch_factory_resumes_by_replaying_its_epoch(comm):
    def batches(rank, size, seed, epoch):
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        return [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g))
                for _ in range(3)]

    test = (torch.randn(10, 6), torch.randint(0, 3, (10,)))

    def make():
        return torch_workload(mlp, nn.CrossEntropyLoss(), batches, comm, batch_size=4, seed=2,
                               dtype="float64", test=test)

    first = make()
    served = [first.problem.batches.next_batch()[0] for _ in range(5)]
    second = make()
    second.problem.sampler.restore({**first.problem.sampler.state(), "position": 1})
    assert first.problem.sampler.state()["epoch"] == 1
    assert torch.equal(second.problem.batches.next_batch()[0], served[4])
    with pytest.raises(HpcoptError, match="needs a test set"):
        torch_workload(mlp, nn.CrossEntropyLoss(), batches, comm, batch_size=4)


def test_evaluate_reports_accuracy_and_leaves_the_binding_as_it_was(comm):
    run = torch_workload(conv_net, nn.CrossEntropyLoss(), data("conv", n=30), comm, batch_size=6,
                          dtype="float64")
    grads = np.zeros_like(run.x0)
    run.problem.oracle(run.x0, grads)
    stats = run.buffers.copy()
    other = run.x0 + 0.01
    result = run.evaluate(other, grads, comm, buffers=run.buffers * 2)
    module = run.problem.model.module
    assert result.samples == 30 and 0 <= result.accuracy <= 1 and np.isfinite(result.loss)
    assert module.training
    assert module[0].weight.data_ptr() == run.x0.ctypes.data
    assert module[1].running_mean.data_ptr() == run.buffers.ctypes.data
    np.testing.assert_array_equal(run.buffers, stats)  # eval mode: statistics untouched
    module.eval()
    with torch.no_grad():
        module[1].running_mean.mul_(2), module[1].running_var.mul_(2)
        run.problem.model.bind(other)
        inputs = torch.as_tensor(data("conv", n=30).inputs)
        expected = nn.CrossEntropyLoss()(module(inputs), torch.as_tensor(data("conv", n=30).targets))
    assert result.loss == pytest.approx(expected.item(), rel=1e-12)


def test_state_dict_export_round_trip(tmp_path):
    net = LSTMClassifier().double()
    model = TorchModel(conv_net())
    model.bind(model.parameters_vector())
    for module in (net, model.module):
        path = save_state_dict(module, tmp_path / "model.h5")
        loaded = load_state_dict(path)
        state = module.state_dict()
        assert list(loaded) == list(state)
        for name, tensor in state.items():
            assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor)
        fresh = copy.deepcopy(module)
        fresh.load_state_dict(loaded)
    import h5py

    with h5py.File(tmp_path / "model.h5") as f:  # plain HDF5: h5py alone reads it
        assert f["1.num_batches_tracked"][()] == 0


def test_state_dict_export_to_safetensors(tmp_path):
    pytest.importorskip("safetensors")
    net = conv_net()
    loaded = load_state_dict(save_state_dict(net, tmp_path / "model.safetensors"))
    assert all(torch.equal(loaded[k], v) for k, v in net.state_dict().items())


def test_the_run_header_counts_the_parameters_once(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-m", "hpcopt", "train", "--model", "torch:tests.torch_models:bn_cnn",
                           "--dataset", "digits", "--steps", "1", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0]
    assert header.count("parameters") == 1 and " parameters, float32)" in header, header
