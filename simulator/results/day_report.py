"""The report's view of a fleet that changed size: replicas over the day against the load, with cold
starts and failures marked, SLO attainment per hour, and a table of GPU-hours, dollars per day, scale
events, retries and SLO-minutes lost. Reads ``DayResult``s only; empty for a run without one."""

from __future__ import annotations

import html
from collections.abc import Mapping

import numpy as np

from simulator.results.day import DayResult
from simulator.results.figure import WHITE_TEMPLATE, Figure, add_scatter, figure, titles

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_MARKS = {"start": ("triangle-up", "cold start"), "crash": ("x", "crash"), "node_failure": ("x-thin", "node failure"),
          "spot_notice": ("diamond", "spot notice")}


def day_plots(days: Mapping[str, DayResult]) -> dict[str, Figure]:
    """``day-replicas`` and ``day-slo-hourly``, or nothing when no variant changed size."""
    if not days:
        return {}
    style = {"template": WHITE_TEMPLATE, "height": 420, "legend": {"orientation": "h", "y": -0.2}}
    # Replicas on the left axis, the load on a second y axis on the right (plotly's secondary_y subplot).
    replicas = figure(style, titles("Replicas over the day against the load (markers: cold starts, failures)",
                                    "time (h)", "replicas"),
                      {"xaxis": {"anchor": "y", "domain": [0.0, 0.94]}, "yaxis": {"anchor": "x", "domain": [0.0, 1.0]},
                       "yaxis2": {"anchor": "x", "overlaying": "y", "side": "right",
                                  "title": {"text": "arrivals (req/s)"}}})
    hourly = figure(style, titles("SLO attainment per hour (by arrival)", "hour", "share"))
    first = True
    for i, (name, day) in enumerate(days.items()):
        color = _COLORS[i % len(_COLORS)]
        counts = np.array(day.log.counts, dtype=np.float64).reshape(-1, 6)  # (time_s, ready, starting, draining, ...)
        time_s = counts[:, 0]
        hours = time_s / 3600.0
        ready = counts[:, 1].astype(np.int64)
        paid = ready + counts[:, 2].astype(np.int64) + counts[:, 3].astype(np.int64)
        add_scatter(replicas, hours, paid, name=f"{name}: replicas paid", line={"color": color, "shape": "hv"},
                    xaxis="x", yaxis="y")
        add_scatter(replicas, hours, ready, name=f"{name}: ready", line={"color": color, "shape": "hv", "dash": "dot"},
                    visible="legendonly", xaxis="x", yaxis="y")
        if first:  # one load curve: every variant replays the same arrivals
            add_scatter(replicas, hours, counts[:, 5], name="load (req/s)", line={"color": "#999", "width": 1},
                        xaxis="x", yaxis="y2")
            first = False
        for kind, (symbol, label) in _MARKS.items():
            marked = np.array([event[0] for event in day.log.events if event[1] == kind], dtype=np.float64)
            if not marked.size:
                continue
            at = np.searchsorted(time_s, marked, side="right") - 1
            level = paid[np.clip(at, 0, len(paid) - 1)] if len(paid) else np.zeros(len(marked), dtype=np.int64)
            add_scatter(replicas, marked / 3600.0, level, mode="markers", name=f"{name}: {label}",
                        marker={"symbol": symbol, "color": color, "size": 9, "line": {"width": 2, "color": color}},
                        xaxis="x", yaxis="y")  # a line width: plotly.js draws "x-thin" with its outline only
        by_hour = day.figures.slo_attainment_by_hour
        add_scatter(hourly, list(range(len(by_hour))), list(by_hour), name=name, mode="lines+markers",
                    line={"color": color})
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
