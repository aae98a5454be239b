"""A plan's HTML page (``plan.html``, beside plan.json): p99 latency and SLO attainment against the number
of replicas for every knob setting and cost factor the plan searched, the SLO's thresholds, the answer,
and one replica's attainment against load (the knee). Figures and page are written as ``report.html``'s
(``results.figure``: plain plotly JSON, plotly.js inlined once), so the page opens offline.

Reads only the plan's trials (one row per simulation): every point drawn is a mean over the seeds the plan
ran, with the seeds' lowest and highest value as its error bar. Nothing is simulated here.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.planning.plan_result import PlanResult, slo_text
from simulator.results import report
from simulator.results.figure import Figure, add_hline, add_scatter, add_vline, figure, figure_html, titles
from simulator.results.report import LOG_X_SPREAD

# One look with report.html: its layout, colours and page style (two plots a row, a fixed grid so the
# first plot is drawn at its final width).
_LAYOUT: dict[str, Any] = {**report._LAYOUT, "height": 380, "hovermode": "closest", "title": {"x": 0.01},
                           "legend": {"orientation": "h", "y": -0.25}}
_CSS = report._CSS + "pre { background: #f6f6f6; padding: 12px; overflow-x: auto; }\n"
LATENCIES = (("ttft_p99_ms", "TTFT p99", ("ttft_ms", "ttft_p99_ms")),
             ("tpot_p99_ms", "TPOT p99", ("tpot_ms", "tpot_p99_ms")),
             ("e2e_p99_ms", "E2E p99", ("e2e_ms", "e2e_p99_ms")))
"""(metric, label, the SLO fields that limit it) of the latency panels."""


def _curves(result: PlanResult) -> list[tuple[str, pd.DataFrame, bool]]:
    """(label, per-replica means and seed ranges, is the answer's curve) of every replica search."""
    trials = result.trials
    if trials.empty:
        return []
    searched = trials[trials["purpose"].isin(["replicas", "sensitivity"])]
    knob_columns = sorted({k for c in result.candidates for k in c.knobs})
    groups = searched.groupby(["cost_factor", *knob_columns], dropna=False, sort=True)
    base_cost = result.answer.cost_factor
    curves = []
    for key, rows in groups:
        values = key if isinstance(key, tuple) else (key,)
        cost_factor, knobs = float(str(values[0])), dict(zip(knob_columns, values[1:], strict=True))
        best = knobs == {k: result.answer.knobs.get(k) for k in knob_columns}
        parts = [", ".join(f"{k}={v}" for k, v in knobs.items())]
        if not math.isclose(cost_factor, base_cost):
            parts.append(f"step times x{cost_factor / base_cost:g}")
        label = "; ".join(p for p in parts if p) or "the scenario"
        numeric = rows.drop(columns=["purpose", "seed", *knob_columns], errors="ignore").select_dtypes("number")
        stats = numeric.groupby(rows["replicas"]).agg(["mean", "min", "max"]).sort_index()
        curves.append((label, stats, best and math.isclose(cost_factor, base_cost)))
    curves.sort(key=lambda c: not c[2])  # the answer's curve first
    return curves


def _trace(fig: Figure, stats: pd.DataFrame, metric: str, label: str, index: int, main: bool) -> None:
    mean = stats[(metric, "mean")]
    add_scatter(
        fig, stats.index.to_numpy(), mean.to_numpy(), name=label, mode="lines+markers",
        line={"color": report._color(index), "width": 3 if main else 1.5, "dash": "solid" if main else "dot"},
        error_y={"type": "data", "symmetric": False, "array": (stats[(metric, "max")] - mean).to_numpy(),
                 "arrayminus": (mean - stats[(metric, "min")]).to_numpy(), "thickness": 1},
        hovertemplate=f"{label}<br>%{{x}} replica(s): %{{y:.4g}}<extra></extra>",
    )


def _answer_line(fig: Figure, result: PlanResult) -> None:
    if result.replicas is not None:
        add_vline(fig, result.replicas, color="#2c3e50", text=f"answer: {result.replicas}")


def plan_figures(result: PlanResult) -> dict[str, Figure]:
    """``latency-<metric>`` per latency the SLO limits (TTFT and TPOT always), ``attainment``, and
    ``knee`` when the plan searched one."""
    curves = _curves(result)
    slo = result.slo.model_dump(exclude_none=True)
    figures: dict[str, Figure] = {}
    for metric, label, limits in LATENCIES:
        thresholds = {field: slo[field] for field in limits if field in slo}
        if metric == "e2e_p99_ms" and not thresholds:
            continue
        fig = figure(_LAYOUT, titles(f"{label} vs replicas", "replicas", f"{label} (ms)"), {"xaxis": {"dtick": 1}})
        for i, (name, stats, main) in enumerate(curves):
            if (metric, "mean") in stats:
                _trace(fig, stats, metric, name, i, main)
        values = [v for _, stats, _ in curves if (metric, "mean") in stats
                  for v in stats[(metric, "mean")].to_numpy() if math.isfinite(v) and v > 0]
        if values and max(values) / min(values) > LOG_X_SPREAD:
            fig["layout"]["yaxis"]["type"] = "log"
        for field, value in thresholds.items():
            kind = "p99 limit" if field.endswith("_p99_ms") else "per-request SLO"
            add_hline(fig, value, color="#c0392b", text=f"{kind} {value:g} ms", position="top left")
        _answer_line(fig, result)
        figures[f"latency-{metric}"] = fig

    fig = figure(_LAYOUT, titles("SLO attainment vs replicas", "replicas", "share of requests meeting the SLO"),
                 {"xaxis": {"dtick": 1}, "yaxis": {"range": [0, 1.02]}})
    for i, (name, stats, main) in enumerate(curves):
        _trace(fig, stats, "slo_attainment", name, i, main)
    target = result.slo.target_attainment
    add_hline(fig, target, color="#c0392b", text=f"target {target:g}", position="bottom right")
    _answer_line(fig, result)
    figures["attainment"] = fig

    knee = result.trials[result.trials["purpose"] == "knee"] if not result.trials.empty else result.trials
    if not knee.empty and math.isfinite(result.stream_rate_rps):
        rate = knee["load_factor"] / result.load_factor * result.stream_rate_rps
        points = knee.groupby(rate)["slo_attainment"].agg(["mean", "min", "max"]).sort_index()
        fig = figure(_LAYOUT, titles("One replica: attainment vs load", "arrival rate (requests/s)",
                                     "share meeting the SLO"), {"yaxis": {"range": [0, 1.02]}})
        add_scatter(fig, points.index.to_numpy(), points["mean"].to_numpy(), mode="markers+lines",
                    name="one replica", line={"color": report._color(0)},
                    error_y={"type": "data", "symmetric": False, "array": (points["max"] - points["mean"]).to_numpy(),
                             "arrayminus": (points["mean"] - points["min"]).to_numpy()})
        add_hline(fig, target, color="#c0392b", text=f"target {target:g}", position="bottom right")
        figures["knee"] = fig
    return figures


def render_plan_report(result: PlanResult) -> str:
    """The plan as one HTML page (plotly.js inlined once: it opens with no network)."""
    plots = figure_html(plan_figures(result))
    title = html.escape(result.scenario_name)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>fleetsim plan — {title}</title><style>{_CSS}</style></head><body>"
        f"<h1>Capacity plan: {title}</h1><p>{html.escape(slo_text(result.slo))}; seeds {result.seeds}; "
        f"{len(result.trials)} simulations</p><pre>{html.escape(result.text())}</pre>"
        '<h2>Latency and attainment against replicas</h2><p class="note">Each point is the mean over the '
        "seeds; its bar spans the seeds' lowest and highest value. Dotted: other knob settings and step times "
        "x0.9 / x1.1 (the cost-model sensitivity).</p>"
        f'<div class="grid">{plots}</div>'
        "</body></html>\n"
    )


def save_plan_report(result: PlanResult, out_dir: str | Path) -> Path:
    """Write ``plan.html`` into ``out_dir`` (beside plan.json) in one rename; returns its path."""
    path = Path(out_dir) / "plan.html"
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(render_plan_report(result), encoding="utf-8")
    temporary.replace(path)
    return path
