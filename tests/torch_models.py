"""Small torch modules the tests name on the command line (``--model torch:tests.torch_models:NAME``)."""

from torch import nn


def bn_cnn() -> nn.Module:
    """A conv net with batch norm (float buffers and an integer num_batches_tracked)."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 10))


def not_a_module() -> str:
    return "a string"
