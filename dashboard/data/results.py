"""How a run reads on the What-if and Compare pages: SLO verdict, summary and delta tables, headline metrics.

Plain data from a ``RunResult``, formatted as the CLI report formats it; nothing here renders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from simulator.results.report import SUMMARY_ROWS, format_value
from simulator.results.run_result import RunResult
from simulator.results.summary import Summary

KEY_METRICS: tuple[tuple[str, str, bool], ...] = (
    # (Summary field, label, lower is better)
    ("ttft_p50_ms", "TTFT p50 (ms)", True),
    ("ttft_p99_ms", "TTFT p99 (ms)", True),
    ("tpot_p50_ms", "TPOT p50 (ms)", True),
    ("tpot_p99_ms", "TPOT p99 (ms)", True),
    ("e2e_p99_ms", "E2E p99 (ms)", True),
    ("throughput_tok_s", "output tok/s", False),
    ("goodput_rps", "goodput (req/s)", False),
    ("slo_attainment", "SLO attainment", False),
    ("kv_util_mean", "mean KV use", False),
    ("preemptions", "preemptions", True),
    ("cost_per_mtok_usd", "$ / M output tokens", True),
)
"""The headline metrics of the What-if and Compare pages."""


@dataclass(frozen=True, slots=True)
class Verdict:
    met: bool | None
    """None when the scenario sets no SLO."""
    text: str


def slo_verdict(summary: Summary, raw: Mapping[str, Any]) -> Verdict:
    """Whether the run met its SLO, in one sentence."""
    slo = raw.get("slo")
    if not slo:
        return Verdict(None, "No SLO set: add a TTFT or TPOT target to get a verdict.")
    targets = ", ".join(f"{label} ≤ {slo[key]:g} ms" for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"))
                        if slo.get(key) is not None)
    attainment = f"{100 * summary.slo_attainment:.1f} %"
    target = f"{100 * summary.slo_target_attainment:.0f} %"
    if summary.slo_met:
        return Verdict(True, f"SLO met: {attainment} of requests within {targets} (target {target}).")
    return Verdict(False, f"SLO missed: {attainment} of requests within {targets}, below the target {target}.")


def summary_table(result: RunResult) -> pd.DataFrame:
    """The report's summary rows, formatted as the report formats them; one column per variant."""
    data = {
        name: [format_value(getattr(v.summary, attr), kind) for attr, _, kind in SUMMARY_ROWS]
        + [f"{v.profile.name} ({v.profile.kind})"]
        for name, v in result.variants.items()
    }
    index = [label for _, label, _ in SUMMARY_ROWS] + ["profile"]
    return pd.DataFrame(data, index=pd.Index(index, name="metric"))


def delta_table(result: RunResult) -> pd.DataFrame:
    """Headline metrics per variant with the relative change against the first variant.

    Columns: ``metric``, then per variant its value, and for each variant after the first
    ``Δ <name> %`` (positive = larger than the baseline, whether that is better or worse)."""
    names = list(result.variants)
    baseline = result.variants[names[0]].summary
    rows = []
    for attr, label, _ in KEY_METRICS:
        row: dict[str, Any] = {"metric": label}
        base_value = float(getattr(baseline, attr))
        for name in names:
            row[name] = float(getattr(result.variants[name].summary, attr))
        for name in names[1:]:
            row[f"Δ {name} %"] = relative_change(base_value, row[name])
        rows.append(row)
    return pd.DataFrame(rows).set_index("metric")


def relative_change(base: float, value: float) -> float:
    """100 · (value − base) / |base|; NaN where undefined (base 0 or not finite)."""
    if not (math.isfinite(base) and math.isfinite(value)) or base == 0:
        return math.nan if value != base else 0.0
    return 100.0 * (value - base) / abs(base)


def metric_delta(attr: str, base: Summary, other: Summary) -> tuple[str, str | None]:
    """(value text, delta text) of one headline metric for st.metric; no delta when equal to base."""
    kind = next((k for a, _, k in SUMMARY_ROWS if a == attr), "num")
    value = float(getattr(other, attr))
    change = relative_change(float(getattr(base, attr)), value)
    delta = None if other is base or not math.isfinite(change) else f"{change:+.1f} %"
    return format_value(value, kind), delta


def lower_is_better(attr: str) -> bool:
    return next((lower for a, _, lower in KEY_METRICS if a == attr), True)
