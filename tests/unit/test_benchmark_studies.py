"""benchmarks/common/study.py: a reproduction's sweep file reads back as hpcopt sweep reads it,
a run is found by its options (an option not given is told apart), and the study files next to
the reproductions are the ones their scripts make for the commands of their pages."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.command_line import ROOT

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


def test_the_low_communication_study_file_is_the_one_of_the_pages_command():
    from benchmarks.reproduce import low_communication

    args = low_communication.parse_args("--steps 1024 --seeds 0 1 --intervals 16 64 256".split())
    path = ROOT / "benchmarks" / "reproduce" / "low_communication.toml"
    assert path.read_text() == low_communication.study_text(args)
    found = tasks(load_study(path))
    cases = low_communication.cases(args)
    assert len(found) == 2 * len(cases) == 2 * 10
    assert len({case.label for case in cases}) == len(cases)  # one row per case on the page
    streaming = [t for t in found if "--fragments" in t.args]
    assert len(streaming) == 4 and all(t.args[t.args.index("--interval") + 1] == "64" for t in streaming)


def _trace(comm: dict, ops: dict, wall: float = 10.0, steps: int = 100, **columns):
    from hpcopt.config import build_config
    from hpcopt.io.trace import Trace

    fields = {label: {"calls": np.array([c]), "bytes": np.array([b]), "seconds": np.array([s])}
              for label, (c, b, s) in comm.items()}
    return Trace(Path("t.h5"), {}, build_config(None, {}), {"step": np.array([steps]), **columns},
                 fields, {"wall": wall}, ops)


def test_the_low_communication_projection_adds_modelled_seconds_to_measured_computation():
    from benchmarks.reproduce.low_communication import largest_message, projected
    from hpcopt.comm.costmodel import PROFILES, op_seconds

    eth10 = PROFILES["eth10"]
    # 10 rounds of 8 MB: 2 s of wall, 0.5 s of it measured communication, the set-up left out
    plain = _trace({"average": (10, 80_000_000, 0.5), "init": (1, 8_000_000, 7.0)},
                   {"average": "allreduce", "init": "bcast"}, wall=2.0)
    for workers in (4, 64):
        expected = 1.5 + op_seconds("allreduce", 10, 80_000_000, workers, eth10)
        assert projected(plain, 0, workers, "eth10") == pytest.approx(expected)
    assert largest_message(plain) == 8_000_000
    # fragments: each reduction hidden behind tau steps of the computation per step (15 ms)
    calls, size = 40, 20_000_000
    streamed = _trace({"fragments": (calls, calls * size // 10, 0.5)}, {"fragments": "iallreduce"},
                      wall=2.0, peak_bytes_in_flight=np.array([size // 10]))
    unhidden = op_seconds("iallreduce", calls, calls * size // 10, 4, eth10) / calls
    assert projected(streamed, 0, 4, "eth10") == pytest.approx(1.5 + calls * unhidden)
    assert projected(streamed, 2, 4, "eth10") == pytest.approx(1.5 + calls * max(0.0, unhidden - 0.03))
    assert projected(streamed, 100, 4, "eth10") == pytest.approx(1.5)  # all hidden
    assert largest_message(streamed) == size // 10
