"""hpcopt.torch.models' ResNet-18 and GPT: their shapes and parameter counts, the GPT's
causality, and a few local steps through hpcopt that lower the loss."""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytestmark = pytest.mark.extra
torch = pytest.importorskip("torch")

from hpcopt.algorithms.local_sgd import LocalSGD  # noqa: E402
from hpcopt.torch import TensorData, language_workload, torch_workload  # noqa: E402
from hpcopt.torch.models import gpt, resnet18  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as a rank trains (the 11 M-parameter steps fight for the cores else)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def losses(run, comm, steps: int, lr: float) -> list[float]:
    algorithm = LocalSGD(lr=lr, momentum=0.9, interval=10**9)
    state = algorithm.init(run.x0, comm, buffers=run.buffers)
    return [float(algorithm.step(state, run.problem.oracle, comm)) for _ in range(steps)]


def test_resnet18_has_torchvisions_layout_and_trains(comm):
    model = resnet18()
    assert parameters(model) == 11_181_642  # torchvision.models.resnet18(num_classes=10)
    assert parameters(resnet18(channels=1, classes=100)) == 11_181_642 - 2 * 64 * 49 + 90 * 513
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(4, 3, 16, 16, generator=g), torch.tensor([0, 1, 2, 3]))
    run = torch_workload(resnet18, torch.nn.CrossEntropyLoss(), data, comm, batch_size=4,
                         dtype="float32")
    trained = losses(run, comm, 2, lr=0.02)  # the same four images every step
    assert all(np.isfinite(trained)) and trained[-1] < trained[0]


def test_gpt_counts_its_parameters_and_sees_only_earlier_tokens():
    width, vocab, context, layers = 128, 2560, 64, 2
    block = 12 * width * width + 13 * width  # attention 4 w^2 + 4 w, MLP 8 w^2 + 5 w, 2 norms
    expected = (vocab + context) * width + layers * block + 2 * width  # decoder tied
    assert parameters(gpt(vocab)) == expected == 732_672
    model = gpt(50, width=16, layers=1, heads=2, context=8).eval()
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 50
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert before.shape == (2, 8, 50)
    assert torch.equal(before[:, :5], after[:, :5]) and not torch.equal(before[:, 5:], after[:, 5:])
    with pytest.raises(ValueError, match="context is 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_gpt_trains_through_hpcopt(comm):
    stream = np.arange(400) % 7  # a cycle: each token's successor is learnable
    factory = functools.partial(gpt, 7, width=16, layers=1, heads=2, context=8)
    run = language_workload(factory, stream, stream[:80], comm, bptt=8, batch_size=8, dtype="float32")
    trained = losses(run, comm, 16, lr=0.2)
    assert np.mean(trained[-4:]) < 0.2 * np.mean(trained[:4])
