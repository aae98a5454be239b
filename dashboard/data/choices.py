"""The closed choices the What-if and Compare controls offer: hardware, models, tp, profiles, presets, policies.

Read from the shipped data files and the simulator's registries; nothing here renders.
"""

from __future__ import annotations

from functools import cache

from simulator.core.config import Batching, KVPolicy
from simulator.core.presets import PRESETS
from simulator.cost.profile import list_profiles, load_hardware
from simulator.fleet.router import ROUTERS

DEFAULT = "default"
"""Choice meaning "leave this knob to the preset (or vLLM's defaults)": the key is left out of the YAML."""
AUTO_PROFILE = "auto"
"""Profile choice meaning "the shipped profile for this hardware, model and tp"."""


@cache
def hardware_names() -> list[str]:
    return list(load_hardware())


def _profile_parts() -> list[tuple[str, str, int]]:
    """(hardware, model, tp) of each shipped profile, from its name '{hw}-{model}-tp{tp}-{kind}'."""
    out = []
    for name in list_profiles():
        head, sep, _kind = name.rpartition("-")
        hw_model, tp_sep, tp = head.rpartition("-tp")
        hardware, dash, model = hw_model.partition("-")
        if sep and tp_sep and dash and tp.isdigit():
            out.append((hardware, model, int(tp)))
    return out


def model_names() -> list[str]:
    return sorted({model for _, model, _ in _profile_parts()})


def tp_choices() -> list[int]:
    return sorted({1, 2, 4, 8} | {tp for _, _, tp in _profile_parts()})


def profile_choices() -> list[str]:
    return [AUTO_PROFILE, *list_profiles()]


PRESET_CHOICES: tuple[str, ...] = (DEFAULT, *PRESETS)
BATCHING_CHOICES: tuple[str, ...] = (DEFAULT, *(b.value for b in Batching))
KV_POLICY_CHOICES: tuple[str, ...] = (DEFAULT, *(k.value for k in KVPolicy))
PREFIX_CHOICES: tuple[str, ...] = (DEFAULT, "on", "off")
ROUTER_CHOICES: tuple[str, ...] = tuple(ROUTERS)
