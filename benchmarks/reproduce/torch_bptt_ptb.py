"""A torch word LSTM on Penn Treebank with its state carried across windows, and without.

    mpiexec -n 2 python benchmarks/reproduce/torch_bptt_ptb.py [--steps 300] [--hidden 64]

Two ``hpcopt.train`` runs of CELGC, the same steps, seed, ranks and tokens per step: the word
LSTM of ``hpcopt.torch.models`` from a zero state in every window (``word_lstm``: random windows
of ``bptt`` tokens), and carrying its state (h, c) along contiguous streams (``word_lstm_carried``:
truncated BPTT). The two modules have the same parameters, so the averaged final model of each
run is evaluated on the valid split both ways: windows from a zero state, and streams with the
state carried. Rank 0 writes the section ``torch-bptt`` of ``docs/results/celgc-ptb.md``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common.sections import replace_section  # noqa: E402
import hpcopt  # noqa: E402
from hpcopt.data.text import load_corpus  # noqa: E402
from hpcopt.torch import evaluate_tokens, language_workload  # noqa: E402
from hpcopt.torch.models import word_lstm, word_lstm_carried  # noqa: E402

SEED = 0
MODES = {"zero state per window": word_lstm, "state carried": word_lstm_carried}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=10, help="windows (streams) per rank and step")
    parser.add_argument("--hidden", type=int, default=64, help="embedding and LSTM size (tied)")
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--eval-tokens", type=int, default=0, help="first N valid tokens only (0: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "celgc-ptb.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = hpcopt.Comm()
    corpus = load_corpus("ptb")
    valid = corpus.valid[:args.eval_tokens or None]
    options = {"algorithm": "celgc", "interval": "4", "lr": "20", "gamma": "5", "seed": str(SEED),
               "steps": str(args.steps), "progress": "false", "trace": "false"}
    workloads, results = {}, {}
    for mode, factory in MODES.items():
        module = functools.partial(factory, corpus.vocab_size, args.hidden, args.hidden)
        workloads[mode] = language_workload(module, corpus.train, valid, comm, bptt=args.bptt,
                                            batch_size=args.batch, seed=SEED, dtype="float32")
    for mode, workload in workloads.items():
        start = time.perf_counter()
        _, state = hpcopt.train(hpcopt.build_config(None, options), comm, verbose=False, workload=workload)
        wall = time.perf_counter() - start
        model = comm.average_(state.x.copy())  # the ranks' final models, averaged
        results[mode] = {"wall": wall, **{f"valid {other}": evaluate_tokens(w, model, valid, comm,
                                                                           bptt=args.bptt).perplexity
                                          for other, w in workloads.items()}}
    if comm.rank == 0:
        text = section(results, args, comm.size, corpus.vocab_size,
                       workloads["state carried"].layout.size, valid.size)
        replace_section(args.out, "torch-bptt", text)
        print(text)


def section(results: dict[str, dict], args: argparse.Namespace, ranks: int, vocab: int,
            parameters: int, valid_tokens: int) -> str:
    flags = (f"--steps {args.steps} --batch {args.batch} --hidden {args.hidden} --bptt {args.bptt}"
             + (f" --eval-tokens {args.eval_tokens}" if args.eval_tokens else ""))
    tokens = args.steps * ranks * args.batch * args.bptt
    (zz, zc), (cz, cc) = ((results[m]["valid zero state per window"], results[m]["valid state carried"])
                          for m in MODES)
    lines = [
        "## A torch word LSTM with its state carried across windows, and without",
        "",
        "<!-- docs-check",
        "needs: torch",
        f"tiny: {flags} => --steps 4 --batch 2 --hidden 8 --bptt 35 --eval-tokens 2000",
        "-->",
        "```bash",
        f"mpiexec -n {ranks} python benchmarks/reproduce/torch_bptt_ptb.py {flags}",
        "```",
        "",
        f"Two runs of CELGC (I = 4, eta = 20, gamma = 5, seed {SEED}, float32, one thread per rank) on "
        f"{ranks} ranks, {args.steps} steps of {args.batch} x {args.bptt} tokens per rank ({tokens:,} "
        f"training tokens, {tokens / 929_589:.2f} epochs of PTB), the torch word LSTM of "
        f"`hpcopt.torch.models` (embedding = hidden = {args.hidden}, tied, {parameters:,} parameters, "
        f"vocabulary {vocab:,}): `word_lstm` from a zero state in every window (random windows), "
        "`word_lstm_carried` carrying (h, c) along contiguous streams (truncated BPTT). The averaged "
        f"final model of each run is evaluated on {'the whole' if not args.eval_tokens else 'the first'} "
        f"{valid_tokens:,} valid tokens both ways: windows of {args.bptt} from a zero state, and "
        f"{min(args.batch, 10)} streams per rank with the state carried.",
        "",
        "| trained | valid ppl, zero state per window | valid ppl, state carried | train s |",
        "|---|---:|---:|---:|",
        *(f"| {mode} | {r['valid zero state per window']:.2f} | {r['valid state carried']:.2f} | "
          f"{r['wall']:.0f} |" for mode, r in results.items()),
        "",
        f"Each model evaluated the way it was trained: {zz:.2f} (zero state) against {cc:.2f} "
        f"(carried), {cc / zz - 1:+.1%}: carrying the state is "
        + ("better" if cc < zz else "not better") + " at this length. Evaluated with the state carried, "
        f"the zero-state model reaches {zc:.2f}; evaluated window by window, the carried model "
        f"{cz:.2f}. One seed each: no run-to-run spread measured, so a gap of a few percent may be noise.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
