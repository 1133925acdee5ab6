"""The piece registries (hpcopt/algorithms/pieces.py): each kind by name, built in, by call and by
entry point; each piece made from the options it reads, with its own defaults, and the options
it does not read refused when set, naming the pieces that read them."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from hpcopt.algorithms import LocalSGD, Piece, inner_optimizers, outer_optimizers, pieces, reducers
from hpcopt.algorithms.diloco import DiLoCo
from hpcopt.algorithms.inner import Sgd
from hpcopt.algorithms.outer import OuterOptimizer
from hpcopt.algorithms.reducers import PLAIN, WireMean
from hpcopt.config import build_config
from hpcopt.errors import HpcoptError

REGISTRIES = (inner_optimizers, outer_optimizers, reducers)
#: A plain sgd step that reads no option: an inner optimizer of one's own.
PLAIN_SGD = Piece(lambda options: Sgd())
#: The outer sgd with its own default lr 0.5 where --outer-lr is unset.
HALF = Piece(lambda o: OuterOptimizer("sgd", o.get("outer_lr", 0.5), o["outer_momentum"]),
             ("outer_lr", "outer_momentum"))


@pytest.fixture(autouse=True)
def clean_registries(monkeypatch):
    """Each test starts from the built-ins and leaves them as they were."""
    monkeypatch.setattr(pieces, "entry_points", lambda group: [])
    for registry in REGISTRIES:
        monkeypatch.setattr(registry, "_by_call", {})
        monkeypatch.setattr(registry, "_entry_points", None)


def test_each_kind_holds_its_built_in_pieces_in_order():
    assert inner_optimizers.names() == ("sgd", "adamw", "muon")
    assert outer_optimizers.names() == ("average", "sgd", "nesterov", "slowmo", "fedadam", "fedyogi")
    assert reducers.names() == ("float32", "bfloat16", "float16", "int8")
    assert LocalSGD(wire="int8").reducer == WireMean("int8")
    assert LocalSGD().reducer is PLAIN
    with pytest.raises(HpcoptError, match=r"unknown wire 'int4' \(choose from float32, bfloat16, "):
        LocalSGD(wire="int4")


@pytest.mark.parametrize("options, outer", [
    ({"outer_optimizer": "fedadam"}, "outer fedadam (lr 0.01, betas 0.9, 0.99, tau 0.001)"),
    ({"outer_optimizer": "nesterov"}, "outer nesterov (lr 0.7, mu 0.9)"),
    ({"outer_optimizer": "nesterov", "outer_momentum": 0.5}, "outer nesterov (lr 1, mu 0.5)"),
    ({"outer_optimizer": "sgd"}, "outer sgd (lr 1)"),
    ({"outer_optimizer": "half"}, "outer sgd (lr 0.5)"),
    ({"outer_optimizer": "half", "outer_lr": 2.0}, "outer sgd (lr 2)"),
])
def test_a_piece_takes_its_own_defaults_where_the_options_are_unset(options, outer):
    outer_optimizers.register("half", HALF)
    assert LocalSGD(**options).outer.describe() == outer


def test_dilocos_nesterov_defaults_stay_its_own_on_the_command_line():
    """The config's choice: an --outer-optimizer other than DiLoCo's takes its own defaults."""
    config = build_config(None, {"algorithm": "diloco", "outer_optimizer": "fedadam"})
    assert (config.algorithm.outer_lr, config.algorithm.outer_momentum) == (1.0, 0.0)
    assert DiLoCo().outer.describe() == "outer nesterov (lr 0.7, mu 0.9)"


@pytest.mark.parametrize("options, message", [
    ({"inner_optimizer": "plain_sgd", "momentum": 0.9},
     "momentum applies only to inner_optimizer sgd, muon, not plain_sgd"),
    ({"inner_optimizer": "plain_sgd", "weight_decay": 0.1},
     "weight_decay applies only to inner_optimizer sgd, adamw, muon, not plain_sgd"),
    ({"outer_optimizer": "average", "outer_lr": 0.7},
     "outer_lr applies only to outer_optimizer sgd, nesterov, slowmo, fedadam, fedyogi, half, not average"),
    ({"outer_optimizer": "half", "outer_tau": 0.1},
     "outer_tau applies only to outer_optimizer fedadam, fedyogi, not half"),
    ({"inner_optimizer": "adamw", "momentum": 0.9}, "momentum applies only to inner_optimizer sgd, muon, "
                                                    "not adamw"),
])
def test_an_option_the_chosen_piece_does_not_read_is_refused(options, message):
    inner_optimizers.register("plain_sgd", PLAIN_SGD)
    outer_optimizers.register("half", HALF)
    with pytest.raises(HpcoptError, match=message):
        LocalSGD(**options)
    assert LocalSGD(inner_optimizer="plain_sgd").inner == Sgd()


@pytest.mark.parametrize("name, piece, message", [
    ("sgd", HALF, r"register\(outer_optimizer 'sgd'\): 'sgd' is a built-in outer_optimizer"),
    ("half", HALF.make, "is not a hpcopt.algorithms.Piece"),
    ("two words", HALF, "the name 'two words' is not an identifier"),
    ("odd", Piece(HALF.make, ("outer_lr", "lr")), "lr is not an option of outer_optimizer "
                                                  r"\(those are outer_lr, outer_momentum, outer_beta2"),
])
def test_a_piece_that_cannot_be_registered_is_refused(name, piece, message):
    with pytest.raises(HpcoptError, match=message):
        outer_optimizers.register(name, piece)


def test_registering_again_replaces_and_unregister_forgets():
    outer_optimizers.register("half", HALF)
    outer_optimizers.register("half", Piece(lambda o: OuterOptimizer("sgd", 0.25)))
    assert LocalSGD(outer_optimizer="half").outer == OuterOptimizer("sgd", 0.25)
    outer_optimizers.unregister("half")
    with pytest.raises(HpcoptError, match="unknown outer_optimizer 'half'"):
        LocalSGD(outer_optimizer="half")


def test_an_entry_point_of_the_kinds_group_is_found(monkeypatch):
    points = [EntryPoint("half", f"{__name__}:HALF", "hpcopt.outer_optimizers")]
    monkeypatch.setattr(pieces, "entry_points",
                        lambda group: points if group == "hpcopt.outer_optimizers" else [])
    assert outer_optimizers.names()[-1] == "half"
    assert "half" not in reducers.names()
    assert LocalSGD(outer_optimizer="half").outer == OuterOptimizer("sgd", 0.5)
    with pytest.raises(HpcoptError, match="'half' is already an entry point's"):
        outer_optimizers.register("half", HALF)


@pytest.mark.parametrize("value, message", [
    ("no_such_module_for_hpcopt:PIECE", "could not be loaded: ModuleNotFoundError"),
    (f"{__name__}:REGISTRIES", "is not a hpcopt.algorithms.Piece"),
])
def test_a_broken_entry_point_is_one_line_naming_it(monkeypatch, value, message):
    point = EntryPoint("broken", value, "hpcopt.reducers")
    monkeypatch.setattr(pieces, "entry_points", lambda group: [point] if group == point.group else [])
    with pytest.raises(HpcoptError, match=f"entry point broken = '{value}' \\(group 'hpcopt.reducers'\\)"
                                          f".*{message}"):
        LocalSGD(wire="broken")
