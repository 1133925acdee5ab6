"""The declarations a type checker reads for what is made at import: AlgorithmSection for the
generated AlgorithmConfig, AlgorithmClass for the registry's classes."""

import dataclasses
import typing

from hpcopt.algorithms.base import AlgorithmClass, option_fields
from hpcopt.algorithms.registration import registry
from hpcopt.config import AlgorithmConfig, AlgorithmSection


def test_algorithm_section_declares_what_the_generated_section_has():
    declared = {name: hint for name, hint in typing.get_type_hints(AlgorithmSection).items()
                if name not in ("__dataclass_fields__", "options")}
    assert declared == {"algorithm": str}
    assert AlgorithmConfig.options.keys() == {f.name for f in dataclasses.fields(AlgorithmConfig)} - {"algorithm"}
    generated = {f.name: f.type for f in dataclasses.fields(AlgorithmConfig)}
    assert generated["algorithm"] in (str, "str")
    for cls in registry().values():  # every option of every algorithm is a field of the section
        assert {f.name for f in option_fields(cls)} <= set(generated)


def test_every_registered_class_declares_the_class_attributes_of_algorithm_class():
    wanted = list(typing.get_type_hints(AlgorithmClass))
    assert set(wanted) == {"name", "parallelism", "clips", "implied"}
    for name, cls in registry().items():
        assert cls.name == name
        for attribute in wanted:
            assert hasattr(cls, attribute), f"{cls.__qualname__} has no {attribute}"
