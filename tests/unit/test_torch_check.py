"""A torch module that cannot train is refused while the workload is built (hpcopt.torch.check):
an HpcoptError naming the --model spec and the data's shape, not a traceback at the first step;
the check's one forward and backward leave the module, its buffers and torch's generator as
they were."""

import numpy as np
import pytest

pytestmark = pytest.mark.extra
torch = pytest.importorskip("torch")

from hpcopt.backend import CPU  # noqa: E402
from hpcopt.config import build_config  # noqa: E402
from hpcopt.errors import HpcoptError  # noqa: E402
from hpcopt.torch import (  # noqa: E402
    TensorData,
    TorchModel,
    config_workload,
    language_workload,
    torch_workload,
)
from tests.torch_models import ScoresOutput  # noqa: E402

nn = torch.nn
DIGITS = "on digits (1x8x8 images, 10 classes): "

#: tests.torch_models factory -> what the refusal says after the spec and the data set
UNTRAINABLE = {
    "rgb_cnn": "the module cannot take a batch of inputs (8, 1, 8, 8) float32: RuntimeError: Given "
               "groups=1, weight of size [4, 3, 3, 3], expected input[8, 1, 8, 8] to have 3 channels",
    "five_classes": "the module maps a batch of inputs (8, 1, 8, 8) float32 to outputs (8, 5) float32, "
                    "but the data has 10 classes: its last layer must give 10 scores per sample",
    "all_frozen": "the module has no parameters to train: all 650 are frozen (requires_grad=False)",
    "no_parameters": "the module has no parameters to train",
    "half_precision": "hpcopt.torch trains float32 or float64 parameters only; this module has "
                      "1.weight (torch.float16), 1.bias (torch.float16)",
    "logits_output": "the module's forward returns ScoresOutput, not a tensor, on a batch of inputs "
                     "(8, 1, 8, 8) float32: return a tensor, e.g. `.logits`",
}


def digits_config(factory):
    return build_config(None, {"model": f"torch:tests.torch_models:{factory}", "dataset": "digits",
                               "steps": "2", "batch_size": "8"})


@pytest.mark.parametrize("factory", sorted(UNTRAINABLE))
def test_a_module_that_cannot_train_is_refused_naming_the_spec_and_the_data(comm, factory):
    with pytest.raises(HpcoptError) as refused:
        config_workload(digits_config(factory), comm, CPU)
    assert str(refused.value).startswith(f"--model torch:tests.torch_models:{factory} {DIGITS}"
                                         f"{UNTRAINABLE[factory]}"), str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_module_that_fits_is_built_as_before(comm):
    workload = config_workload(digits_config("bn_cnn"), comm, CPU)
    assert workload.layout.size == sum(p.numel() for p in workload.problem.model.module.parameters())


def test_the_header_names_the_data_set_of_a_torch_model(comm):
    """The run's header (its workload's description) names the data set, its split and a
    partition other than iid, as it does for the built-in models."""
    config = build_config(None, {"model": "torch:tests.torch_models:bn_cnn", "dataset": "digits",
                                 "steps": "2", "batch_size": "8", "partition": "block"})
    description = config_workload(config, comm, CPU).description
    assert description == "digits (1438 train / 359 test, partition block), torch Sequential, batch 8/rank"


def data(n=16, features=6, classes=3):
    g = torch.Generator().manual_seed(0)
    return TensorData(torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g))


class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x):
        return self.linear(x).detach()


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x):
        return self.linear(x), x


@pytest.mark.parametrize("factory,loss,message", [
    (Detached, nn.CrossEntropyLoss(), "does not depend on the trained parameters (does forward detach"),
    (Pair, nn.CrossEntropyLoss(), "returns tuple, not a tensor, on a batch of inputs (4, 6) float32: "
                                  "return a tensor, e.g. the scores alone"),
    (lambda: nn.Linear(6, 3), nn.CrossEntropyLoss(reduction="none"),
     "the loss of its outputs (4, 3) float32 on a batch of inputs (4, 6) float32 against targets (4,) "
     "int64 is a tensor (4,) float32, not one number"),
    (lambda: nn.Linear(6, 2), nn.CrossEntropyLoss(),
     "the loss fails on its outputs (4, 2) float32 on a batch of inputs (4, 6) float32 against targets "
     "(4,) int64: IndexError: Target 2 is out of bounds."),
])
def test_the_python_api_refuses_what_cannot_train_on_its_loss(comm, factory, loss, message):
    with pytest.raises(HpcoptError) as refused:
        torch_workload(factory, loss, data(), comm, batch_size=4, dtype="float32")
    assert message in str(refused.value)


def test_half_precision_is_an_hpcopt_error_from_torch_workload(comm):
    with pytest.raises(HpcoptError, match=r"float32 or float64 parameters only; .*\(torch.float16\)"):
        torch_workload(lambda: nn.Linear(6, 3).half(), nn.CrossEntropyLoss(), data(), comm, batch_size=4)


def test_a_lazy_module_is_refused_with_the_way_out():
    with pytest.raises(ValueError, match="0.weight, 0.bias are not initialized yet .*run the module once"):
        TorchModel(nn.Sequential(nn.LazyLinear(3)))


class LogitsLanguageModel(nn.Module):
    """A Hugging Face style language model: its forward returns an object with ``.logits``."""

    def __init__(self, vocab=7):
        super().__init__()
        self.embedding, self.head = nn.Embedding(vocab, 4), nn.Linear(4, vocab)

    def forward(self, tokens):
        return ScoresOutput(self.head(self.embedding(tokens)))


def test_a_language_model_returning_logits_output_is_refused_with_the_fix(comm):
    tokens = np.arange(60) % 7
    with pytest.raises(HpcoptError, match=r"returns ScoresOutput, not a tensor, on a batch of inputs "
                                          r"\(2, 5\) int64: return a tensor, e.g. `.logits`"):
        language_workload(LogitsLanguageModel, tokens, tokens, comm, bptt=5, batch_size=2)


def test_the_check_leaves_buffers_generator_and_gradients_as_they_were(comm):
    """The check's training forward would update batch-norm statistics and num_batches_tracked,
    its dropout would draw from torch's generator: all are put back."""
    factory = lambda: nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.5),  # noqa: E731
                                    nn.Linear(8, 3))
    generator = torch.get_rng_state()
    workload = torch_workload(factory, nn.CrossEntropyLoss(), data(), comm, batch_size=4,
                              dtype="float64", seed=2)
    assert torch.equal(torch.get_rng_state(), generator)
    module = workload.problem.model.module
    norm = module[1]
    np.testing.assert_array_equal(norm.running_mean.numpy(), np.zeros(8))
    np.testing.assert_array_equal(norm.running_var.numpy(), np.ones(8))
    assert norm.num_batches_tracked.item() == 0
    np.testing.assert_array_equal(workload.buffers, np.concatenate([np.zeros(8), np.ones(8)]))
    assert all(p.grad is None for p in module.parameters())
    assert module.training
    torch.manual_seed(2)
    np.testing.assert_array_equal(workload.x0, nn.utils.parameters_to_vector(factory().parameters())
                                  .double().detach().numpy())
