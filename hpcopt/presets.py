"""Presets: named bundles of option defaults (``--preset NAME``, ``[run] preset``).

A preset sits between the defaults and what the user sets: defaults <- preset <- TOML file <-
flags, so any option it sets can still be changed; ``build_config`` applies it (a ``RunConfig``
made by hand records the name and checks it, but sets nothing else). Its name is recorded in
the run's config (``[run] preset``, in traces and checkpoints) beside every resolved value, so
a resumed run computes the same whatever a later hpcopt's preset holds; changing it on resume
is refused like any option that changes the computation. The algorithm a preset names is
fixed: another ``algorithm`` with it is refused (its other options would mean something else).

``diloco-paper``: DiLoCo as Douillard et al. ran it ("DiLoCo: Distributed Low-Communication
Training of Language Models", arXiv 2311.08105, 2023, Table 5): AdamW with lr 4e-4, weight
decay 0.1, 1000 steps of linear warmup then cosine decay, H = 500 inner steps, the Nesterov
outer step (lr 0.7, mu 0.9: ``--algorithm diloco``'s defaults). docs/algorithms.md compares it
with ``--algorithm diloco``'s own defaults.
"""

from __future__ import annotations

from typing import Any

from .errors import HpcoptError

PRESETS: dict[str, dict[str, Any]] = {
    "diloco-paper": {"algorithm": "diloco", "lr": 4e-4, "weight_decay": 0.1, "interval": 500,
                     "schedule": "cosine", "warmup": 1000},
}


def preset_values(name: Any) -> dict[str, Any]:
    """The options preset ``name`` sets ({} for ""), or a HpcoptError naming the presets."""
    if name == "":
        return {}
    if not isinstance(name, str) or name not in PRESETS:
        raise HpcoptError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return PRESETS[name]


def apply_preset(chosen: dict[str, dict[str, Any]], section_of: dict[str, str]) -> None:
    """Fill ``chosen`` (section -> key -> value set by the file and the flags) with the preset
    that ``chosen["run"]["preset"]`` names, where nothing was set; ``section_of``: key -> its
    section. A different ``algorithm`` than the preset's is refused."""
    name = chosen["run"].get("preset", "")
    values = preset_values(name)
    given = chosen["algorithm"].get("algorithm")
    if "algorithm" in values and given not in (None, values["algorithm"]):
        raise HpcoptError(f"preset {name} is a preset of --algorithm {values['algorithm']}, not "
                          f"{given}: drop one of them")
    for key, value in values.items():
        chosen[section_of[key]].setdefault(key, value)


def describe_presets() -> str:
    """The presets and what they set, for ``--help``."""
    return "; ".join(f"{name} = " + ", ".join(f"{key} {value}" for key, value in values.items())
                     for name, values in PRESETS.items())
