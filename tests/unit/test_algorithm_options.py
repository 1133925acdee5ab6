"""The ``[algorithm]`` options of all algorithms share one namespace: a name has one type,
each algorithm keeps its own default, and ``--help`` says which algorithms an option applies
to. Every registered algorithm is checked, so a new one is covered without editing a list."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from hpcopt.algorithms.base import merge_options, option
from hpcopt.algorithms.registration import registry
from hpcopt.cli import make_parser
from hpcopt.config import ALGORITHM_OPTIONS, algorithm_section, build_config
from hpcopt.errors import HpcoptError
from tests.registered import refused, users


@dataclass(frozen=True)
class Outer:
    name: ClassVar[str] = "outer_toy"
    implied: ClassVar[dict[str, Any]] = {}
    lr: float = option(0.1, "learning rate")
    momentum: float = option(0.0, "momentum")
    outer: float = option(0.7, "outer learning rate")


@dataclass(frozen=True)
class Inner(Outer):
    """A subclass that declares its own default for an inherited option."""

    name: ClassVar[str] = "inner_toy"
    momentum: float = option(0.9, "momentum")


@dataclass(frozen=True)
class Pipelined:
    name: ClassVar[str] = "pipelined_toy"
    implied: ClassVar[dict[str, Any]] = {}
    outer: str = option("nesterov", "outer loop")


def test_one_name_with_two_types_is_refused_when_the_section_is_built():
    with pytest.raises(TypeError, match="'outer' is declared as float by Outer and as str by Pipelined"):
        algorithm_section({"outer_toy": Outer, "pipelined_toy": Pipelined})


def test_each_algorithm_keeps_its_own_default_of_a_shared_option():
    section = algorithm_section({"outer_toy": Outer, "inner_toy": Inner})
    assert section(algorithm="inner_toy").momentum == 0.9
    assert section(algorithm="outer_toy").momentum == 0.0
    assert section(algorithm="inner_toy", momentum=0.5).momentum == 0.5
    assert merge_options({"outer_toy": Outer, "inner_toy": Inner})["momentum"].defaults == {
        "outer_toy": 0.0, "inner_toy": 0.9}


def test_the_registered_pipeline_algorithms_get_their_own_lr_and_momentum():
    for name in ("pprs", "pipelined_agd"):
        section = build_config(None, {"algorithm": name}).algorithm
        assert (section.lr, section.momentum) == (1e-3, 0.9)
    assert (build_config(None, {}).algorithm.lr, build_config(None, {}).algorithm.momentum) == (0.1, 0.0)


@pytest.mark.parametrize("name", list(registry()))
def test_every_registered_algorithm_builds_with_its_defaults(name):
    section = build_config(None, {"algorithm": name}).algorithm
    for key, merged in ALGORITHM_OPTIONS.items():
        assert getattr(section, key) == merged.defaults.get(name, merged.default), key


@pytest.mark.parametrize("name", list(registry()))
def test_another_algorithms_option_is_refused_naming_its_users(name):
    foreign = next(o for o in ALGORITHM_OPTIONS.values()
                   if name not in o.users and o.type in (int, float) and math.isfinite(o.default))
    value = str(foreign.default + 3)
    if registry()[name].implied.get(foreign.key) == foreign.type(value):
        pytest.skip(f"{name} implies {foreign.key} = {value}")
    with pytest.raises(HpcoptError, match=refused(foreign.key, name)):
        build_config(None, {"algorithm": name, foreign.key: value})


def test_help_names_the_algorithms_an_option_applies_to_and_their_defaults():
    train = next(a for a in make_parser()._subparsers._group_actions[0].choices.values()
                 if a.prog.endswith("train"))
    helps = {a.dest: " ".join(a.help.split()) for a in train._actions if a.help}
    assert "[algorithm: pprs; default: 10]" in helps["samples"]
    assert {"celgc", "naive_clip"} <= set(users("gamma"))
    assert f"[algorithm: {', '.join(users('gamma'))}; default: inf]" in helps["gamma"]
    lr = ALGORITHM_OPTIONS["lr"].defaults
    thousandth = [name for name, default in lr.items() if default == 1e-3]
    assert {"pprs", "pipelined_gd", "pipelined_agd", "diloco"} <= set(thousandth)
    assert set(lr.values()) == {0.1, 1e-3}, "a third default: say it here"
    assert f"[algorithm; default: 0.1; 0.001 for {', '.join(thousandth)}]" in helps["lr"]
