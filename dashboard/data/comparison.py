"""The Compare page's variants: ``VariantControls`` as dotted-key overrides of one base scenario.

``compare_raw`` builds the scenario that runs them all on one request stream; nothing here renders.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from dashboard.data.choices import AUTO_PROFILE, DEFAULT
from dashboard.data.what_if import profile_control
from simulator.errors import ConfigError

MAX_VARIANTS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantControls:
    """One column of the Compare page: a name and the overrides it applies to the base scenario."""

    name: str
    replicas: int | None = None
    """None = as the base."""
    hardware: str = DEFAULT
    preset: str = DEFAULT
    batching: str = DEFAULT
    kv_policy: str = DEFAULT
    max_num_batched_tokens: int | None = None
    prefix_caching: str = DEFAULT
    router: str = DEFAULT
    other: tuple[tuple[str, Any], ...] = ()
    """Overrides from the scenario's own variants that no control covers, kept as dotted keys."""


VARIANT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(VariantControls) if f.name != "other")

_VARIANT_KEYS: dict[str, str] = {
    "replicas": "fleet.replicas",
    "hardware": "fleet.hardware",
    "preset": "engine.preset",
    "batching": "engine.batching",
    "kv_policy": "engine.kv.policy",
    "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "prefix_caching": "engine.prefix_caching",
    "router": "router.policy",
}


def _dotted(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_dotted(value, path + "."))
        else:
            out[path] = value
    return out


def variant_from_override(name: str, override: Mapping[str, Any]) -> VariantControls:
    """Controls for one of a scenario's own variants (keys no control covers go to ``other``)."""
    flat = _dotted(override)
    values: dict[str, Any] = {}
    for field_name, key in _VARIANT_KEYS.items():
        if key in flat:
            value = flat.pop(key)
            if field_name == "prefix_caching":
                value = "on" if value else "off"
            values[field_name] = value
    return VariantControls(name=name, other=tuple(sorted(flat.items())), **values)


def default_variants(base_raw: Mapping[str, Any]) -> list[VariantControls]:
    """The Compare page's first columns: the scenario's own variants, else the base against a change of
    engine preset (a question every user of the page asks first)."""
    own = base_raw.get("variants") or {}
    if own:
        return [variant_from_override(n, o or {}) for n, o in list(own.items())[:MAX_VARIANTS]]
    preset = (base_raw.get("engine") or {}).get("preset") or "vllm"
    other = "tgi" if preset != "tgi" else "vllm"
    return [VariantControls(name="base"), VariantControls(name=other, preset=other)]


def variant_override(variant: VariantControls) -> dict[str, Any]:
    """The dotted-key override of one variant, as a scenario's ``variants:`` entry holds it."""
    override: dict[str, Any] = dict(variant.other)
    values = asdict(variant)
    for field_name, key in _VARIANT_KEYS.items():
        value = values[field_name]
        if value is None or value == DEFAULT:
            continue
        if field_name == "prefix_caching":
            value = value == "on"
        override[key] = value
    return override


def compare_raw(base_raw: Mapping[str, Any], variants: Sequence[VariantControls], num_requests: int) -> dict[str, Any]:
    """The base scenario with the given variants (replacing its own), run on one request stream."""
    names = [v.name.strip() for v in variants]
    if not 2 <= len(names) <= MAX_VARIANTS:
        raise ConfigError(f"compare 2 to {MAX_VARIANTS} variants, got {len(names)}", field="variants")
    empty = [i + 1 for i, n in enumerate(names) if not n]
    if empty:
        raise ConfigError(f"variant {empty[0]} has no name", field="variants")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"variant names must differ; {duplicates[0]!r} is used twice", field="variants")
    raw = copy.deepcopy(dict(base_raw))
    fleet = dict(raw.get("fleet") or {})
    if fleet.get("profile") is not None and profile_control(
        fleet["profile"], str(fleet.get("hardware", "H200")), str(fleet.get("model", "llama-3-8b")),
        int(fleet.get("tp", 1)),
    ) == AUTO_PROFILE:  # the base's profile is the automatic one: let a variant change the hardware
        fleet.pop("profile")
        raw["fleet"] = fleet
    workload = dict(raw.get("workload") or {})
    workload["num_requests"] = num_requests
    raw["workload"] = workload
    raw["variants"] = {name: variant_override(v) for name, v in zip(names, variants, strict=True)}
    return raw
