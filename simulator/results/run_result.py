"""What a scenario run produced: one ``VariantResult`` per variant (request log, replica series, summary,
profile), as DataFrames for notebooks and as the deterministic text of ``summary.json``. Data only: the
report and the run folder (``report``, ``run_folder``) read it; nothing here renders or writes files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel

from simulator.results.request_log import RequestLog
from simulator.results.series import ReplicaSeries
from simulator.results.summary import Summary
from simulator.results.table import Table

if TYPE_CHECKING:
    import pandas as pd

    from simulator.results.day import DayResult
    from simulator.results.kv_tiers import TierFigures
    from simulator.results.pools import FleetFigures


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileInfo:
    """Which cost-model profile produced the step times, and whether it was measured on an engine."""

    name: str
    kind: Literal["measured", "analytic", "fitted-published"]
    label: str = ""
    """The profile's label: its kind and where its numbers come from (``Profile.label``)."""

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "kind": self.kind, "label": self.label or self.name}


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantResult:
    """Everything one variant of a scenario produced."""

    name: str
    requests: RequestLog
    series: list[ReplicaSeries]
    summary: Summary
    profile: ProfileInfo
    """Variants may override hardware or model, so each carries its own profile."""
    fleet: FleetFigures | None = None
    """A fleet declared as pools (``fleet.pools``): each pool's figures, goodput per GPU, hand-offs."""
    tiers: TierFigures | None = None
    """A fleet with KV tiers (``kv_tiers``): hits and bytes per tier, decisions, the TTFT split."""
    day: DayResult | None = None
    """A fleet whose replicas come and go (lifecycle, autoscaling, failures): its figures and records."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """The outcome of a scenario run: one ``VariantResult`` per variant, in the scenario's order."""

    scenario_name: str
    variants: dict[str, VariantResult]
    scenario: dict[str, Any] = field(default_factory=dict)
    """The resolved scenario (after variants and --set overrides), kept for the record."""

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError("a RunResult needs at least one variant")
        for key, v in self.variants.items():
            if key != v.name:
                raise ValueError(f"variant stored under {key!r} is named {v.name!r}")

    @property
    def analytic(self) -> bool:
        """True when any variant's step times come from an analytic (not measured) profile."""
        return any(v.profile.kind == "analytic" for v in self.variants.values())

    @property
    def fitted_published(self) -> bool:
        """True when any variant's step times come from a profile fitted to published measurements."""
        return any(v.profile.kind == "fitted-published" for v in self.variants.values())

    def _select(self, variant: str | None) -> list[VariantResult]:
        if variant is None:
            return list(self.variants.values())
        if variant not in self.variants:
            raise KeyError(f"no variant {variant!r}; variants are {sorted(self.variants)}")
        return [self.variants[variant]]

    def requests_table(self, variant: str | None = None) -> Table:
        """One row per request of ``variant`` (all variants when None) with a leading ``variant`` column
        and derived ``queue_ms``, ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` (and ``load_ms``, the time its loads
        from KV tiers added, where a variant has tiers: NaN in the rows of the variants without)."""
        selected = self._select(variant)
        with_tiers = any(v.tiers is not None for v in selected)
        tables = []
        for v in selected:
            table = v.requests.table()
            table = table.with_column("variant", np.full(len(table), v.name, dtype=object), first=True)
            if with_tiers:  # the load share of TTFT (its queue and compute shares follow from it)
                load_ms = (v.tiers.load_ms(table.columns["request_id"]) if v.tiers is not None
                           else np.full(len(table), np.nan))
                table = table.with_column("load_ms", load_ms)
            tables.append(table)
        return Table.concat(tables)

    def requests_df(self, variant: str | None = None) -> pd.DataFrame:
        """``requests_table`` as a DataFrame."""
        return self.requests_table(variant).to_pandas()

    def series_table(self, variant: str | None = None) -> Table:
        """Sampled replica state of ``variant`` (all variants when None), one row per replica and time."""
        tables = [Table(s.table()).with_column("variant", np.full(len(s), v.name, dtype=object), first=True)
                  for v in self._select(variant) for s in v.series]
        if not tables:  # no replica sampled: the columns, empty
            empty = ReplicaSeries(replica=0, sample_interval_s=1.0).table()
            tables = [Table(empty).with_column("variant", np.zeros(0, dtype=object), first=True)]
        return Table.concat(tables)

    def series_df(self, variant: str | None = None) -> pd.DataFrame:
        """``series_table`` as a DataFrame."""
        return self.series_table(variant).to_pandas()

    def summary_df(self) -> pd.DataFrame:
        """One row per variant, indexed by variant name, columns as in ``Summary.to_dict``."""
        import pandas as pd  # not at import: a summary-only run never builds a frame

        rows = {name: v.summary.to_dict() for name, v in self.variants.items()}
        frame = pd.DataFrame.from_dict(rows, orient="index")
        frame.index.name = "variant"
        return frame

    def to_pandas(self) -> pd.DataFrame:
        """Requests of all variants, with a ``variant`` column: the table notebooks start from."""

        return self.requests_df()

    def summary_json(self) -> str:
        """The text of summary.json: sorted keys, two-space indent, byte-identical for identical runs."""
        base = next(iter(self.variants.values()))
        doc = {
            "scenario_name": self.scenario_name,
            "scenario": _json_safe(self.scenario),
            "profile": base.profile.to_dict(),
            "profiles": {name: v.profile.to_dict() for name, v in self.variants.items()},
            "variants": {name: v.summary.to_dict() for name, v in self.variants.items()},
        }
        if any(v.fleet is not None for v in self.variants.values()):
            doc["fleet"] = {name: v.fleet.to_dict() for name, v in self.variants.items() if v.fleet is not None}
        if any(v.tiers is not None for v in self.variants.values()):
            doc["kv_tiers"] = {name: v.tiers.to_dict() for name, v in self.variants.items() if v.tiers is not None}
        if any(v.day is not None for v in self.variants.values()):
            doc["day"] = {name: v.day.figures.to_dict() for name, v in self.variants.items() if v.day is not None}
        return json.dumps(doc, sort_keys=True, indent=2, allow_nan=False) + "\n"


def _json_safe(value: Any) -> Any:
    """``value`` made JSON-serialisable: numpy scalars and arrays, paths, enums, tuples and sets
    converted, non-finite floats turned into None. Keys become strings."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, BaseModel):
        return _json_safe(value.model_dump(mode="json"))
    if isinstance(value, Enum):
        return _json_safe(value.value)
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, np.ndarray):
        return [_json_safe(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_json_safe(v) for v in value), key=repr)
    return str(value)
