"""Convolution forward + backward throughput: hpcopt's im2col Conv2d against PyTorch CPU.

Both run the same shapes, dtype and thread count (threadpoolctl for hpcopt's BLAS,
``torch.set_num_threads`` for PyTorch); backward computes the weight, bias and input gradients
in both. Cases are interleaved round by round so machine noise hits them alike; the table gives
the median time per forward + backward and the ratio hpcopt / PyTorch (lower is better for
hpcopt). Without torch installed only hpcopt is measured. ``--model resnet20`` times a whole
training step (forward, cross-entropy, backward) of the CIFAR ResNet-20 instead, on
(batch, 3, 32, 32) images.

    python benchmarks/speed/conv.py [--batch 32] [--channels 16 16] [--size 32] [--threads 1 2]
    python benchmarks/speed/conv.py --model resnet20 [--batch 128] [--calls 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.versus import add_timing_options, interleaved_medians, optional_torch, ratio_to  # noqa: E402
from hpcopt.nn import Conv2d, Sequential, resnet, softmax_cross_entropy


def hpcopt_step(args: argparse.Namespace) -> Callable[[], None]:
    """One forward + backward (with the input gradient) of hpcopt's Conv2d."""
    rng = np.random.default_rng(0)
    cin, cout = args.channels
    model = Sequential([Conv2d(cin, cout, args.kernel, args.stride, args.padding, name="conv")])
    params = np.zeros(model.layout.size, dtype=args.dtype)
    model.init(params, rng)
    model.bind(params, np.zeros_like(params))
    x = rng.standard_normal((args.batch, cin, args.size, args.size)).astype(args.dtype)
    dy = np.ones_like(model.forward(x))

    def step() -> None:
        model.forward(x)
        model.backward(dy, need_input_grad=True)

    return step


def torch_step(args: argparse.Namespace) -> Callable[[], None]:
    """The same convolution in PyTorch: forward, then backward into x, weight and bias."""
    import torch

    cin, cout = args.channels
    dtype = getattr(torch, args.dtype)
    conv = torch.nn.Conv2d(cin, cout, args.kernel, args.stride, args.padding).to(dtype)
    x = torch.randn(args.batch, cin, args.size, args.size, dtype=dtype, requires_grad=True)
    dy = torch.ones_like(conv(x))

    def step() -> None:
        conv.zero_grad(set_to_none=True)
        x.grad = None
        conv(x).backward(dy)

    return step


def hpcopt_resnet20_step(args: argparse.Namespace) -> Callable[[], None]:
    """One training step of hpcopt's ResNet-20: forward, loss, backward (no input gradient)."""
    rng = np.random.default_rng(0)
    model = resnet(20)
    params = np.zeros(model.layout.size, dtype=args.dtype)
    buffers = np.zeros(model.buffer_layout.size, dtype=args.dtype)
    model.init(params, rng)
    model.init_buffers(buffers)
    model.bind(params, np.zeros_like(params))
    model.bind_buffers(buffers)
    x = rng.standard_normal((args.batch, 3, 32, 32)).astype(args.dtype)
    labels = rng.integers(0, 10, args.batch)

    def step() -> None:
        _, dlogits = softmax_cross_entropy(model.forward(x), labels)
        model.backward(dlogits)

    return step


def torch_resnet20_step(args: argparse.Namespace) -> Callable[[], None]:
    """The same ResNet-20 (option-A shortcuts, as in the CIFAR ResNet code) in PyTorch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)
            self.stride, self.pad = stride, (cout - cin) // 2

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            if self.stride != 1 or self.pad:
                x = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, self.pad, self.pad))
            return F.relu(out + x)

    layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    channels = 16
    for stage, cout in enumerate((16, 32, 64)):
        for block in range(3):
            layers.append(Block(channels, cout, 2 if stage and not block else 1))
            channels = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    dtype = getattr(torch, args.dtype)
    model = nn.Sequential(*layers).to(dtype)
    x = torch.randn(args.batch, 3, 32, 32, dtype=dtype)
    labels = torch.randint(0, 10, (args.batch,))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), labels).backward()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["conv", "resnet20"], default="conv")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--channels", type=int, nargs=2, default=[16, 16], metavar=("IN", "OUT"))
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--kernel", type=int, default=3)
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--padding", type=int, default=1)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    add_timing_options(parser)
    args = parser.parse_args()
    torch = optional_torch()
    ours, theirs = ((hpcopt_step, torch_step) if args.model == "conv"
                    else (hpcopt_resnet20_step, torch_resnet20_step))
    frameworks = {"hpcopt": ours(args)}
    if torch is not None:
        frameworks["torch"] = theirs(args)
    cin, cout = args.channels
    out = (args.size + 2 * args.padding - args.kernel) // args.stride + 1
    flops = 3 * 2 * args.batch * cout * out * out * cin * args.kernel ** 2  # fwd, dW, dx
    if args.model == "conv":
        print(f"conv {cin}->{cout}, {args.kernel}x{args.kernel}, stride {args.stride}, pad "
              f"{args.padding}, batch {args.batch}, {args.size}x{args.size}, {args.dtype}; ",
              end="")
    else:
        flops = 3 * 2 * args.batch * 40.6e6  # ResNet-20: 40.6 M multiply-adds per 32x32 image
        print(f"ResNet-20 training step, batch {args.batch}, 3x32x32, {args.dtype}; ", end="")
    print(f"{os.cpu_count()} cores; median of {args.rounds} rounds of {args.calls} calls")
    print(f"{'threads':>7} {'framework':>9} {'ms/step':>8} {'images/s':>9} {'GFLOP/s':>8} "
          f"{'vs torch':>8}")
    for threads in args.threads:
        if torch is not None:
            torch.set_num_threads(threads)
        with threadpool_limits(limits=threads):
            medians = interleaved_medians(frameworks, args.rounds, args.calls)
        for name, seconds in medians.items():
            print(f"{threads:>7} {name:>9} {1e3 * seconds:>8.2f} {args.batch / seconds:>9,.0f} "
                  f"{flops / seconds / 1e9:>8.1f} {ratio_to(medians, name):>8}")


if __name__ == "__main__":
    main()
