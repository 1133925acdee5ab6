"""benchmarks/common/study.py: a reproduction's sweep file reads back as hpcopt sweep reads it,
a run is found by its options (an option not given is told apart), and the study files next to
the reproductions are the ones their scripts make for the commands of their pages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout: the benchmarks package

from benchmarks.common.study import Run, find_run, sweep_file, toml_value  # noqa: E402
from hpcopt.study.spec import load_study, tasks  # noqa: E402


def test_a_sweep_file_reads_back_as_hpcopt_sweep_reads_it(tmp_path):
    assert toml_value([[14, 10], [2]]) == "[[14, 10], [2]]" and toml_value(False) == "false"
    text = sweep_file({"name": "t"}, {"dataset": "digits", "lr": 0.1, "progress": False},
                      [{"ranks": [2], "interval": [1, 4], "eval_every": [22]},
                       {"ranks": [1], "interval": [8], "local_steps": [[3]], "steps": [8]}],
                      "two grids\nof one study")
    assert text.startswith("# two grids\n# of one study\n[job]\n")
    path = tmp_path / "study.toml"
    path.write_text(text)
    found = tasks(load_study(path))
    assert [(t.ranks, t.args[6:]) for t in found] == [
        (1, ("--interval", "8", "--local-steps", "3", "--steps", "8")),
        (2, ("--interval", "1", "--eval-every", "22")), (2, ("--interval", "4", "--eval-every", "22"))]


def test_a_run_is_found_by_its_options(tmp_path):
    runs = [Run(tmp_path / "a", 4, {"interval": "8", "steps": "64"}, {}),
            Run(tmp_path / "b", 4, {"interval": "8", "steps": "64", "local_steps": "14,10,6,2"},
                {"rounds": "8", "bytes_buffers": ""})]
    assert find_run(runs, 4, interval=8, local_steps=None).path.name == "a"
    assert find_run(runs, 4, interval=8, local_steps=[14, 10, 6, 2]).path.name == "b"
    with pytest.raises(SystemExit, match="2 runs of the study"):
        find_run(runs, 4, interval=8)
    with pytest.raises(SystemExit, match="0 runs of the study"):
        find_run(runs, 2, interval=8)
    assert runs[1].number("rounds") == 8 and runs[1].number("bytes_buffers", 0) == 0
    with pytest.raises(KeyError, match="no bytes_buffers"):
        runs[1].number("bytes_buffers")


def test_the_resnet_study_file_is_the_one_of_the_pages_command():
    from benchmarks.reproduce import resnet_mnist

    args = resnet_mnist.parse_args("--epochs 12 --seeds 0 1 --depth 8 --width 8".split())
    path = ROOT / "benchmarks" / "reproduce" / "resnet_mnist.toml"
    assert path.read_text() == resnet_mnist.study_text(args, cifar=False)
    found = tasks(load_study(path))
    assert len(found) == 2 * (5 + 4 + 3) and {t.ranks for t in found} == {resnet_mnist.RANKS}
