"""docs/results/elastic.md: what a lost rank and a slow rank cost each data-parallel algorithm.

One study at 4 ranks (``hpcopt sweep``, then each task here as its array task would run): for
PR-SGD, CELGC, DiLoCo, Streaming DiLoCo and SlowMo, a fault-free run, the same run with
``--fault 2:STEP`` (rank 2 killed, ``kill -9``, at its step STEP) and with ``--straggler 1:0.6``
(rank 1 at 0.6x speed). The same schedule replays on every algorithm.

``--on-rank-loss abort`` (the default; any MPI, run with this interpreter and ``--launcher``): a
task that lost its rank is run again at once, as a requeue would, and resumes from its newest
checkpoint; ``hpcopt collect`` reports the steps it did again and the seconds from the kill to the
resumed job's first step (``OUT/fault.json``).

``--on-rank-loss continue`` (with ``--ulfm-python``: an interpreter whose mpi4py runs on Open MPI 5
with ULFM; its ``mpirun --with-ft ulfm`` starts the ranks): a second study, the fault-free and the
faulty run of each algorithm, where the survivors go on at 3 ranks; collect reads the trace's
``/rank_losses``. Quality cost: the final evaluation loss minus the same study's fault-free run's.

    python benchmarks/faults/elastic.py --out docs/results --runs /tmp/elastic \
        --ulfm-python /path/to/openmpi-env/bin/python
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.launch import ROOT
from benchmarks.common.study import sweep_file
from benchmarks.faults.rank_loss_moments import HEADING as MOMENTS_HEADING

ALGORITHMS = {  # name on the page -> hpcopt train options
    "PR-SGD": {"algorithm": "prsgd", "interval": 8},
    "CELGC": {"algorithm": "celgc", "interval": 8},
    "DiLoCo": {"algorithm": "diloco", "interval": 8},
    "Streaming DiLoCo": {"algorithm": "diloco", "interval": 8, "fragments": 2},
    "SlowMo": {"algorithm": "slowmo", "interval": 8},
}
RANKS, STRAGGLER = 4, "1:0.6"
ULFM_PYTHON = "OPENMPI_ENV/bin/python"  # the page names no path of the machine that wrote it
NOISY = "ratios below 1 show that the noise is larger than the effect, and these ratios rank nothing"


def study_text(args: argparse.Namespace, on_rank_loss: str) -> str:
    """The abort study: fault-free, faulty and straggling runs; the continue study: no straggler."""
    train = {"dataset": "digits", "hidden": [256, 256], "batch_size": 256, "steps": args.steps,
             "trace_every": 8, "checkpoint_every": args.checkpoint_every, "progress": False, "seed": 0,
             "on_rank_loss": on_rank_loss}
    fault = f"2:{args.fault_step}"
    grids = [{"ranks": [RANKS], **{k: [v] for k, v in options.items()}, "fault": ["", fault],
              "straggler": [""]} for options in ALGORITHMS.values()]
    if on_rank_loss == "abort":
        grids += [{"ranks": [RANKS], **{k: [v] for k, v in options.items()}, "fault": [""],
                   "straggler": [STRAGGLER]} for options in ALGORITHMS.values()]
    return sweep_file({"name": f"elastic-{on_rank_loss}"}, train, grids,
                      comment="benchmarks/faults/elastic.py")


def hpcopt(*argv: str, cwd: Path, python: str = sys.executable) -> None:
    subprocess.run([python, "-m", "hpcopt", *argv], cwd=cwd, check=True, env=_env(python))


def _env(python: str) -> dict[str, str]:
    """This checkout first on PYTHONPATH; ``python``'s folder first on PATH (its MPI's launcher)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    bin_path = os.pathsep.join(filter(None, [str(Path(python).parent), os.environ.get("PATH")]))
    return {**os.environ, "PYTHONPATH": path, "PATH": bin_path}


def run_tasks(study: Path, launcher: list[str], python: str = sys.executable,
              finished: tuple[int, ...] = (0,)) -> None:
    """Every task as its array task runs it; one that lost a rank and ended (an exit code outside
    ``finished``) is run again at once: the requeue, which resumes it. Under continue, the
    survivors' exit code (EXIT_CONTINUED) is a finished run."""
    from hpcopt.study.layout import read_manifest

    for entry in read_manifest(study):
        for attempt in (1, 2):
            command = [python, "-m", "hpcopt.study.task", str(entry.index), *launcher]
            log = study / "logs" / f"task-{entry.index}-{attempt}.log"
            log.parent.mkdir(exist_ok=True)
            with open(log, "w") as handle:
                code = subprocess.run(command, cwd=study, env=_env(python), stdout=handle,
                                      stderr=subprocess.STDOUT).returncode
            print(f"task {entry.index} ({entry.run.name}) attempt {attempt}: exit {code}", flush=True)
            if code in finished:
                break
        else:
            raise SystemExit(f"task {entry.index} did not finish: {log}")


def rows_of(study: Path) -> dict[str, dict[str, str]]:
    with open(study / "study.csv", newline="") as handle:
        return {Path(row["run"]).name: row for row in csv.DictReader(handle)}


def table(study: Path) -> list[dict[str, object]]:
    """One line per algorithm: the fault-free run, the faulty one, the straggler's."""
    from hpcopt.study.layout import read_manifest

    rows = rows_of(study)
    by_options: dict[tuple[str, ...], dict[str, str]] = {}
    for entry in read_manifest(study):
        options = dict(zip(entry.args[::2], entry.args[1::2]))
        key = tuple(options.get(f"--{k}", "") for k in ("algorithm", "fragments", "fault", "straggler"))
        by_options[key] = rows[entry.run.name]
    lines = []
    for name, options in ALGORITHMS.items():
        base = (str(options["algorithm"]), str(options.get("fragments", "")))
        plain = by_options[(*base, "", "")]
        faulty = next(r for (a, f, fault, s), r in by_options.items() if (a, f) == base and fault)
        slow = by_options[(*base, "", STRAGGLER)]
        step_seconds = float(plain["wall_seconds"]) / float(plain["steps"])
        lines.append({
            "algorithm": name, "eval_loss": float(plain["eval_loss"]),
            "wall": float(plain["wall_seconds"]),
            "losses": int(faulty["rank_losses"] or 0), "steps_lost": _number(faulty["steps_lost"]),
            "recovery": _number(faulty["recovery_seconds"]),
            "redo_seconds": (_number(faulty["steps_lost"]) or 0) * step_seconds,
            "fault_cost": float(faulty["eval_loss"]) - float(plain["eval_loss"]),
            "straggler_wall": float(slow["wall_seconds"]),
            "straggler_cost": float(slow["eval_loss"]) - float(plain["eval_loss"]),
        })
    return lines


def continue_table(study: Path) -> list[dict[str, object]]:
    """One line per algorithm of the continue study: its fault-free run and its faulty one."""
    from hpcopt.study.layout import read_manifest

    rows = rows_of(study)
    runs: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
    for entry in read_manifest(study):
        options = dict(zip(entry.args[::2], entry.args[1::2]))
        base = (options["--algorithm"], options.get("--fragments", ""))
        runs.setdefault(base, {})["faulty" if options.get("--fault") else "plain"] = rows[entry.run.name]
    lines = []
    for name, options in ALGORITHMS.items():
        pair = runs[(str(options["algorithm"]), str(options.get("fragments", "")))]
        plain, faulty = pair["plain"], pair["faulty"]
        lines.append({"algorithm": name, "eval_loss": float(plain["eval_loss"]),
                      "losses": int(faulty["rank_losses"] or 0), "steps_lost": _number(faulty["steps_lost"]),
                      "recovery": _number(faulty["recovery_seconds"]),
                      "faulty_loss": float(faulty["eval_loss"]),
                      "fault_cost": float(faulty["eval_loss"]) - float(plain["eval_loss"])})
    return lines


def continue_section(lines: list[dict[str, object]], args: argparse.Namespace) -> str:
    head = ["| algorithm | fault-free eval loss | ranks lost | steps lost per survivor | recovery s | "
            "eval loss after the loss | quality cost (eval loss) |", "|" + "---|" * 7]
    body = [f"| {line['algorithm']} | {line['eval_loss']:.4f} | {line['losses']} | "
            f"{_shown(line['steps_lost'], 0)} | {_shown(line['recovery'], 3)} | "  # type: ignore[arg-type]
            f"{line['faulty_loss']:.4f} | {line['fault_cost']:+.4f} |" for line in lines]
    return f"""## Continue without the lost rank (Open MPI's ULFM)

The same fault-free and faulty runs with `--on-rank-loss continue`, started by
`{args.ulfm_launcher}` under Open MPI 5 (the interpreter given as `--ulfm-python`). The
survivors notice the loss at the next collective, agree on the last completed round, shrink
the communicator, go back to that round's averaged model (kept in memory) and finish the run at
3 ranks, with the data partitioned anew ([failures.md](../failures.md)); the fault fires once.
Under continue, `--averaging auto` is the plain MPI path (shared-memory windows do not survive a
lost rank), so the fault-free eval loss here can differ from the abort table's in the last digits.

{chr(10).join(head + body)}

- **recovery s**: within the job, from the survivors' failed collective (the loss detected) to
  the rebuilt run (`/rank_losses/recover_seconds`): revoke, agreement on the round, shrink,
  rollback, rebuilding the run. No new launch, no checkpoint read. The time from the kill to
  the next collective's failure is not in it (the survivors compute on meanwhile: those steps are
  the steps lost), while the abort table's recovery s starts at the kill; both are in the figure.
- **steps lost per survivor**: the steps between the round the survivors went back to and the
  step at which they noticed the loss (`step - round_step`), done again at 3 ranks. Rank 2's
  own steps since the round, its optimizer state and its share of the remaining samples are lost.
- **quality cost**: the final evaluation loss minus this study's fault-free run's. Not zero:
  after the loss each round averages 3 ranks' models instead of 4, with the data of 3 ranks
  (3/4 of the samples per round), and the rolled-back steps are redone with other samples.
  Negative means the faulty run ended with a lower eval loss. One seed per run: how much of
  each difference is the seed's and not the loss's is not measured here.
"""


def _number(cell: str) -> float | None:
    return float(cell) if cell else None


def _shown(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def figure(lines: list[dict[str, object]], continued: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [str(line["algorithm"]) for line in lines]
    fig, axes = plt.subplots(1, 3 if continued else 2, figsize=(15 if continued else 10, 3.6))
    left, right = axes[0], axes[-1]
    xs = range(len(names))
    recovery = [float(line["recovery"] or 0) for line in lines]  # type: ignore[arg-type]
    redo = [float(line["redo_seconds"]) for line in lines]  # type: ignore[arg-type]
    left.bar(xs, recovery, label="kill to the resumed job's first step")
    left.bar(xs, redo, bottom=recovery, label="steps redone (at the fault-free step time)")
    left.set_ylim(0, 1.4 * max(r + d for r, d in zip(recovery, redo)))  # room for the legend
    left.set_ylabel("seconds")
    left.set_title("a lost rank (rank 2): abort and resume")
    left.legend(fontsize=8)
    if continued:
        _recovery_panel(axes[1], recovery, [float(line["recovery"] or 0) for line in continued])  # type: ignore[arg-type]
    ratio = [float(line["straggler_wall"]) / float(line["wall"]) for line in lines]  # type: ignore[arg-type]
    right.bar(xs, ratio, color="tab:red")
    right.axhline(1 / 0.6, color="black", linestyle="--", linewidth=1,
                  label="1/0.6: all compute at rank 1's pace")
    right.axhline(1, color="grey", linewidth=1)
    right.set_ylim(0, 1.25 * max(*ratio, 1 / 0.6))
    right.set_ylabel("wall time / fault-free run's")
    right.set_title(f"a straggler ({STRAGGLER}: rank 1 at 0.6x)")
    right.legend(fontsize=8)
    for axis in axes:
        axis.set_xticks(list(xs), names, rotation=20, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _recovery_panel(axis: Any, abort: list[float], survived: list[float]) -> None:
    """Recovery seconds side by side: abort and resume (a new job) against continue (in the job)."""
    xs = np.arange(len(abort))
    axis.bar(xs - 0.2, abort, width=0.4, label="abort: kill to the resumed job's first step (MPICH)")
    axis.bar(xs + 0.2, survived, width=0.4, label="continue: failed collective to the rebuilt run (ULFM)")
    axis.set_yscale("log")
    axis.set_ylim(min(*abort, *survived) / 3, 30 * max(*abort, *survived))  # room for the legend
    axis.set_ylabel("recovery seconds (log)")
    axis.set_title("recovery: abort and resume vs continue at 3 ranks")
    axis.legend(fontsize=8)


def page(lines: list[dict[str, object]], args: argparse.Namespace, load: tuple[float, float],
         continued: str) -> str:
    mode = ("abort and resume under MPICH (the job ends at the loss; the task is run again at once, as a "
            "requeue would, and resumes from its newest checkpoint); continue under Open MPI's ULFM below")
    head = ["| algorithm | fault-free eval loss | fault-free wall s | ranks lost | steps lost | "
            "recovery s | redone steps s | quality cost (eval loss) | straggler wall s | "
            "straggler / fault-free | straggler quality cost |", "|" + "---|" * 11]
    body = [f"| {line['algorithm']} | {line['eval_loss']:.4f} | {line['wall']:.2f} | {line['losses']} | "
            f"{_shown(line['steps_lost'], 0)} | {_shown(line['recovery'])} | "  # type: ignore[arg-type]
            f"{line['redo_seconds']:.2f} | {line['fault_cost']:+.2g} | {line['straggler_wall']:.2f} | "
            f"{float(line['straggler_wall']) / float(line['wall']):.2f} | "  # type: ignore[arg-type]
            f"{line['straggler_cost']:+.2g} |" for line in lines]
    shown = [ULFM_PYTHON if word == args.ulfm_python else word for word in args.argv]
    command = "python benchmarks/faults/elastic.py " + shlex.join(shown)
    ratios = [float(line["straggler_wall"]) / float(line["wall"]) for line in lines]  # type: ignore[arg-type]
    return f"""# Elastic training: a lost rank and a slow rank, per algorithm

Written by `{command.strip()}`
([benchmarks/faults/elastic.py](../../benchmarks/faults/elastic.py)); regenerate it with the
same command.

At {RANKS} ranks, each data-parallel algorithm trains the same small model (an MLP with two
hidden layers of 256 on `digits`, batches of 256, {args.steps} steps per rank, averaging
interval 8, a checkpoint every {args.checkpoint_every} steps, seed 0) three times: without a
fault, with `--fault 2:{args.fault_step}` (rank 2 is killed by SIGKILL at the start of its
step {args.fault_step}) and with `--straggler {STRAGGLER}` (rank 1 sleeps 1/0.6 - 1 = 0.67
times each gradient's measured time: [fault_schedule.py](../../hpcopt/run/fault_schedule.py)).
The schedules are study axes (`fault`, `straggler` in the sweep file), so the same fault
and the same straggler replay on every algorithm. Rank loss: {mode}. Figures from
`hpcopt collect`: `steps_lost`, `recovery_seconds`
([studies.md](../studies.md#faults-and-stragglers-as-axes)).

Measured on a shared 2-core machine that was loaded (load average {load[0]:.1f} before the
study, {load[1]:.1f} after; {RANKS} ranks oversubscribe its cores): the seconds are single runs
on a noisy machine and only their size is meaningful, the losses are exact.

{chr(10).join(head + body)}

- **recovery s**: from the kill to the resumed job's first step: MPI noticing the loss and
  ending the job, a new launch, set-up, reading the checkpoint. **redone steps s**: the steps
  done again since the checkpoint, priced at the fault-free run's mean step time. The two add up
  to what the loss cost in time; the scheduler's wait for a requeued job comes on top.
- **quality cost**: the final evaluation loss minus the fault-free run's. Under abort and
  resume it is zero by construction: the resume is bitwise the uninterrupted run (the lost
  steps are redone from the checkpoint), so the cost of a lost rank is time only. A straggler
  changes no number either (its sleep is outside the arithmetic), only the wall time: every
  round waits for rank 1, so each run should take up to 1/0.6 = 1.67 times as long, less where
  communication and set-up dominate. Measured here, straggler / fault-free ranged from
  {min(ratios):.2f} to {max(ratios):.2f}: single runs of a few seconds on a loaded machine, so
  {NOISY if min(ratios) < 1 else "the noise of single runs is of the size of the differences"}.

![recovery and straggler cost per algorithm](elastic.png)

{continued}"""


def study(directory: Path, text: str, launcher: list[str], python: str, finished: tuple[int, ...]) -> None:
    """Write the sweep file into ``directory``, run every task with ``python``, collect."""
    directory.mkdir(parents=True)
    (directory / "elastic.toml").write_text(text)
    hpcopt("sweep", "elastic.toml", "--out", ".", cwd=directory, python=python)
    run_tasks(directory.resolve(), launcher, python, finished)
    hpcopt("collect", ".", cwd=directory, python=python)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results",
                        help="where elastic.md and elastic.png go")
    parser.add_argument("--runs", type=Path, default=Path("elastic-runs"),
                        help="the study directory (emptied first)")
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--checkpoint-every", type=int, default=32)
    parser.add_argument("--fault-step", type=int, default=50)
    parser.add_argument("--launcher", default=f"mpiexec -n {RANKS}",
                        help="what starts a task's ranks in the abort study (this interpreter's MPI)")
    parser.add_argument("--ulfm-python", default="",
                        help="an interpreter whose mpi4py runs on Open MPI 5 with ULFM: the continue "
                        "study runs with it ('' = no continue study)")
    parser.add_argument("--ulfm-launcher", default=f"mpirun --with-ft ulfm -n {RANKS}",
                        help="what starts a task's ranks in the continue study (found first in "
                        "--ulfm-python's folder)")
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    load_before = os.getloadavg()[0]
    shutil.rmtree(args.runs, ignore_errors=True)
    args.runs.mkdir(parents=True)
    start = time.monotonic()
    abort = args.runs / "abort"
    study(abort, study_text(args, "abort"), shlex.split(args.launcher), sys.executable, (0,))
    lines = table(abort)
    continued, survivors = "", []
    if args.ulfm_python:
        from hpcopt.errors import EXIT_CONTINUED

        survived = args.runs / "continue"
        study(survived, study_text(args, "continue"), shlex.split(args.ulfm_launcher), args.ulfm_python,
              (0, EXIT_CONTINUED))
        survivors = continue_table(survived)
        continued = continue_section(survivors, args)
    args.out.mkdir(parents=True, exist_ok=True)
    figure(lines, survivors, args.out / "elastic.png")
    text = page(lines, args, (load_before, os.getloadavg()[0]), continued)
    written = args.out / "elastic.md"
    moments = written.read_text().partition(MOMENTS_HEADING)[2] if written.exists() else ""
    if moments:  # rank_loss_moments.py's section, kept
        text = text.rstrip("\n") + "\n\n" + MOMENTS_HEADING + moments
    written.write_text(text)
    print(f"wrote {args.out / 'elastic.md'} and elastic.png ({time.monotonic() - start:.0f} s of runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
