"""Ready-made models built from the layers."""

from __future__ import annotations

from collections.abc import Sequence

from .batchnorm import BatchNorm
from .conv import Conv2d
from .layers import Layer, Linear, ReLU, Tanh
from .pooling import Flatten, GlobalAvgPool2d, MaxPool2d
from .residual import Residual, ShortcutA
from .sequential import Sequential

ACTIVATIONS = {"relu": ReLU, "tanh": Tanh}


def mlp(inputs: int, hidden: Sequence[int], outputs: int, activation: str = "relu") -> Sequential:
    """Multi-layer perceptron: Linear(fc1) -> act -> ... -> Linear(fcK), logits out."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r} (choose from {', '.join(ACTIVATIONS)})")
    sizes = [inputs, *hidden, outputs]
    layers: list[Layer] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        layers.append(Linear(fan_in, fan_out, name=f"fc{i}"))
        if i < len(sizes) - 1:
            layers.append(ACTIVATIONS[activation]())
    return Sequential(layers)


def basic_block(in_channels: int, out_channels: int, stride: int, name: str) -> Residual:
    """conv3x3(stride) -> BN -> ReLU -> conv3x3 -> BN, plus the identity or, when the shape
    changes, the option-A shortcut. Convolutions without bias (BN follows)."""
    branch = [
        Conv2d(in_channels, out_channels, 3, stride, 1, bias=False, name="conv1"),
        BatchNorm(out_channels, name="bn1"),
        ReLU(),
        Conv2d(out_channels, out_channels, 3, 1, 1, bias=False, name="conv2"),
        BatchNorm(out_channels, name="bn2"),
    ]
    reshapes = stride != 1 or in_channels != out_channels
    shortcut = ShortcutA(in_channels, out_channels, stride) if reshapes else None
    return Residual(branch, shortcut, name)


def resnet(depth: int, in_channels: int = 3, num_classes: int = 10, width: int = 16) -> Sequential:
    """CIFAR ResNet of He et al. 2016 (section 4.2): depth = 6n + 2 (8, 14, 20, 32, ...).

    conv3x3(width) -> BN -> ReLU, three stages of n basic blocks with width, 2 width, 4 width
    channels (the first block of stages 2 and 3 has stride 2 and an option-A shortcut), each
    block followed by ReLU, then global average pooling and a linear layer. Names: ``conv1``,
    ``bn1``, ``block1`` ... ``block{3n}`` (each with ``conv1, bn1, conv2, bn2``), ``fc``.
    ResNet-20 with width 16 has 269,722 parameters, as in the paper.
    """
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"ResNet depth must be 6n + 2 with n >= 1 (8, 14, 20, ...), got {depth}")
    if min(in_channels, num_classes, width) < 1:
        raise ValueError(f"resnet needs positive in_channels, num_classes and width, "
                         f"got {in_channels}, {num_classes}, {width}")
    blocks_per_stage = (depth - 2) // 6
    layers: list[Layer] = [
        Conv2d(in_channels, width, 3, 1, 1, bias=False, name="conv1"),
        BatchNorm(width, name="bn1"),
        ReLU(),
    ]
    channels, index = width, 0
    for stage, out_channels in enumerate((width, 2 * width, 4 * width)):
        for block in range(blocks_per_stage):
            index += 1
            stride = 2 if stage > 0 and block == 0 else 1
            layers += [basic_block(channels, out_channels, stride, f"block{index}"), ReLU()]
            channels = out_channels
    layers += [GlobalAvgPool2d(), Linear(channels, num_classes, name="fc")]
    return Sequential(layers)


def plain_cnn(in_channels: int, image_size: tuple[int, int], num_classes: int,
              channels: Sequence[int] = (32, 64), hidden: int = 128,
              batch_norm: bool = False) -> Sequential:
    """Per entry c of ``channels``: conv3x3(c, padding 1) [-> BN] -> ReLU -> 2x2 max-pool
    (``conv{i}``, ``bn{i}``); then flatten -> Linear(hidden) -> ReLU -> Linear(num_classes)
    (``fc1``, ``fc2``). Convolutions have a bias unless BN follows them."""
    height, width = image_size
    if min(in_channels, num_classes, hidden, *channels) < 1 or not channels:
        raise ValueError(f"plain_cnn needs positive sizes, got in_channels={in_channels}, "
                         f"channels={tuple(channels)}, hidden={hidden}, classes={num_classes}")
    layers: list[Layer] = []
    previous = in_channels
    for i, out_channels in enumerate(channels, start=1):
        height, width = height // 2, width // 2
        if height < 1 or width < 1:
            raise ValueError(f"image {image_size} is too small for {len(channels)} 2x2 poolings")
        layers.append(Conv2d(previous, out_channels, 3, 1, 1, bias=not batch_norm, name=f"conv{i}"))
        if batch_norm:
            layers.append(BatchNorm(out_channels, name=f"bn{i}"))
        layers += [ReLU(), MaxPool2d(2)]
        previous = out_channels
    layers += [Flatten(), Linear(previous * height * width, hidden, name="fc1"), ReLU(),
               Linear(hidden, num_classes, name="fc2")]
    return Sequential(layers)
