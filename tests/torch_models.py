"""Small torch modules the tests name on the command line (``--model torch:tests.torch_models:NAME``)."""

import torch
from torch import nn


def bn_cnn() -> nn.Module:
    """A conv net with batch norm (float buffers and an integer num_batches_tracked)."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 10))


def not_a_module() -> str:
    return "a string"


# -- modules that cannot train on digits (1-channel 8x8 images, 10 classes): refused at build --

def rgb_cnn() -> nn.Module:
    """A first layer for 3-channel images (like torchvision's ResNet-18)."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, 10))


def five_classes() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 5))


def all_frozen() -> nn.Module:
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    module.requires_grad_(False)
    return module


def no_parameters() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.AdaptiveAvgPool1d(10))


def half_precision() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).half()


class ScoresOutput:
    """What a Hugging Face model returns: an object whose ``.logits`` are the scores."""

    def __init__(self, logits):
        self.logits = logits


class LogitsOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 10)

    def forward(self, x):
        return ScoresOutput(self.linear(x.flatten(1)))


def logits_output() -> nn.Module:
    return LogitsOutput()


def tiny_lm(vocab: int) -> nn.Module:
    """A language model for a ``vocab``-token corpus: (batch, time) ids to (batch, time, vocab)."""
    return nn.Sequential(nn.Embedding(vocab, 8), nn.Linear(8, vocab))


class CountingCarriedLSTM(nn.Module):
    """A word LSTM carrying its state (h, c), with an integer buffer counting its forwards:
    both are per-rank state a checkpoint must carry."""

    def __init__(self, vocab: int, width: int = 8) -> None:
        super().__init__()
        from hpcopt.torch.models import word_lstm_carried

        self.lm = word_lstm_carried(vocab, embedding=width, hidden=width)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, tokens, state=None):
        self.calls += 1
        return self.lm(tokens, state)


def tiny_carried_lm(vocab: int) -> nn.Module:
    """``CountingCarriedLSTM`` for a ``vocab``-token corpus (``--model torch:...`` on a corpus)."""
    return CountingCarriedLSTM(vocab)
