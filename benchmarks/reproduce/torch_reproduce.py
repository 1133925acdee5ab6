"""PR-SGD and CELGC reproduced at laptop scale through hpcopt.torch (PyTorch modules).

1. PR-SGD (Yu, Yang, Zhu, AAAI 2019: ResNet-20 on CIFAR-10, I in {4, ..., 32} against I = 1):
   the torch ResNet-20 (``--model torch:hpcopt.torch.models:resnet20``) on MNIST-5k (28x28),
   one ``mpiexec -n 2 python -m hpcopt train`` per (I, seed), the same epochs for every I: a
   study (``--runs``/prsgd) run by ``python -m hpcopt sweep --local`` and gathered by
   ``python -m hpcopt collect``, its table read back.
2. CELGC (Liu, Zhuang, Lei, Liao, NeurIPS 2022: AWD-LSTM on Penn Treebank, eta 30, gamma 7.5)
   against naive parallel clipping: a one-layer tied word LSTM (``hpcopt.torch.models.word_lstm``)
   on the standard PTB through ``hpcopt.torch.language_workload`` and ``hpcopt.train``, one
   ``mpiexec -n 2 python benchmarks/reproduce/torch_reproduce.py --lm-worker ...`` per row; windows of 35
   tokens from a zero state (no hidden state carried between windows), validation perplexity
   ``--lm-evals`` times in the run, and the test perplexity of the final averaged model.

    python benchmarks/reproduce/torch_reproduce.py [--parts prsgd celgc] [--seeds 0 1] [--epochs 8]
        [--intervals 1 4 16] [--lm-epochs 1] [--lm-intervals 8 32] [--lm-seeds 0 1] [--reuse]

Finished runs are kept under ``--runs`` and taken again with ``--reuse``. Writes the sections
``torch-prsgd``, ``torch-celgc`` and ``torch-findings`` of ``docs/results/torch.md`` and all
numbers to ``docs/results/torch.json`` (a part not run this time keeps its numbers there).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.launch import ROOT, run_script  # noqa: E402
from benchmarks.common.sections import replace_section  # noqa: E402
from benchmarks.common.study import find_run, run_study, sweep_file  # noqa: E402
from benchmarks.reproduce.resnet_mnist import figures_of_run, mean_sd  # noqa: E402
from hpcopt.io.trace import read_trace

RANKS = 2
MNIST_TRAIN, BATCH = 4000, 32
STEPS_PER_EPOCH = MNIST_TRAIN // RANKS // BATCH
#: "Within a few percent": the paper's CELGC-vs-baseline validation gaps are +0.8% to +2.9%.
WITHIN = 0.05
#: PR-SGD: a larger I "reaches the accuracy of I = 1" if its mean is at most this much lower.
ACCURACY_SLACK = 0.01


# -- PR-SGD on the torch ResNet-20 -------------------------------------------------------------

def prsgd_flags(interval: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    steps = round(args.epochs * STEPS_PER_EPOCH)
    return {"model": "torch:hpcopt.torch.models:resnet20", "dataset": "mnist5k",
            "batch-size": BATCH, "lr": args.lr, "momentum": args.momentum, "interval": interval,
            "schedule": "step", "milestones": round(0.75 * steps), "decay": 0.1, "seed": seed,
            "epochs": args.epochs, "eval-every": STEPS_PER_EPOCH, "progress": "false"}


def prsgd_study(args: argparse.Namespace) -> str:
    """The sweep file of the PR-SGD part: every I and seed on top of the shared flags."""
    train = {k.replace("-", "_"): v for k, v in prsgd_flags(args.intervals[0], args.seeds[0], args).items()
             if k not in ("interval", "seed", "progress")}
    command = (f"python benchmarks/reproduce/torch_reproduce.py --parts prsgd --seeds "
               f"{' '.join(map(str, args.seeds))} --epochs {args.epochs} --intervals "
               f"{' '.join(map(str, args.intervals))}")
    return sweep_file({"name": "prsgd", "time": "01:00:00", "ranks_per_node": RANKS},
                      {**train, "progress": False},
                      [{"ranks": [RANKS], "interval": args.intervals, "seed": args.seeds}],
                      f"The PR-SGD runs of docs/results/torch.md:\n{command}")


def prsgd_part(args: argparse.Namespace) -> dict[str, Any]:
    """Run the PR-SGD study (``--runs``/prsgd; kept with --reuse) and read every run's figures."""
    study = args.runs / "prsgd"
    if not args.reuse:
        shutil.rmtree(study, ignore_errors=True)
    found = run_study(prsgd_study(args), study)

    def figures(interval: int, seed: int) -> dict[str, Any]:
        run = find_run(found, RANKS, interval=interval, seed=seed)
        # the bytes of every label, rank 0's, as the run's summary counts them
        return {**figures_of_run(run), "bytes": float(read_trace(run.path / "trace.h5").summary["bytes"])}

    runs = {str(i): {str(s): figures(i, s) for s in args.seeds} for i in args.intervals}
    return {"settings": {"ranks": RANKS, "batch": BATCH, "epochs": args.epochs, "lr": args.lr,
                         "momentum": args.momentum, "seeds": args.seeds,
                         "intervals": args.intervals, "steps_per_epoch": STEPS_PER_EPOCH,
                         "flags": prsgd_flags(args.intervals[0], args.seeds[0], args)},
            "runs": runs}


def prsgd_section(part: dict[str, Any]) -> str:
    s = part["settings"]
    flags = {k: v for k, v in s["flags"].items() if k not in ("interval", "seed")}
    first = next(iter(next(iter(part["runs"].values())).values()))
    epochs = len(first["history"])
    lines = [
        "## PR-SGD: torch ResNet-20 on MNIST-5k",
        "",
        f"{s['ranks']} ranks of `mpiexec -n {s['ranks']} python -m hpcopt train "
        + " ".join(f"--{k} {v}" for k, v in flags.items())
        + " --interval I --seed S` per run, on a 2-core machine shared with other jobs. "
        f"Model: ResNet-20 (He et al. 2016, 16-32-64 channels, batch norm; {first['parameters']:,} "
        "trained parameters; BN statistics averaged at every round apart from them, label "
        "`buffers`), float32, 1-channel 28x28 images (no padding to 32x32), batch "
        f"{s['batch']} per rank, momentum {s['momentum']:g} (buffers kept local), lr {s['lr']:g} "
        f"times 0.1 after 75% of the steps, {s['epochs']:g} epochs = {s['epochs'] * s['steps_per_epoch']:g} "
        f"steps per rank for every I; i.i.d. shards of the 4,000 training images; test accuracy "
        f"of the averaged model on the 1,000 test images after every epoch. Seeds "
        f"{', '.join(map(str, s['seeds']))} "
        "(initial model, shards, batches); mean ± standard deviation over the seeds. \"MB averaged\" "
        "is what one rank sent on the label `average` (the parameters, once per round); \"MB in "
        "all\" what rank 0 sent on every label (averages, BN statistics, evaluation, the initial "
        "broadcast).",
        "",
        "| I | averaging rounds | MB averaged per rank | kB of BN statistics | MB in all | "
        "final test accuracy | final train loss | wall s (median) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for interval, by_seed in part["runs"].items():
        runs = list(by_seed.values())
        r = runs[0]
        lines.append(f"| {interval} | {r['rounds']} | {r['mbytes']:.2f} | {r['kbytes_bn']:.1f} | "
                     f"{r['bytes'] / 1e6:.2f} | {mean_sd([x['accuracy'] for x in runs])} | "
                     f"{mean_sd([x['loss'] for x in runs])} | "
                     f"{statistics.median(x['wall'] for x in runs):.0f} |")
    lines += ["", "Test accuracy of the averaged model by epoch (mean over seeds):", "",
              "| I | " + " | ".join(f"ep. {e}" for e in range(1, epochs + 1)) + " |",
              "|---:|" + "---:|" * epochs]
    for interval, by_seed in part["runs"].items():
        cells = [statistics.mean(r["history"][e] for r in by_seed.values()) for e in range(epochs)]
        lines.append(f"| {interval} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    return "\n".join(lines)


# -- CELGC on the torch word LSTM, Penn Treebank -----------------------------------------------

def lm_rows(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Row name -> the algorithm's options (the paper's eta 30, gamma 7.5)."""
    rows: dict[str, dict[str, Any]] = {"naive": {"algorithm": "naive_clip"}}
    for interval in args.lm_intervals:
        rows[f"celgc-I{interval}"] = {"algorithm": "celgc", "interval": interval}
    return {name: {**options, "lr": args.eta, "gamma": args.gamma} for name, options in rows.items()}


def lm_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"ranks": RANKS, "epochs": args.lm_epochs, "batch": args.lm_batch, "bptt": 35,
            "embedding": args.lm_hidden, "hidden": args.lm_hidden, "fraction": args.lm_fraction,
            "eta": args.eta, "gamma": args.gamma, "seeds": args.lm_seeds, "evals": args.lm_evals}


def ptb_tokens() -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, str]:
    """Penn Treebank (Mikolov's 10,000-word version, hpcopt's ``ptb`` corpus from the treebank
    package): vocabulary, train/valid/test word ids and where they came from."""
    from hpcopt.data.text import load_corpus

    corpus = load_corpus("ptb")
    return corpus.vocab, corpus.train, corpus.valid, corpus.test, "hpcopt.data.text.load_corpus('ptb')"


def lm_worker(spec: dict[str, Any]) -> None:
    """One row, on every rank of this mpiexec: train, evaluate the averaged model on the test
    split, rank 0 writes OUT/result.json."""
    import functools

    import torch

    import hpcopt
    from hpcopt.comm import Comm
    from hpcopt.config import build_config
    from hpcopt.torch import evaluate_tokens, language_workload
    from hpcopt.torch.models import word_lstm

    torch.set_num_threads(1)
    s, out, seed = spec["settings"], Path(spec["out"]), spec["seed"]
    comm = Comm()
    vocab, train, valid, test, source = ptb_tokens()
    train = train[:round(s["fraction"] * train.size)]
    factory = functools.partial(word_lstm, len(vocab), s["embedding"], s["hidden"])
    workload = language_workload(factory, train, valid, comm, bptt=s["bptt"], batch_size=s["batch"],
                                 seed=seed, dtype="float32")
    options = {**spec["options"], "epochs": s["epochs"], "seed": seed, "out": str(out),
               "eval_every": max(1, workload.steps_per_epoch * s["epochs"] // s["evals"]),
               "progress": False}
    summary, state = hpcopt.train(build_config(None, options), comm, verbose=False, workload=workload)
    test_eval = evaluate_tokens(workload, state.x, test, comm, bptt=s["bptt"])
    if comm.rank == 0:
        result = {"source": source, "vocab": len(vocab),
                  "tokens": [int(train.size), int(valid.size), int(test.size)],
                  "parameters": workload.layout.size, "steps_per_epoch": workload.steps_per_epoch,
                  "valid_perplexity": summary.final.perplexity, "test_perplexity": test_eval.perplexity,
                  "history": [[tick, e.perplexity] for tick, e in summary.history],
                  "rounds": summary.rounds,
                  "steps": summary.steps, "average_mb": summary.average_bytes_per_rank / 1e6,
                  "mb": summary.bytes_per_rank / 1e6, "clip_fraction": summary.clip_fraction,
                  "wall": summary.wall_seconds, "comm_share": summary.comm_seconds / summary.wall_seconds}
        (out / "result.json").write_text(json.dumps(result, indent=1))
    comm.free()


def run_lm(name: str, options: dict[str, Any], seed: int,
           args: argparse.Namespace) -> dict[str, Any]:
    out = args.runs / f"lm-{name}-seed{seed}"
    result = out / "result.json"
    if not (args.reuse and result.exists()):
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        spec = {"settings": lm_settings(args), "options": options, "seed": seed,
                "out": str(out.resolve())}
        run_script(RANKS, __file__, "--lm-worker", json.dumps(spec))
        print(f"{out.name}: {time.perf_counter() - start:.0f} s", flush=True)
    return json.loads(result.read_text())


def celgc_part(args: argparse.Namespace) -> dict[str, Any]:
    rows = lm_rows(args)
    return {"settings": lm_settings(args), "options": rows,
            "runs": {name: {str(seed): run_lm(name, options, seed, args) for seed in args.lm_seeds}
                     for name, options in rows.items()}}


def spread(values: list[float]) -> str:
    """Mean ± standard deviation with two decimals (perplexities)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {sd:.2f}"


def celgc_section(part: dict[str, Any]) -> str:
    s, runs = part["settings"], part["runs"]
    first = next(iter(next(iter(runs.values())).values()))
    train, valid, test = first["tokens"]
    ticks = [tick for tick, _ in first["history"]]
    share = "" if s["fraction"] == 1 else f" = the first {s['fraction']:.0%}"
    lines = [
        "## CELGC: torch word LSTM on Penn Treebank",
        "",
        f"{s['ranks']} ranks, each row one `mpiexec -n {s['ranks']} python benchmarks/reproduce/torch_reproduce.py "
        "--lm-worker ...` (`hpcopt.torch.language_workload` and `hpcopt.train`), on a 2-core "
        "machine shared with other jobs.",
        "",
        f"- Data: Penn Treebank, Mikolov's version ({first['vocab']:,} words with `<eos>`; "
        f"{train:,} training tokens{share}, "
        f"{valid:,} valid, {test:,} test), from {first['source']}.",
        f"- Windows: the training tokens cut into non-overlapping windows of {s['bptt']} tokens "
        "(targets one token later), dealt i.i.d. to the ranks and drawn in random minibatches of "
        f"{s['batch']} windows per rank and step ({s['batch'] * s['bptt']} tokens). **Every window "
        "starts from a zero hidden state**: no state is carried between windows (AWD-LSTM carries it "
        "along contiguous streams), so the first words of each window are predicted without context "
        "and the perplexities are higher than a carried-state model of the same size would reach.",
        f"- Model: `word_lstm`: embedding {s['embedding']}, one LSTM layer of {s['hidden']}, decoder "
        f"tied to the embedding, no dropout ({first['parameters']:,} parameters), float32.",
        f"- Training: plain clipped SGD, constant eta = {s['eta']:g}, gamma = {s['gamma']:g} (the "
        f"paper's; threshold gamma/eta = {s['gamma'] / s['eta']:g}), {s['epochs']:g} epoch(s) = "
        f"{first['steps']} steps per rank for every row ({first['steps_per_epoch']} per epoch). "
        "naive: gradients averaged every step, one clipped step on the average; celgc-I: local "
        "clipped steps, weights averaged every I steps. Seeds "
        f"{', '.join(map(str, s['seeds']))} (initial model, shards, batches), one run per row "
        "and seed.",
        "- Perplexity: exp of the mean next-word cross-entropy of the averaged model over all "
        f"windows of the split, from a zero state; validation {s['evals']} times in the run "
        "(columns labelled by steps per rank), test once at the end. \"clip\": the share of all "
        "ranks' steps in which gamma/||g|| < eta. \"MB averaged\": "
        "what one rank sent on the label `average` (gradients for naive, weights for CELGC).",
        "",
        f"Final averaged model (step {first['steps']}), mean ± standard deviation over the seeds:",
        "",
        "| row | valid ppl | vs naive | test ppl | vs naive | averaging rounds | MB averaged per rank | "
        "clip (per seed) | wall s (per seed) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    naive = {key: statistics.mean(r[key] for r in runs["naive"].values())
             for key in ("valid_perplexity", "test_perplexity")}
    for name, by_seed in runs.items():
        rs = list(by_seed.values())
        valid_ppl, test_ppl = ([r[key] for r in rs] for key in ("valid_perplexity", "test_perplexity"))
        lines.append(f"| {name} | {spread(valid_ppl)} | "
                     f"{100 * (statistics.mean(valid_ppl) / naive['valid_perplexity'] - 1):+.1f}% | "
                     f"{spread(test_ppl)} | "
                     f"{100 * (statistics.mean(test_ppl) / naive['test_perplexity'] - 1):+.1f}% | "
                     f"{rs[0]['rounds']} | {rs[0]['average_mb']:.1f} | "
                     + ", ".join(f"{100 * r['clip_fraction']:.1f}%" for r in rs) + " | "
                     + ", ".join(f"{r['wall']:.0f}" for r in rs) + " |")
    lines += ["", "Validation perplexity of the averaged model during the run, each seed:", "",
              "| row | seed | " + " | ".join(f"step {t}" for t in ticks) + " | final |",
              "|---|---:|" + "---:|" * (len(ticks) + 1)]
    for name, by_seed in runs.items():
        for seed, r in by_seed.items():
            lines.append(f"| {name} | {seed} | " + " | ".join(f"{p:.2f}" for _, p in r["history"])
                         + f" | {r['valid_perplexity']:.2f} |")
    return "\n".join(lines)


# -- the findings table ---------------------------------------------------------------------------

def findings(results: dict[str, Any]) -> str:
    rows: list[tuple[str, str, str]] = []
    prsgd, celgc = results.get("prsgd"), results.get("celgc")
    if prsgd:
        runs = prsgd["runs"]
        base = statistics.mean(r["accuracy"] for r in runs["1"].values())
        for interval, by_seed in runs.items():
            if interval == "1":
                continue
            acc = statistics.mean(r["accuracy"] for r in by_seed.values())
            r0, r1 = next(iter(by_seed.values())), next(iter(runs["1"].values()))
            rows.append((f"PR-SGD: I = {interval} reaches the test accuracy of I = 1 in the same "
                         "epochs, with I times fewer averaging rounds",
                         f"{acc:.4f} against {base:.4f} (mean of {len(by_seed)} seeds); "
                         f"{r0['rounds']} rounds against {r1['rounds']}, {r0['mbytes']:.2f} MB against "
                         f"{r1['mbytes']:.2f} MB averaged per rank",
                         "holds" if acc >= base - ACCURACY_SLACK else "does not hold"))
        rows.append(("PR-SGD: wall clock better than I = 1 because of fewer rounds",
                     "2 ranks on one shared-memory node of a loaded 2-core machine: an average of the "
                     "1.1 MB model takes ~0.3 ms against ~0.1 s per step (docs/torch.md, Speed), so "
                     "the wall time measures the machine's load, not the rounds",
                     "not run (no network)"))
    else:
        rows.append(("PR-SGD on ResNet-20", "-", "not run (part skipped)"))
    if celgc:
        runs = {name: {key: statistics.mean(r[key] for r in by_seed.values())
                       for key in ("valid_perplexity", "test_perplexity", "clip_fraction", "rounds")}
                for name, by_seed in celgc["runs"].items()}
        for name, by_seed in celgc["runs"].items():  # the last validation inside the run
            runs[name]["last"] = statistics.mean(r["history"][-1][1] for r in by_seed.values())
            runs[name]["last_step"] = next(iter(by_seed.values()))["history"][-1][0]
        finals = [r["valid_perplexity"] for r in celgc["runs"]["naive"].values()]
        spread_note = (f"; the baseline's own seeds give {min(finals):.2f} and {max(finals):.2f}"
                       if len(finals) > 1 else "")
        seeds = len(celgc["settings"]["seeds"])
        naive = runs["naive"]
        for name, r in runs.items():
            if name == "naive":
                continue
            gap = r["valid_perplexity"] / naive["valid_perplexity"] - 1
            rows.append((f"CELGC within a few percent of naive clipping in validation perplexity "
                         f"({name}), with I times fewer rounds",
                         f"{r['valid_perplexity']:.2f} against {naive['valid_perplexity']:.2f} "
                         f"({100 * gap:+.1f}%; mean of {seeds} seed(s)); "
                         f"test {r['test_perplexity']:.2f} "
                         f"against {naive['test_perplexity']:.2f}; {r['rounds']:.0f} rounds against "
                         f"{naive['rounds']:.0f}",
                         "holds" if abs(gap) <= WITHIN else "does not hold"))
        def behind(key: str) -> tuple[list[float], str]:
            gaps = [r[key] / naive[key] - 1 for n, r in runs.items() if n != "naive"]
            return gaps, ("holds" if all(0 <= g <= WITHIN for g in gaps) else
                          "does not hold" if all(g < 0 for g in gaps) else "partly")

        (final_gaps, final_verdict), (last_gaps, last_verdict) = behind("valid_perplexity"), behind("last")
        rows.append(("PTB: CELGC slightly behind the baseline in validation perplexity (+0.8% to "
                     "+2.9% in the paper)",
                     "final model: " + ", ".join(f"{100 * g:+.1f}%" for g in final_gaps)
                     + f"; last validation inside the run (step {naive['last_step']}): "
                     + ", ".join(f"{100 * g:+.1f}%" for g in last_gaps) + spread_note,
                     final_verdict if final_verdict == last_verdict else
                     f"inconclusive: {final_verdict} at the end, {last_verdict} at step "
                     f"{naive['last_step']}, inside the seed spread"))
        clips = {n: r["clip_fraction"] for n, r in runs.items()}
        rows.append(("Clipping fires more often in CELGC than in the baseline",
                     ", ".join(f"{n} {100 * c:.1f}%" for n, c in clips.items())
                     + " (mean over seeds)",
                     "holds" if all(c > clips["naive"] for n, c in clips.items() if n != "naive")
                     else "does not hold"))
        rows.append(("Wall clock about 2x faster at I = 16 (8 GPUs)",
                     "2 ranks on shared memory of a loaded 2-core machine: an average of the 9.3 MB "
                     "model takes ~2 ms against ~0.12 s per step (docs/torch.md, Speed)",
                     "not run (no network)"))
    else:
        rows.append(("CELGC on PTB", "-", "not run (part skipped)"))
    rows += [("CELGC at I = 1024, with momentum, partial participation, heterogeneous data; "
              "Wikitext-2; ResNet-56", "-", "not run here (time): the NumPy models' pages "
              "(celgc.md) cover momentum, participation, heterogeneity and a ResNet"),
             ("AWD-LSTM (3 layers, 1150 units, dropouts, carried state) and its perplexities "
              "(~66 on PTB)", f"a 1-layer, {celgc['settings']['hidden'] if celgc else 200}-unit LSTM "
              f"from a zero state per window, {celgc['settings']['epochs'] if celgc else '-'} epoch(s)",
              "not run (scale)")]
    lines = ["## Findings", "", "| paper finding | our result | verdict |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=["prsgd", "celgc"], default=["prsgd", "celgc"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--lm-epochs", type=int, default=1)
    parser.add_argument("--lm-evals", type=int, default=4, help="validations in the run")
    parser.add_argument("--lm-intervals", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--lm-batch", type=int, default=20, help="windows per rank and step")
    parser.add_argument("--lm-hidden", type=int, default=200)
    parser.add_argument("--lm-fraction", type=float, default=1.0, help="share of the training tokens")
    parser.add_argument("--lm-seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--eta", type=float, default=30.0)
    parser.add_argument("--gamma", type=float, default=7.5)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "torch-reproduce",
                        help="the runs; the PR-SGD part's study is RUNS/prsgd (of one set of options)")
    parser.add_argument("--reuse", action="store_true", help="take finished runs from --runs")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "results" / "torch.md")
    parser.add_argument("--lm-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lm_worker:
        lm_worker(json.loads(args.lm_worker))
        return
    numbers = args.page.with_suffix(".json")
    results = json.loads(numbers.read_text()) if numbers.exists() else {}
    if "prsgd" in args.parts:
        results["prsgd"] = prsgd_part(args)
        replace_section(args.page, "torch-prsgd", prsgd_section(results["prsgd"]))
    if "celgc" in args.parts:
        results["celgc"] = celgc_part(args)
        replace_section(args.page, "torch-celgc", celgc_section(results["celgc"]))
    replace_section(args.page, "torch-findings", findings(results))
    numbers.write_text(json.dumps(results, indent=1) + "\n")
    print(args.page.read_text())


if __name__ == "__main__":
    sys.exit(main())
