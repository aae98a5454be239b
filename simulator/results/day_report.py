"""The report's view of a fleet that changed size: replicas over the day against the load, with cold
starts and failures marked, SLO attainment per hour, and a table of GPU-hours, dollars per day, scale
events, retries and SLO-minutes lost. Reads ``DayResult``s only; empty for a run without one."""

from __future__ import annotations

import html
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simulator.results.day import DayResult

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_MARKS = {"start": ("triangle-up", "cold start"), "crash": ("x", "crash"), "node_failure": ("x-thin", "node failure"),
          "spot_notice": ("diamond", "spot notice")}


def day_plots(days: Mapping[str, DayResult]) -> dict[str, go.Figure]:
    """``day-replicas`` and ``day-slo-hourly``, or nothing when no variant changed size."""
    if not days:
        return {}
    replicas = make_subplots(specs=[[{"secondary_y": True}]])
    replicas.update_layout(title="Replicas over the day against the load (markers: cold starts, failures)",
                           xaxis_title="time (h)", template="plotly_white", height=420,
                           legend={"orientation": "h", "y": -0.2})
    hourly = go.Figure()
    hourly.update_layout(title="SLO attainment per hour (by arrival)", xaxis_title="hour", yaxis_title="share",
                         template="plotly_white", height=420, legend={"orientation": "h", "y": -0.2})
    first = True
    for i, (name, day) in enumerate(days.items()):
        color = _COLORS[i % len(_COLORS)]
        counts = day.log.counts_frame()
        hours = counts.time_s / 3600.0
        paid = counts.ready + counts.starting + counts.draining
        replicas.add_trace(go.Scatter(x=hours, y=paid, name=f"{name}: replicas paid", line={"color": color,
                                      "shape": "hv"}), secondary_y=False)
        replicas.add_trace(go.Scatter(x=hours, y=counts.ready, name=f"{name}: ready", line={"color": color,
                                      "shape": "hv", "dash": "dot"}, visible="legendonly"), secondary_y=False)
        if first:  # one load curve: every variant replays the same arrivals
            replicas.add_trace(go.Scatter(x=hours, y=counts.arrival_rps, name="load (req/s)",
                                          line={"color": "#999", "width": 1}), secondary_y=True)
            first = False
        events = day.log.events_frame()
        for kind, (symbol, label) in _MARKS.items():
            marked = events[events.kind == kind]
            if marked.empty:
                continue
            at = np.searchsorted(counts.time_s.to_numpy(), marked.time_s.to_numpy(), side="right") - 1
            level = paid.to_numpy()[np.clip(at, 0, len(paid) - 1)] if len(paid) else np.zeros(len(marked))
            replicas.add_trace(go.Scatter(x=marked.time_s / 3600.0, y=level, mode="markers",
                                          name=f"{name}: {label}", marker={"symbol": symbol, "color": color,
                                                                           "size": 9}), secondary_y=False)
        by_hour = day.figures.slo_attainment_by_hour
        hourly.add_trace(go.Scatter(x=list(range(len(by_hour))), y=list(by_hour), name=name, mode="lines+markers",
                                    line={"color": color}))
    replicas.update_yaxes(title_text="replicas", secondary_y=False)
    replicas.update_yaxes(title_text="arrivals (req/s)", secondary_y=True)
    return {"day-replicas": replicas, "day-slo-hourly": hourly}


def day_table(days: Mapping[str, DayResult]) -> str:
    """The day's figures per variant as an HTML table; empty when no variant changed size."""
    if not days:
        return ""
    columns = (("policy", "policy"), ("GPU-hours", "gpu_hours"), ("$ / day", "cost_per_day_usd"),
               ("replicas mean", "replicas_mean"), ("peak", "replicas_peak"), ("scale ups", "num_scale_ups"),
               ("cold starts", "num_cold_starts"), ("crashes", "num_crashes"), ("retried", "requests_retried"),
               ("failed", "requests_failed"), ("retried TTFT p50 ms", "retried_ttft_p50_ms"),
               ("SLO-minutes lost", "slo_minutes_lost"))
    head = "".join(f"<th>{label}</th>" for label, _ in columns)
    rows = []
    for name, day in days.items():
        values = day.figures.to_dict()
        cells = []
        for _, key in columns:
            value = values[key]
            text = "—" if value is None else f"{value:,.4g}" if isinstance(value, float) else f"{value}"
            cells.append(f"<td>{html.escape(text)}</td>")
        rows.append(f"<tr><th>{html.escape(name)}</th>{''.join(cells)}</tr>")
    return (f'<h2>The day</h2><table class="summary"><thead><tr><th>variant</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table><p class="note">Cost accrues from a replica\'s provisioning '
            "to its stop or failure; an SLO-minute is lost when fewer of that minute's arrivals met the SLO than "
            "its target attainment; failed requests lost their replica more often than retries allow.</p>")
