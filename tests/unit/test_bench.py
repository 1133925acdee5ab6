"""``python -m hpcopt bench``: dispatch, option errors, and the scaling study at a tiny size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcopt.bench.common import parse_bytes, sizes_between
from hpcopt.errors import HpcoptError
from tests.command_line import ROOT
from tests.timeouts import scaled


def hpcopt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hpcopt", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=scaled(120))


def test_sizes():
    assert parse_bytes("64K") == 65536 and parse_bytes("2M") == 2 << 20 and parse_bytes("100") == 100
    assert sizes_between(1, 16, 4) == [1, 4, 16]
    with pytest.raises(HpcoptError):
        parse_bytes("lots")
    with pytest.raises(HpcoptError):
        sizes_between(8, 4)


def test_bench_scaling_runs_from_outside_the_repository(tmp_path):
    """The installed package needs no benchmarks/ directory: run from an empty directory."""
    done = hpcopt("bench", "scaling", "--ranks", "1", "--repeats", "1", "--steps", "4",
                  "--out", "table.md", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "| prsgd | weak | 1 | 32 | 1 |" in done.stdout and "| prsgd | strong | 1 | 32 | 1 |" in done.stdout
    assert "| prsgd | weak | 1 | 32 | 2 |" in done.stdout
    assert "1 rank(s) with 2 BLAS threads each take " in done.stdout and "load average" in done.stdout
    assert (tmp_path / "table.md").read_text().count("| prsgd |") == 3
    # each launch reported as it starts and as it ends, with the time left
    progress = done.stderr.splitlines()
    assert [line.split(":")[-1].split(",")[0].strip() for line in progress[::2]] == ["started"] * 3
    assert progress[1].startswith("[1/3] prsgd weak, 1 rank(s), batch 32/rank, 1 thread(s)/rank: ")
    assert " eta " in progress[1]
    assert progress[-1].startswith("[3/3] ") and progress[-1].endswith("eta 0 s")


def test_scaling_efficiency_is_against_one_thread_per_rank_and_above_one_is_explained():
    """Every scaling row and its 1-rank baseline run 1 thread per rank; the thread rows get a
    ratio to 1 thread instead of an efficiency; an efficiency above 1 prints the note."""
    from hpcopt.bench.scaling import ABOVE_ONE_NOTE, cases_for, table

    cases = cases_for([1, 2], ["prsgd"], 32)
    assert [c for c in cases if c[4] != 1] == [("prsgd", "weak", 1, 32, 2), ("prsgd", "weak", 2, 32, 2)]
    assert cases_for([1, 2], ["prsgd"], 32, thread_rows=False) == [c for c in cases if c[4] == 1]
    ms = {("prsgd", "weak", 1, 32, 1): 2.0, ("prsgd", "weak", 2, 32, 1): 2.5,
          ("prsgd", "strong", 1, 64, 1): 4.0, ("prsgd", "strong", 2, 32, 1): 2.5,
          ("prsgd", "weak", 1, 32, 2): 8.0, ("prsgd", "weak", 2, 32, 2): 30.0}
    assert list(ms) == cases
    med = {case: {"seconds_per_step": t / 1e3, "samples_per_second": 1.0, "comm_share": 0.1,
                  "threads": case[4]} for case, t in ms.items()}
    lines = table(med, [1, 2], 32, "header")
    rows = lines[4:10]
    assert [row.split(" | ")[-1] for row in rows] == ["1.00 |", "0.80 |", "1.00 |", "0.80 |", "- |", "- |"]
    assert "1 rank(s) with 2 BLAS threads each take 4.00x the time per step of 1 thread each" in lines
    assert "2 rank(s) with 2 BLAS threads each take 12.00x the time per step of 1 thread each" in lines
    assert ABOVE_ONE_NOTE not in lines
    med[("prsgd", "strong", 2, 32, 1)]["seconds_per_step"] = 1.6e-3  # 4 / (2 x 1.6) = 1.25
    lines = table(med, [1, 2], 32, "header")
    assert lines[7].endswith("| 1.25 |") and lines[-1] == ABOVE_ONE_NOTE


def test_bench_option_errors_are_one_line(tmp_path):
    done = hpcopt("bench", "allreduce", "--max-bytes", "lots", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a size" in done.stderr
    done = hpcopt("bench", "pingpong", cwd=tmp_path)
    assert done.returncode == 2 and "invalid choice" in done.stderr


@pytest.mark.parametrize("command", ["allreduce", "p2p", "scaling"])
def test_every_bench_option_says_what_it_does_and_its_default(command, capsys):
    """Each option of ``bench COMMAND --help`` has a description, and its default where it has one."""
    from hpcopt.bench import allreduce, p2p, scaling

    with pytest.raises(SystemExit):
        {"allreduce": allreduce, "p2p": p2p, "scaling": scaling}[command].main(["--help"])
    text = capsys.readouterr().out
    options = [line.split()[0] for line in text.splitlines() if line.startswith("  --")]
    assert options, text
    for option in options:
        block = text.split(f"  {option}", 1)[1].split("\n  --", 1)[0]
        assert len(block.split()) > 2, (option, block)  # more than the metavar: a description
    assert "(default: 4M)" in text or "(default: 16M)" in text or "(default: 600)" in text, text
    assert "(default: None)" not in text
