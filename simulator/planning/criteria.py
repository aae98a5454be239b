"""The SLO as criteria a plan checks on seed-mean summary figures, and the command line's spellings of
an SLO (``ttft_ms=500,target=0.9``) and of a knob search (``engine.max_num_batched_tokens=2048,8192``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from simulator import yaml_text
from simulator.cost.profile import config_error_from_validation
from simulator.errors import ConfigError
from simulator.results.intervals import MetricCI
from simulator.results.summary import SLO


@dataclass(frozen=True, slots=True, kw_only=True)
class Criterion:
    """One condition of the SLO on a Summary metric: ``metric >= threshold`` or ``metric <= threshold``."""

    metric: str
    threshold: float
    at_least: bool
    """True: the metric must reach the threshold (attainment); False: stay under it (a p99 limit)."""

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        return value >= self.threshold if self.at_least else value <= self.threshold

    def straddled(self, ci: MetricCI) -> bool:
        """The interval (or, with two seeds, their range) contains the threshold: another set of seeds
        could flip the verdict."""
        return math.isfinite(ci.low) and math.isfinite(ci.high) and ci.low <= self.threshold <= ci.high

    def describe(self) -> str:
        return f"{self.metric} {'>=' if self.at_least else '<='} {self.threshold:g}"


def criteria(slo: SLO) -> list[Criterion]:
    """The SLO as criteria on seed-mean summary metrics (per-request thresholds live in attainment)."""
    out = [Criterion(metric="slo_attainment", threshold=slo.target_attainment, at_least=True)]
    for metric, limit in (("ttft_p99_ms", slo.ttft_p99_ms), ("tpot_p99_ms", slo.tpot_p99_ms),
                          ("e2e_p99_ms", slo.e2e_p99_ms)):
        if limit is not None:
            out.append(Criterion(metric=metric, threshold=limit, at_least=False))
    return out


SLO_ALIASES = {"target": "target_attainment", "ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}


def parse_slo(text: str) -> SLO:
    """``ttft_ms=500,tpot_ms=50,target=0.9`` (any SLO field; ``target`` = target_attainment) -> SLO."""
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"expected key=value, got {item!r}", field="--slo")
        values[SLO_ALIASES.get(key.strip(), key.strip())] = yaml_text.safe_load(value)
    try:
        return SLO.model_validate(values)
    except ValidationError as err:
        e = config_error_from_validation(err, SLO)
        raise ConfigError(e.message, field=f"--slo {e.field or ''}".strip()) from None


def parse_search(items: Iterable[str]) -> dict[str, list[Any]]:
    """``["engine.max_num_batched_tokens=2048,8192", ...]`` -> {key: [values]} (values parsed as YAML)."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        values = [yaml_text.safe_load(v) for v in text.split(",") if v.strip()]
        if not sep or not key.strip() or not values:
            raise ConfigError(f"expected key.path=v1,v2,..., got {item!r}", field="--search")
        if key.strip() == "fleet.replicas":
            raise ConfigError("the plan searches fleet.replicas itself; use --max-replicas", field="--search")
        out[key.strip()] = values
    return out


HARDWARE_ROLES = ("mixed", "prefill", "decode")


def parse_hardware(items: Iterable[str]) -> dict[str, list[str]]:
    """``["prefill=H100,H200", "decode=A100"]`` -> {role: [GPUs]}: what ``plan --layouts`` tries per pool."""
    out: dict[str, list[str]] = {}
    for item in items:
        role, sep, text = item.partition("=")
        gpus = [g.strip() for g in text.split(",") if g.strip()]
        if not sep or role.strip() not in HARDWARE_ROLES or not gpus:
            raise ConfigError(f"expected ROLE=GPU1,GPU2 with ROLE one of {', '.join(HARDWARE_ROLES)}, got {item!r}",
                              field="--pool-hardware")
        out[role.strip()] = gpus
    return out
