"""docs/results/elastic.md, section "Every moment": each rank lost at each moment of a job.

A 3-rank ``--on-rank-loss continue`` job (``mpirun --with-ft ulfm``, Open MPI's ULFM: run it
with the interpreter of an Open MPI environment) loses rank 0, 1 or 2 at each moment of
tests/faults/moments.py (while MPI starts, in set-up, in a step, a trace row, a checkpoint's
agreement and gather, the summary, the end agreement; by ``kill -9``, ``os._exit(1)`` or
SIGSTOP). Each case must recover (exit 5, the run's steps in the trace) or end every survivor
with one line and exit 6 within a bounded time, and never hang (a job past ``HARD_SECONDS``
is killed and counted as a hang). The table replaces the page's section of that name (or is
appended to it).

    python benchmarks/faults/rank_loss_moments.py --page docs/results/elastic.md
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.faults.jobs import SMALL, Send, run_job  # noqa: E402
from tests.faults.moments import MOMENTS, code, expected  # noqa: E402

RANKS, STALL, STEPS = 3, 2, 32
HARD_SECONDS = 120.0
HEADING = "## Every moment"


def one(name: str, rank: int, directory: Path) -> dict[str, object]:
    """Lose ``rank`` at moment ``name``: the outcome, exit code, seconds and the job's lines."""
    moment, run = MOMENTS[name], directory / f"{name.replace(' ', '-').replace(',', '')}-{rank}"
    argv = ["train", *SMALL, "--steps", str(STEPS), "--out", str(run), "--on-rank-loss", "continue",
            "--stall-timeout", str(STALL)]
    try:
        if moment.call:
            job = run_job([], ranks=RANKS, python_code=code(moment, rank, argv),
                          mpiexec_args=("--with-ft", "ulfm"), timeout=HARD_SECONDS)
        else:
            job = run_job(argv, ranks=RANKS, send=Send(signal.SIGKILL, 0.3, rank, "exec"),
                          mpiexec_args=("--with-ft", "ulfm"), timeout=HARD_SECONDS)
    except AssertionError:
        return {"name": name, "rank": rank, "outcome": "HANG", "code": "-", "seconds": HARD_SECONDS,
                "lines": 0, "ok": False}
    lines = job.hpcopt_lines()
    want = expected(moment, rank)
    codes = (want, 1) if moment.how == "exit" else (want,)
    recovered = want == 5 and any("going on at 2 ranks" in line for line in lines)
    ended = want == 6 and len(lines) == 1 and lines[0].startswith("hpcopt: error: ")
    ok = job.returncode in codes and (recovered or ended) and "Traceback" not in job.stderr
    outcome = ("recovered at 2 ranks" if recovered else "one line, exit 6" if ended else
               f"unexpected ({len(lines)} lines)")
    return {"name": name, "rank": rank, "outcome": outcome, "code": job.returncode,
            "seconds": job.after_fault if job.after_fault is not None else job.seconds,
            "lines": len(lines), "ok": ok}


def section(results: list[dict[str, object]], load: tuple[float, float], seconds: float) -> str:
    rows = [f"| {r['name']} | {MOMENTS[str(r['name'])].how} | {r['rank']} | {r['outcome']} | {r['code']} | "
            f"{float(r['seconds']):.1f} | {'yes' if r['ok'] else '**no**'} |" for r in results]  # type: ignore[arg-type]
    good = sum(bool(r["ok"]) for r in results)
    hangs = sum(r["outcome"] == "HANG" for r in results)
    worst = max(float(r["seconds"]) for r in results)  # type: ignore[arg-type]
    return f"""{HEADING}

Written by `python benchmarks/faults/rank_loss_moments.py --page docs/results/elastic.md`
([rank_loss_moments.py](../../benchmarks/faults/rank_loss_moments.py)) with Open MPI 5's
`mpirun --with-ft ulfm -n {RANKS}`: a PR-SGD job of {STEPS} steps (the fault tests' small MLP on
`digits`, a round every 4 steps, a checkpoint every 8) with `--on-rank-loss continue
--stall-timeout {STALL}` loses one rank at one moment
([moments.py](../../tests/faults/moments.py): the call on whose entry it is lost, and how).
Wanted ([failures.md](../failures.md#--on-rank-loss-abortcontinue-default-abort)): recovery
(exit 5) where the survivors can go on, else one line from the lowest survivor and exit 6
(`mpirun` reports 1 where the lost rank exited 1 itself), and no hang. **seconds**: from the
loss (its announcement; for `start`, the kill) to the job's end: a loss MPI reports ends or is
survived at once, one it does not report (`exit`, `stop`) after the stall timeout and the
watchdog's question (about {STALL + 1} s), one while MPI starts after `max(S, 10)` s.

{good} of {len(results)} cases as wanted, {hangs} hangs; the slowest ended {worst:.1f} s after its
loss. {len(results)} jobs in {seconds:.0f} s on a shared 2-core machine (load average
{load[0]:.1f} before, {load[1]:.1f} after).

| moment | how | rank lost | outcome | exit | seconds | as wanted |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}
"""


def replace_section(page: str, text: str) -> str:
    """``page`` with its section under HEADING (to the next ``## `` heading) replaced by ``text``,
    or ``text`` appended."""
    if HEADING not in page:
        return page.rstrip("\n") + "\n\n" + text
    before, _, rest = page.partition(HEADING)
    after = rest.split("\n## ", 1)
    tail = "\n## " + after[1] if len(after) > 1 else ""
    return before + text + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--page", type=Path, default=Path("docs/results/elastic.md"))
    parser.add_argument("--moments", nargs="*", default=list(MOMENTS), choices=list(MOMENTS))
    args = parser.parse_args(argv)
    load_before, start = os.getloadavg()[0], time.monotonic()
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for name in args.moments:
            for rank in range(RANKS):
                results.append(one(name, rank, Path(directory)))
                r = results[-1]
                print(f"{name} rank {rank}: {r['outcome']}, exit {r['code']}, {float(r['seconds']):.1f} s"  # type: ignore[arg-type]
                      f"{'' if r['ok'] else '  NOT AS WANTED'}", flush=True)
    text = section(results, (load_before, os.getloadavg()[0]), time.monotonic() - start)
    page = args.page.read_text() if args.page.exists() else ""
    args.page.write_text(replace_section(page, text))
    print(f"wrote {args.page}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
