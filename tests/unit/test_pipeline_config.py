"""Config options of the pipeline algorithms (pprs, pipelined_gd, pipelined_agd)."""

import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from tests.registered import refused


def test_pipeline_defaults_need_no_files_or_extra_flags():
    cfg = build_config(None, {"algorithm": "pprs"})
    assert (cfg.data.problem, cfg.algorithm.samples, cfg.algorithm.smoothing) == ("attack", 10, -1.0)
    assert (cfg.algorithm.outer, cfg.algorithm.pipeline, cfg.model.stages) == ("nesterov", "gpipe", ())
    assert build_config(None, {"algorithm": "pipelined_agd", "momentum": "0.5"}).algorithm.momentum == 0.5


@pytest.mark.parametrize("overrides,match", [
    ({"samples": "0"}, "samples K must be >= 1"),
    ({"smoothing": "-0.1"}, "smoothing \\(gamma\\) must be >= 0"),
    ({"smoothing": "inf"}, "smoothing \\(gamma\\) must be >= 0"),
    ({"lr": "0"}, "lr must be > 0"),
    ({"lr": "inf"}, "lr must be finite"),
    ({"outer": "adam"}, "unknown outer loop"),
    ({"pipeline": "zigzag"}, "unknown pipeline schedule"),
    ({"problem": "mnist"}, "unknown problem"),
    ({"images": "0"}, "images must be >= 1"),
    ({"shots": "0"}, "shots must be >= 1"),
    ({"eps": "0"}, "eps must be > 0"),
    ({"stages": "3,2"}, "stages must be increasing"),
    ({"momentum": "1"}, "momentum must be in \\[0, 1\\)"),
    ({"interval": "4"}, refused("interval", "pprs")),
    ({"model": "plain_cnn"}, "pipeline algorithms train an mlp"),
])
def test_bad_pprs_options_are_user_errors(overrides, match):
    with pytest.raises(HpcoptError, match=match):
        build_config(None, {"algorithm": "pprs", **overrides})


@pytest.mark.parametrize("overrides,match", [
    ({"algorithm": "pipelined_agd", "momentum": "0"}, "pipelined_agd needs --momentum in \\(0, 1\\)"),
    ({"algorithm": "pipelined_gd", "momentum": "0.9"}, "momentum applies only to"),
    ({"algorithm": "pipelined_gd", "samples": "4"}, "samples applies only to --algorithm pprs"),
    ({"algorithm": "prsgd", "pipeline": "1f1b"}, "pipeline applies only to"),
    ({"algorithm": "prsgd", "problem": "few_shot"}, "problem applies only to"),
    ({"algorithm": "celgc", "stages": "2"}, "stages applies only to"),
])
def test_pipeline_options_are_refused_where_they_do_not_apply(overrides, match):
    with pytest.raises(HpcoptError, match=match):
        build_config(None, overrides)
