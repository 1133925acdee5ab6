"""What denormal floats cost a trained word LSTM's step: forward and backward timed on the final
model of each run given, with the CPU's flush-to-zero off (as hpcopt trains) and on.

The runs are ``hpcopt train --model torch:hpcopt.torch.models:word_lstm --dataset ptb`` runs
(e.g. those of ``benchmarks/reproduce/low_communication.py``); each run's newest checkpoint
gives the averaged model (``hpcopt.io.data_parallel_checkpoint.read_checkpoint``). One thread,
the same PTB windows for every model, the median over ``--windows`` batches; rounds alternate
between the models.

    python benchmarks/speed/denormals.py RUN [RUN ...] [--windows 20] [--batch 10] [--bptt 20]

Prints a table (ms per forward and backward, flush off and on, and their ratio), and the
share of the softmax's probabilities that are denormal (flush off; the most of any batch).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: hpcopt

from hpcopt.data.text import load_corpus  # noqa: E402
from hpcopt.io.data_parallel_checkpoint import read_checkpoint  # noqa: E402
from hpcopt.torch.models import word_lstm  # noqa: E402


def trained(run: Path, vocab: int) -> torch.nn.Module:
    """The word LSTM with the averaged model of ``run``'s newest checkpoint."""
    module = word_lstm(vocab)
    checkpoint = read_checkpoint(run)
    params = checkpoint.layout.views(checkpoint.model)
    for name, parameter in module.named_parameters():
        parameter.data.copy_(torch.as_tensor(params[name]))
    return module


def step_ms(module: torch.nn.Module, batch: torch.Tensor) -> tuple[float, float]:
    """ms of one forward and backward on ``batch`` (windows of bptt + 1 tokens), and the share
    of the softmax's probabilities that are denormal (what the cross-entropy's backward computes
    with: softmax - one-hot)."""
    start = time.perf_counter()
    scores = module(batch[:, :-1])
    loss = torch.nn.functional.cross_entropy(scores.reshape(-1, scores.shape[-1]), batch[:, 1:].reshape(-1))
    module.zero_grad()
    loss.backward()
    ms = 1e3 * (time.perf_counter() - start)
    probabilities = torch.softmax(scores.detach(), dim=-1)
    tiny = torch.finfo(probabilities.dtype).tiny
    denormal = ((probabilities != 0) & (probabilities < tiny)).double().mean().item()
    return ms, denormal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--windows", type=int, default=20, help="batches timed per model and mode")
    parser.add_argument("--batch", type=int, default=10, help="windows per batch")
    parser.add_argument("--bptt", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    corpus = load_corpus("ptb")
    size = args.windows * args.batch * (args.bptt + 1)
    tokens = torch.as_tensor(np.array(corpus.train[:size], dtype=np.int64))
    batches = tokens.reshape(args.windows, args.batch, args.bptt + 1)
    modules = {run: trained(run, corpus.vocab_size) for run in args.runs}
    times: dict[tuple[Path, bool], list[float]] = {}
    shares: dict[Path, float] = {}
    for batch in batches:
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            for run, module in modules.items():
                ms, share = step_ms(module, batch)
                times.setdefault((run, flush), []).append(ms)
                if not flush:
                    shares[run] = max(shares.get(run, 0.0), share)
    torch.set_flush_denormal(False)
    print("| run | ms, flush off | ms, flush on | off / on | denormal probabilities (most of a batch) |")
    print("|---|---:|---:|---:|---:|")
    for run in args.runs:
        off, on = (statistics.median(times[run, flush]) for flush in (False, True))
        print(f"| {run.name} | {off:.1f} | {on:.1f} | {off / on:.2f}x | {shares[run]:.2e} |")


if __name__ == "__main__":
    main()
