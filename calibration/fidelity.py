"""Fidelity: how far the simulator's replay is from the engine's, in the figures ``fidelity.json`` reports.

Relative errors of TTFT/TPOT/E2E percentiles and of output-token throughput between two request logs, the
share of identical step compositions, per-step time errors of the cost model, and the CDF figure of
engine against simulator. Pure arithmetic on finished runs: nothing here runs the engine or the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from calibration.replay import Composition
from simulator.results.request_log import RequestLog

METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
PERCENTILES: tuple[int, ...] = (50, 90, 99)


def _percentiles_ms(log: RequestLog) -> dict[str, dict[int, float]]:
    lat = log.latencies_ms()
    done = ~np.isnan(log.columns()["finish_s"])
    out = {}
    for metric in METRICS:
        values = lat[f"{metric}_ms"][done]
        values = values[~np.isnan(values)]
        out[metric] = {q: float(np.percentile(values, q)) if len(values) else math.nan for q in PERCENTILES}
    return out


def throughput_tok_s(log: RequestLog) -> float:
    c = log.columns()
    done = ~np.isnan(c["finish_s"])
    span = float(np.nanmax(c["finish_s"]) - np.nanmin(c["arrival_s"]))
    return float(c["output_tokens"][done].sum()) / span if span > 0 else math.nan


def relative_errors(engine: RequestLog, simulated: RequestLog) -> dict[str, Any]:
    """(simulated − engine) / engine of each percentile, and of output-token throughput."""
    eng, sim = _percentiles_ms(engine), _percentiles_ms(simulated)
    out: dict[str, Any] = {}
    for metric in METRICS:
        out[metric] = {f"p{q}_err": _rel(sim[metric][q], eng[metric][q]) for q in PERCENTILES}
        out[metric].update({f"p{q}_engine_ms": eng[metric][q] for q in PERCENTILES})
        out[metric].update({f"p{q}_sim_ms": sim[metric][q] for q in PERCENTILES})
    out["throughput_err"] = _rel(throughput_tok_s(simulated), throughput_tok_s(engine))
    return out


def _rel(predicted: float, observed: float) -> float:
    return (predicted - observed) / observed if observed and math.isfinite(observed) else math.nan


def step_agreement(engine_steps: Sequence[Composition], sim_steps: Sequence[Composition]) -> dict[str, Any]:
    """Share of step indices whose compositions are identical (over the longer sequence), and the first
    index where they differ (None when identical throughout)."""
    longest = max(len(engine_steps), len(sim_steps))
    same = sum(1 for a, b in zip(engine_steps, sim_steps, strict=False) if a == b)
    first = next((i for i, (a, b) in enumerate(zip(engine_steps, sim_steps, strict=False)) if a != b), None)
    if first is None and len(engine_steps) != len(sim_steps):
        first = min(len(engine_steps), len(sim_steps))
    return {
        "engine_steps": len(engine_steps),
        "sim_steps": len(sim_steps),
        "identical_share": same / longest if longest else 1.0,
        "first_difference": first,
    }


def per_step_errors(predicted_s: Sequence[float], measured_s: Sequence[float]) -> dict[str, float]:
    """Relative error of predicted against measured step times: MAPE, p50/p99 of |error|, and of the total."""
    pred = np.asarray(predicted_s, dtype=np.float64)
    obs = np.asarray(measured_s, dtype=np.float64)
    rel = (pred - obs) / obs
    return {
        "mape": float(np.mean(np.abs(rel))),
        "p50_abs_err": float(np.percentile(np.abs(rel), 50)),
        "p99_abs_err": float(np.percentile(np.abs(rel), 99)),
        "mean_err": float(np.mean(rel)),
        "total_time_err": float(pred.sum() / obs.sum() - 1.0),
    }


def figure_cdfs(engine: RequestLog, simulated: RequestLog, *, title: str) -> Any:
    """CDFs of TTFT, TPOT and E2E: engine against simulator, one panel each."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{m.upper()} (ms)" for m in METRICS])
    for col, metric in enumerate(METRICS, start=1):
        for name, log, color in (("engine", engine, "#1f77b4"), ("simulator", simulated, "#d62728")):
            values = np.sort(log.latencies_ms()[f"{metric}_ms"])
            values = values[~np.isnan(values)]
            if not len(values):
                continue
            fig.add_trace(
                go.Scatter(x=values, y=np.arange(1, len(values) + 1) / len(values), mode="lines", name=name,
                           line={"color": color}, legendgroup=name, showlegend=col == 1),
                row=1, col=col,
            )
        fig.update_xaxes(type="log", row=1, col=col)
    fig.update_yaxes(title_text="share of requests", row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig
