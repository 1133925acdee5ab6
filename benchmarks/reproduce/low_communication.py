"""Low-communication training compared on one model: synchronous, PR-SGD, SlowMo, DiLoCo,
Streaming DiLoCo and compressed rounds, the torch word LSTM on Penn Treebank.

Every run trains ``hpcopt.torch.models.word_lstm`` (10,000 words, 200 tied) on PTB with the
same inner optimizer (AdamW), ranks, batch, steps and seeds, so the runs differ only in what a
round does (docs/algorithms.md):

- synchronous: the models averaged after every step (I = 1);
- PR-SGD: the plain average every H steps (outer ``average``);
- SlowMo: the slow momentum step on the round's mean (Wang et al., ICLR 2020);
- DiLoCo: Nesterov on the outer gradient, lr 0.7, momentum 0.9 (Douillard et al. 2023), at
  H in ``--intervals``;
- Streaming DiLoCo: P fragments synchronized in turn, each reduction overlapped with tau inner
  steps (Douillard et al. 2025), at the middle H;
- DiLoCo's rounds sent as bfloat16 and int8 with error feedback (``--wire``), at the middle H.

The runs are one study (``benchmarks/reproduce/low_communication.toml`` is the one of the
command on docs/results/low-communication.md), run by ``python -m hpcopt sweep FILE --local -j
JOBS`` and gathered by ``python -m hpcopt collect``. Every run carries the eth10 cost model in
its trace (``--network eth10``); the page projects each run's wall clock onto eth10 and ib100 at
4 and 64 workers: the measured computation per step plus the modelled communication of the
same calls and bytes at that many ranks (hpcopt.comm.costmodel; a fragment's reduction hidden
behind tau steps of that computation).

    python benchmarks/reproduce/low_communication.py [--steps 1024] [--seeds 0 1] [--jobs 1]

Writes the section ``low-communication`` of ``docs/results/low-communication.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common, hpcopt

from benchmarks.common.launch import add_mpiexec_option  # noqa: E402
from benchmarks.common.sections import mean_sd, replace_section  # noqa: E402
from benchmarks.common.study import Run, add_study_options, find_run, study_runs, sweep_file  # noqa: E402
from hpcopt.algorithms.data_parallel import AVERAGE_LABEL  # noqa: E402
from hpcopt.algorithms.streaming import FRAGMENT_LABEL, PEAK_COLUMN  # noqa: E402
from hpcopt.comm.costmodel import PROFILES, SETUP_LABELS, trace_modelled  # noqa: E402
from hpcopt.io.trace import Trace, read_trace  # noqa: E402

RANKS = 4
MODEL = "torch:hpcopt.torch.models:word_lstm"
WORKERS = (4, 64)  # the cost model's projections
NETWORKS = ("eth10", "ib100")
#: Labels of a round's traffic: the average (also what a wire round sends), the fragments.
ROUND_LABELS = (AVERAGE_LABEL, "final", FRAGMENT_LABEL)


@dataclass(frozen=True)
class Case:
    """One configuration of the study (run once per seed)."""

    label: str
    options: dict[str, int | str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def overlap(self) -> int:
        """Inner steps a fragment's reduction overlaps (0: none, or no fragments)."""
        return int(self.options.get("overlap", 0))


def cases(args: argparse.Namespace) -> list[Case]:
    """Every configuration, in the page's order."""
    mid = args.intervals[len(args.intervals) // 2]
    diloco: dict[str, int | str] = {"algorithm": "diloco"}
    found = [Case("synchronous (I = 1)", {"algorithm": "prsgd", "interval": 1}),
             Case(f"PR-SGD (H = {mid})", {"algorithm": "prsgd", "interval": mid}),
             Case(f"SlowMo (H = {mid})", {"algorithm": "slowmo", "interval": mid})]
    found += [Case(f"DiLoCo (H = {h})", {**diloco, "interval": h}) for h in args.intervals]
    found += [Case(f"Streaming DiLoCo (H = {mid}, P = {args.fragments}, tau = {tau})",
                   {**diloco, "interval": mid, "fragments": args.fragments, "overlap": tau})
              for tau in args.overlaps]
    found += [Case(f"DiLoCo (H = {mid}), {wire} wire", {**diloco, "interval": mid, "wire": wire})
              for wire in ("bfloat16", "int8")]
    return found


def study_text(args: argparse.Namespace) -> str:
    """The sweep file of every run: one ``[[sweep]]`` grid per case, over the seeds."""
    train = {"model": MODEL, "dataset": "ptb", "bptt": args.bptt, "batch_size": args.batch,
             "inner_optimizer": "adamw", "lr": args.lr, "weight_decay": 0.01, "steps": args.steps,
             "network": "eth10", "progress": False}
    grids = [{"ranks": [RANKS], **{k: [v] for k, v in case.options.items()}, "seed": args.seeds}
             for case in cases(args)]
    return sweep_file({"name": "lowcomm", "time": "02:00:00", "ranks_per_node": RANKS}, train, grids,
                      f"The runs of docs/results/low-communication.md:\n{command(args)}")


def command(args: argparse.Namespace) -> str:
    return (f"python benchmarks/reproduce/low_communication.py --steps {args.steps} --seeds "
            f"{' '.join(map(str, args.seeds))} --intervals {' '.join(map(str, args.intervals))}")


def run_of(case: Case, seed: int, runs: list[Run]) -> Run:
    """The study's run of one case and seed."""
    keys = ("algorithm", "interval", "fragments", "overlap", "wire")
    return find_run(runs, RANKS, seed=seed, **{k: case.options.get(k) for k in keys})


def round_bytes(trace: Trace) -> int:
    """Bytes one rank sent in the rounds (averages, the last partial round, fragments)."""
    return sum(int(trace.comm[label]["bytes"][-1]) for label in ROUND_LABELS if label in trace.comm)


def largest_message(trace: Trace) -> int:
    """The most bytes a rank had in flight at once: the streaming runs' trace column, else a
    round's whole message (its bytes over its calls)."""
    if PEAK_COLUMN in trace.columns:
        return int(np.max(trace.columns[PEAK_COLUMN]))
    fields = trace.comm[AVERAGE_LABEL]
    return int(fields["bytes"][-1]) // max(1, int(fields["calls"][-1]))


def projected(trace: Trace, overlap: int, workers: int, network: str) -> float:
    """Wall seconds on ``network`` with ``workers`` ranks: the run's measured computation plus
    the modelled seconds of its calls and bytes there; a fragment's reduction hidden behind
    ``overlap`` steps of that computation (hpcopt.comm.costmodel's rule, max(0, M - H))."""
    if trace.summary is None:
        raise SystemExit(f"{trace.path}: no summary (the run did not finish)")
    wall = float(trace.summary["wall"])
    comm = {label: f for label, f in trace.comm.items() if label not in SETUP_LABELS}
    measured = sum(float(f["seconds"][-1]) for f in comm.values())
    steps = int(trace.columns["step"][-1])
    compute = wall - measured
    ops = trace.ops or {}
    seconds = 0.0
    for label, fields in comm.items():
        one = {label: {k: v[-1:] for k, v in fields.items()}}
        modelled = float(trace_modelled(one, ops, workers, PROFILES[network])[0])
        if label == FRAGMENT_LABEL and overlap:
            calls = max(1, int(fields["calls"][-1]))
            modelled = calls * max(0.0, modelled / calls - overlap * compute / steps)
        seconds += modelled
    return compute + seconds


def figures_of(run: Run, case: Case) -> dict:
    trace = read_trace(run.path / "trace.h5")
    return {"perplexity": run.number("eval_perplexity"), "loss": run.number("train_loss"),
            "rounds": int(run.number("rounds")), "mbytes": round_bytes(trace) / 1e6,
            "peak": largest_message(trace) / 1e6, "wall": run.number("wall_seconds"),
            "comm": run.number("comm_seconds"), "parameters": int(trace.attrs["parameters"]),
            **{f"{net}@{n}": projected(trace, case.overlap, n, net) for net in NETWORKS for n in WORKERS}}


def table(results: dict[Case, list[dict]]) -> list[str]:
    """One row per case; bytes compared with the first case's (synchronous)."""
    head = " | ".join(f"{net} x{n} s" for net in NETWORKS for n in WORKERS)
    lines = [f"| run | test perplexity | rounds | MB sent per rank | bytes vs synchronous "
             f"| largest message MB | wall s (measured) | {head} |",
             "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(NETWORKS) * len(WORKERS)]
    base = next(iter(results.values()))[0]["mbytes"]
    for case, runs in results.items():
        r = runs[0]
        cells = " | ".join(f"{statistics.median(x[f'{net}@{n}'] for x in runs):.0f}"
                           for net in NETWORKS for n in WORKERS)
        lines.append(f"| {case.label} | {mean_sd([x['perplexity'] for x in runs], 1)} | {r['rounds']} | "
                     f"{r['mbytes']:.1f} | 1/{base / r['mbytes']:.0f} | {r['peak']:.2f} | "
                     f"{statistics.median(x['wall'] for x in runs):.0f} | {cells} |")
    return lines


def _mean(runs: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in runs)


def _within(runs: list[dict], reference: list[dict]) -> tuple[bool, str]:
    """Whether the mean test perplexity of ``runs`` is within ``MATCH`` of the reference's, and
    the two, as a table cell's words."""
    ours, theirs = _mean(runs, "perplexity"), _mean(reference, "perplexity")
    return ours <= theirs * (1 + MATCH), f"{ours:.1f} against {theirs:.1f} ({ours / theirs - 1:+.1%})"


#: How close a test perplexity must be to count as matching (relative, on the mean over seeds).
MATCH = 0.05


def findings(results: dict[Case, list[dict]], args: argparse.Namespace) -> list[str]:
    """The papers' findings against these runs: holds / does not hold, with the numbers."""
    by_label = {case.label: runs for case, runs in results.items()}
    mid, top = args.intervals[len(args.intervals) // 2], args.intervals[-1]
    sync = by_label["synchronous (I = 1)"]
    diloco, far = by_label[f"DiLoCo (H = {mid})"], by_label[f"DiLoCo (H = {top})"]
    rows = []

    held, words = _within(far, sync)
    rows.append(("DiLoCo (H = 500, 8 workers) matches synchronous training while communicating 500x less",
                 held, f"H = {top}: perplexity {words}, {sync[0]['mbytes'] / far[0]['mbytes']:.0f}x fewer "
                 "bytes"))
    prsgd = by_label[f"PR-SGD (H = {mid})"]
    ours, theirs = _mean(diloco, "perplexity"), _mean(prsgd, "perplexity")
    rows.append(("DiLoCo's Nesterov outer step beats plain averaging (its outer-optimizer ablation)",
                 ours < theirs, f"H = {mid}: {ours:.1f} against PR-SGD's {theirs:.1f}, the same bytes"))
    for tau in args.overlaps:
        streamed = by_label[f"Streaming DiLoCo (H = {mid}, P = {args.fragments}, tau = {tau})"]
        held, words = _within(streamed, diloco)
        ratio = diloco[0]["peak"] / streamed[0]["peak"]
        rows.append((f"Streaming DiLoCo (tau = {tau}): the same quality with a much lower peak bandwidth",
                     held and ratio >= 2,
                     f"perplexity {words} (DiLoCo H = {mid}); largest message {ratio:.2f}x smaller "
                     f"({streamed[0]['peak']:.2f} against {diloco[0]['peak']:.2f} MB)"))
    for wire in ("bfloat16", "int8"):
        sent = by_label[f"DiLoCo (H = {mid}), {wire} wire"]
        held, words = _within(sent, diloco)
        rows.append((f"Rounds sent as {wire}: no loss of quality", held,
                     f"perplexity {words}; {diloco[0]['mbytes'] / sent[0]['mbytes']:.2f}x fewer bytes"))
    lines = ["| finding (paper) | here | numbers |", "|---|---|---|"]
    lines += [f"| {claim} | {'holds' if ok else 'does not hold'} | {numbers} |"
              for claim, ok, numbers in rows]
    return lines


def section(results: dict[Case, list[dict]], args: argparse.Namespace) -> str:
    first = next(iter(results.values()))
    seconds = sum(r["wall"] for runs in results.values() for r in runs)
    return "\n".join([
        f"`{command(args)}` (one study, "
        "[`benchmarks/reproduce/low_communication.toml`](../../benchmarks/reproduce/low_communication.toml), "
        f"run by `hpcopt sweep --local`: {RANKS} ranks of `mpiexec -n {RANKS} python -m hpcopt train` "
        f"per run on a 2-core machine; {len(results) * len(args.seeds)} runs, {seconds / 60:.0f} min "
        f"of training in all). Model: `{MODEL}` ({first[0]['parameters']:,} parameters, float32) on "
        f"PTB windows of {args.bptt} tokens, {args.batch} windows per rank and step, {args.steps} "
        f"steps per rank for every run; AdamW lr {args.lr:g}, weight decay 0.01, its moments kept on "
        "each rank; test perplexity of the final averaged model (mean ± sd over "
        f"{len(args.seeds)} seeds). \"MB sent\" counts one rank's round traffic (labels `average`, "
        "`final`, `fragments`: the bytes the Comm moved, so a compressed round counts its "
        "compressed bytes); \"largest message\" is the most bytes a rank had in flight at once. "
        "The last four columns project the run's wall clock: its measured computation (wall "
        "less measured communication; two ranks a core here) plus the cost model's seconds for "
        "the same calls and bytes on that network with that many workers.",
        "",
        *table(results),
        "",
        f"The papers' findings against these runs (\"matches\": a mean test perplexity within "
        f"{MATCH:.0%} of the other's):",
        "",
        *findings(results, args),
    ])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1024, help="inner steps per rank, every run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--intervals", type=int, nargs="+", default=[16, 64, 256],
                        help="DiLoCo's H (the middle one: PR-SGD, SlowMo, streaming, wire)")
    parser.add_argument("--fragments", type=int, default=4)
    parser.add_argument("--overlaps", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--bptt", type=int, default=20)
    parser.add_argument("--batch", type=int, default=10)
    add_study_options(parser, runs=Path("runs/low-communication"))
    parser.add_argument("--out", type=Path, default=Path("docs/results/low-communication.md"))
    add_mpiexec_option(parser)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    todo = cases(args)
    runs = study_runs(study_text(args), args, afresh=not args.reuse)
    if runs is None:
        return
    results = {case: [figures_of(run_of(case, seed, runs), case) for seed in args.seeds] for case in todo}
    text = section(results, args)
    replace_section(args.out, "low-communication", text)
    print(text)


if __name__ == "__main__":
    main()
