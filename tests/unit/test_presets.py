"""Presets (hpcopt/presets.py): a named bundle of option defaults under the file and the flags,
recorded in the run's config, shown in --help and the run header, exact on resume."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt.cli import main, make_parser, parse, run_config
from hpcopt.config import build_config, check_resume, config_from_stored, to_toml, tomllib
from hpcopt.errors import HpcoptError
from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from hpcopt.presets import PRESETS
from tests.runs import fresh_train

PAPER = PRESETS["diloco-paper"]


def test_diloco_paper_sets_the_papers_values_and_is_recorded():
    config = build_config(None, {"preset": "diloco-paper"})
    assert config.run.preset == "diloco-paper"
    for key, value in PAPER.items():
        assert getattr(config.algorithm, key) == value, key
    assert (config.algorithm.lr, config.algorithm.weight_decay, config.algorithm.interval,
            config.algorithm.schedule, config.algorithm.warmup) == (4e-4, 0.1, 500, "cosine", 1000)
    assert (config.algorithm.outer_optimizer, config.algorithm.outer_lr,
            config.algorithm.outer_momentum) == ("nesterov", 0.7, 0.9)
    assert 'preset = "diloco-paper"' in to_toml(config)
    assert config_from_stored(tomllib.loads(to_toml(config))) == config


def test_the_file_and_the_flags_override_a_preset():
    config = build_config({"run": {"preset": "diloco-paper"}, "algorithm": {"interval": 50}},
                          {"warmup": "10"})
    assert (config.algorithm.interval, config.algorithm.warmup, config.algorithm.lr) == (50, 10, 4e-4)
    # the same values without the preset are the same computation: only the name differs
    by_hand = build_config(None, {**{k: str(v) for k, v in PAPER.items()}, "interval": "50",
                                  "warmup": "10"})
    assert by_hand.algorithm == config.algorithm and by_hand.run.preset == ""


@pytest.mark.parametrize("options, message", [
    ({"preset": "diloco"}, "unknown preset 'diloco' \\(choose from diloco-paper\\)"),
    ({"preset": "diloco-paper", "algorithm": "prsgd"},
     "preset diloco-paper is a preset of --algorithm diloco, not prsgd"),
])
def test_an_unknown_preset_or_another_algorithm_is_refused_in_one_line(options, message):
    with pytest.raises(HpcoptError, match=message):
        build_config(None, options)


def test_a_resumed_run_may_not_change_its_preset():
    stored = build_config(None, {"preset": "diloco-paper", "steps": "2000"})
    with pytest.raises(HpcoptError, match="cannot change preset when resuming"):
        check_resume(stored, build_config(stored.to_dict(), {"preset": ""}))


def test_help_lists_the_presets_and_what_they_set(capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("diloco-paper = algorithm diloco, lr 0.0004, weight_decay 0.1, interval 500, "
            "schedule cosine, warmup 1000") in text


SMALL = ["--dataset", "digits", "--hidden", "8", "--batch-size", "8", "--dtype", "float64",
         "--interval", "4", "--warmup", "3", "--steps", "12"]


def test_a_preset_run_shows_it_in_its_header_and_resumes_bit_for_bit(tmp_path, capsys):
    first = tmp_path / "first"
    assert main(["train", "--preset", "diloco-paper", *SMALL, "--checkpoint-every", "6",
                 "--out", str(first)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("hpcopt train: diloco (preset diloco-paper) on digits")
    assert "wd 0.1" in header and "schedule cosine, warmup 3" in header
    args = parse(["resume", str(first / "checkpoints" / "step-000000006.h5"),
                  "--out", str(tmp_path / "resumed"), "--progress", "false"])
    config = run_config(args)
    assert config.run.preset == "diloco-paper" and config.algorithm.warmup == 3
    _, resumed = fresh_train(config, resume=args.resume)
    whole = read_checkpoint(first / "checkpoints" / "step-000000012.h5")
    np.testing.assert_array_equal(resumed.x, whole.model)
    for name in ("exp_avg", "exp_avg_sq"):
        np.testing.assert_array_equal(getattr(resumed, name), whole.rows[name][0], err_msg=name)
    for name in ("anchor", "outer_buffer"):
        np.testing.assert_array_equal(getattr(resumed, name), whole.shared[name], err_msg=name)
