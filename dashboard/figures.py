"""Plotly figures of the Calibration and Trace explorer pages (the run plots come from ``simulator.results.report``).

Pure functions from the tables ``dashboard.data`` builds to ``go.Figure``; no Streamlit here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def _figure(title: str, xaxis: str, yaxis: str, *, log_x: bool = False, log_y: bool = False) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, height=380,
                      margin={"l": 60, "r": 20, "t": 50, "b": 50}, legend={"orientation": "h", "y": -0.2})
    if log_x:  # decade ticks only: minor labels on a log axis crowd each other
        fig.update_xaxes(type="log", dtick=1)
    if log_y:
        fig.update_yaxes(type="log", dtick=1)
    return fig


def step_time_figure(curves: pd.DataFrame, points: pd.DataFrame | None, *, x: str, group: str, title: str,
                     xaxis: str, group_label: str) -> go.Figure:
    """Predicted device time per ``group`` value as lines (whole step incl. host dotted), measured points
    of the same group as markers."""
    fig = _figure(title, xaxis, "step time (ms)", log_x=True, log_y=True)
    for i, value in enumerate(sorted(curves[group].unique().tolist())):
        rows = curves[curves[group] == value]
        color = _COLORS[i % len(_COLORS)]
        fig.add_trace(go.Scatter(x=rows[x], y=rows["device_ms"], mode="lines", line={"color": color},
                                 name=f"{group_label} {value:,} (device)"))
        fig.add_trace(go.Scatter(x=rows[x], y=rows["step_ms"], mode="lines", line={"color": color, "dash": "dot"},
                                 name=f"{group_label} {value:,} (step incl. host)", showlegend=i == 0))
        if points is not None and not points.empty:
            mine = points[np.isclose(points[group].to_numpy(dtype=np.float64), float(value), rtol=0.02)]
            if not mine.empty:
                fig.add_trace(go.Scatter(
                    x=mine[x], y=mine["measured_ms"], mode="markers", marker={"color": color, "size": 7},
                    name=f"{group_label} {value:,} measured",
                    text=[f"error {e:+.1f} %" for e in mine["error_pct"]],
                    hovertemplate="%{x}: %{y:.3f} ms measured<br>%{text}<extra></extra>",
                ))
    return fig


def measured_vs_predicted_figure(points: pd.DataFrame) -> go.Figure:
    """Every grid point, measured against predicted, coloured by regime, with y = x."""
    fig = _figure("Measured vs predicted device time", "measured (ms)", "predicted (ms)", log_x=True, log_y=True)
    for i, (name, rows) in enumerate(points.groupby("regime", sort=True)):
        fig.add_trace(go.Scatter(x=rows["measured_ms"], y=rows["predicted_ms"], mode="markers", name=str(name),
                                 marker={"color": _COLORS[i % len(_COLORS)]}))
    lo = float(min(points["measured_ms"].min(), points["predicted_ms"].min()))
    hi = float(max(points["measured_ms"].max(), points["predicted_ms"].max()))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x",
                             line={"dash": "dash", "color": "#777"}))
    return fig


def rate_figure(rate: pd.DataFrame, title: str) -> go.Figure:
    fig = _figure(title, "time (s)", "arrivals / s")
    fig.add_trace(go.Scatter(x=rate["time_s"], y=rate["rate_rps"], mode="lines", line={"shape": "hv"},
                             name="arrival rate"))
    return fig


def length_figure(frame: pd.DataFrame) -> go.Figure:
    """Histograms of prompt and output lengths on log-spaced bins (lengths span four decades)."""
    fig = _figure("Length distributions", "tokens", "requests", log_x=True)
    values = frame[["prompt_tokens", "output_tokens"]].to_numpy()
    top = max(2.0, float(values.max()))
    edges = np.geomspace(1, top + 1, 60)
    for i, column in enumerate(("prompt_tokens", "output_tokens")):
        counts, _ = np.histogram(np.maximum(frame[column].to_numpy(), 1), bins=edges)
        centres = np.sqrt(edges[:-1] * edges[1:])
        fig.add_trace(go.Scatter(x=centres, y=counts, mode="lines", line={"shape": "hvh", "color": _COLORS[i]},
                                 fill="tozeroy", name=column.replace("_", " "), opacity=0.6))
    return fig
