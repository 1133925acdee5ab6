"""LSTM forward + backward per step: hpcopt's NumPy LSTM against PyTorch CPU (``torch.nn.LSTM``).

Both run the same shapes, dtype and thread count (threadpoolctl for hpcopt's BLAS,
``torch.set_num_threads`` for PyTorch). ``--model layer`` times one LSTM layer over a (T, B,
inputs) window, backward into the weights, bias and input; ``--model lm`` a whole training
step of the character language model (embedding, LSTM layers, decoder, softmax cross-entropy,
backward), as ``hpcopt train --model lstm`` takes it. Cases are interleaved round by round so
machine noise hits them alike; the table gives the median time per step and the ratio
hpcopt / PyTorch (lower is better for hpcopt; the target is within 2x). Without torch
installed only hpcopt is measured.

    python benchmarks/speed/lstm.py [--model layer|lm] [--hidden 128 256] [--batch 16] [--bptt 50]
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
from hpcopt.nn.language_model import LSTMLanguageModel
from hpcopt.nn.lstm import LSTM

VOCAB = 76  # characters of the Shakespeare corpus


def hpcopt_step(args: argparse.Namespace, hidden: int) -> Callable[[], None]:
    """One forward + backward of hpcopt's LSTM layer (``layer``) or language model (``lm``)."""
    rng = np.random.default_rng(0)
    if args.model == "lm":
        model = LSTMLanguageModel(VOCAB, args.embed, hidden, args.layers)
        params = np.zeros(model.layout.size, dtype=args.dtype)
        model.init(params, rng)
        grads = np.zeros_like(params)
        tokens = rng.integers(0, VOCAB, (args.bptt + 1, args.batch))
        state = model.initial_state(args.batch, np, params.dtype)
        return lambda: model.loss_and_grad(params, grads, tokens[:-1], tokens[1:], state) and None
    layer = LSTM(args.embed, hidden)
    shapes = dict(layer.param_shapes())
    params = {k: np.zeros(s, dtype=args.dtype) for k, s in shapes.items()}
    layer.init_params(params, rng)
    layer.bind(params, {k: np.zeros_like(v) for k, v in params.items()})
    x = rng.standard_normal((args.bptt, args.batch, args.embed)).astype(args.dtype)
    dy = np.ones((args.bptt, args.batch, hidden), dtype=args.dtype)

    def step() -> None:
        layer.forward(x)
        layer.backward(dy, need_input_grad=True)

    return step


def torch_step(args: argparse.Namespace, hidden: int) -> Callable[[], None]:
    """The same computation in PyTorch (nn.LSTM, and for ``lm`` nn.Embedding and nn.Linear)."""
    import torch
    from torch import nn

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    if args.model == "lm":
        embedding = nn.Embedding(VOCAB, args.embed).to(dtype)
        lstm = nn.LSTM(args.embed, hidden, args.layers).to(dtype)
        decoder = nn.Linear(hidden, VOCAB).to(dtype)
        modules = nn.ModuleList([embedding, lstm, decoder])
        tokens = torch.randint(0, VOCAB, (args.bptt + 1, args.batch))

        def lm_step() -> None:
            modules.zero_grad(set_to_none=True)
            out, _ = lstm(embedding(tokens[:-1]))
            logits = decoder(out.reshape(-1, hidden))
            nn.functional.cross_entropy(logits, tokens[1:].reshape(-1)).backward()

        return lm_step
    lstm = nn.LSTM(args.embed, hidden).to(dtype)
    x = torch.randn(args.bptt, args.batch, args.embed, dtype=dtype, requires_grad=True)
    dy = torch.ones(args.bptt, args.batch, hidden, dtype=dtype)

    def step() -> None:
        lstm.zero_grad(set_to_none=True)
        x.grad = None
        lstm(x)[0].backward(dy)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["layer", "lm"], default="layer")
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--embed", type=int, default=32, help="input size of the (first) layer")
    parser.add_argument("--layers", type=int, default=1, help="LSTM layers (--model lm)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--bptt", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    add_timing_options(parser)
    args = parser.parse_args()
    what = (f"LM step (embed {args.embed}, {args.layers} layer(s), vocab {VOCAB})"
            if args.model == "lm" else f"LSTM layer ({args.embed} inputs)")
    print(f"{what}, T {args.bptt}, batch {args.batch}, {args.dtype}, {args.threads} thread(s); "
          f"{os.cpu_count()} cores; median of {args.rounds} rounds of {args.calls} calls")
    torch = optional_torch()
    if torch is not None:
        torch.set_num_threads(args.threads)
    print(f"{'hidden':>6} {'framework':>9} {'ms/step':>8} {'tokens/s':>9} {'vs torch':>8}")
    with threadpool_limits(limits=args.threads):
        for hidden in args.hidden:
            frameworks = {"hpcopt": hpcopt_step(args, hidden)}
            if torch is not None:
                frameworks["torch"] = torch_step(args, hidden)
            medians = interleaved_medians(frameworks, args.rounds, args.calls)
            for name, seconds in medians.items():
                print(f"{hidden:>6} {name:>9} {1e3 * seconds:>8.2f} "
                      f"{args.bptt * args.batch / seconds:>9,.0f} {ratio_to(medians, name):>8}",
                      flush=True)


if __name__ == "__main__":
    main()
