"""``python -m hpcopt bench``: dispatch, option errors, and the scaling study at a tiny size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcopt.bench.common import parse_bytes, sizes_between
from hpcopt.errors import HpcoptError
from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[2]


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
    assert "| prsgd | weak | 1 | 32 |" in done.stdout and "| prsgd | strong | 1 |" in done.stdout
    assert "| prsgd | weak | 1 | 32 | 1 (user) |" in done.stdout
    assert (tmp_path / "table.md").read_text().count("| prsgd |") == 3
    # each launch reported as it starts and as it ends, with the time left
    progress = done.stderr.splitlines()
    assert [line.split(":")[-1].split(",")[0].strip() for line in progress[::2]] == ["started"] * 3
    assert progress[1].startswith("[1/3] prsgd weak, 1 rank(s), batch 32/rank: ") and " eta " in progress[1]
    assert progress[-1].startswith("[3/3] ") and progress[-1].endswith("eta 0 s")


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
