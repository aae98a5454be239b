"""RunResult → one self-contained HTML report (plotly.js), readable offline.

plotly.js is inlined exactly once (the first figure carries it, the others use it), so the file opens on an
air-gapped machine. Every plot is downsampled before it is serialised — CDFs to at most ``CDF_POINTS``
quantiles, time series to at most ``TIME_POINTS`` buckets — and arrays travel as float32 binary, so a report
of a million requests weighs little more than plotly.js itself (~5 MB).

Figures are plain plotly JSON (``results.figure``) and the series are pivoted with numpy: a report imports
neither plotly (the Python package) nor pandas, whose imports and figure objects cost ten times what the
plots do (a 10-request run's report: ~0.05 s, ~0.5 s with them). This module only reads a RunResult; it
computes nothing that the Summary does not already define, except the plotted curves.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from simulator.results.day_report import day_plots, day_table
from simulator.results.figure import NO_TEMPLATE, Figure, add_scatter, add_vline, add_vrect, figure, figure_html, titles
from simulator.results.percentiles import percentiles
from simulator.results.request_log import RequestOutcome
from simulator.results.run_result import RunResult, VariantResult
from simulator.results.series import ReplicaSeries
from simulator.results.summary import Summary, goodput_per_gpu
from simulator.results.tier_report import tier_figures, tiers_table

__all__ = [
    "CDF_POINTS",
    "MAX_REPLICA_LINES",
    "SUMMARY_ROWS",
    "TIME_POINTS",
    "build_figures",
    "format_value",
    "render_report",
]

CDF_POINTS = 500
"""Quantile points per CDF curve: smooth at screen resolution, independent of the number of requests."""
TIME_POINTS = 400
"""Most buckets per time-series curve."""
MAX_REPLICA_LINES = 16
"""Above this many replicas, KV use is drawn as a min / mean / max band instead of one line each."""

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_AXIS = {"showgrid": True, "gridcolor": "#e5e5e5", "zeroline": False, "linecolor": "#444", "showline": True}
_LAYOUT: dict[str, Any] = {
    # No plotly template: a template is copied into every figure (~10 kB each); the few style settings we
    # want are spelled out here instead.
    "template": NO_TEMPLATE,
    "font": {"family": "system-ui, sans-serif", "size": 12},
    "xaxis": _AXIS,
    "yaxis": _AXIS,
    "height": 360,
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
    "legend": {"orientation": "h", "y": -0.2},
    "hovermode": "x unified",
}


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def _f32(values: np.ndarray) -> np.ndarray:
    # float32 halves the payload; 7 significant digits is far beyond what a plot can show.
    return np.asarray(values, dtype=np.float32)


# --------------------------------------------------------------------------------------------------------
# Curves
# --------------------------------------------------------------------------------------------------------


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) of the empirical CDF, at most CDF_POINTS points."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return np.zeros(0), np.zeros(0)
    if values.size <= CDF_POINTS:
        x = np.sort(values)
        return x, np.arange(1, x.size + 1) / x.size
    q = np.linspace(0.0, 1.0, CDF_POINTS)
    # numpy's "linear" quantiles off one sort (a partition at 2 x CDF_POINTS points costs more than the sort)
    ordered = np.sort(values)
    return np.interp(q * (ordered.size - 1), np.arange(ordered.size), ordered), q


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` without its first call's import of ``numpy.ma`` (~8 ms of a short run)."""
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if ordered.size else ordered


def _rate(times: np.ndarray, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Events per second in equal bins over [0, end_s]; x is the bin centre."""
    num_bins = int(min(TIME_POINTS, max(1, math.ceil(end_s))))
    edges = np.linspace(0.0, end_s, num_bins + 1)
    counts, _ = np.histogram(times[np.isfinite(times)], bins=edges)
    width = edges[1] - edges[0]
    return (edges[:-1] + edges[1:]) / 2, counts / width


class _ReplicaTable:
    """A variant's replica series as time × replica tables: one row per grid time of any replica, one
    column per replica in id order. A replica that stopped reporting keeps its last value and one not yet
    started reads 0 (replicas of a fleet that changes size cover different spans of the grid)."""

    def __init__(self, series: Sequence[ReplicaSeries]) -> None:
        self._tables = [t for s in sorted(series, key=lambda s: s.replica) if len((t := s.table())["time_s"])]
        self.replicas = [int(t["replica"][0]) for t in self._tables]
        times = [t["time_s"] for t in self._tables]
        self.time_s = _distinct(np.concatenate(times)) if times else np.zeros(0)
        # Per replica, the row of its own series in force at each time (-1: not started yet).
        self._rows = [np.searchsorted(t, self.time_s, side="right") - 1 for t in times]

    def __len__(self) -> int:
        return len(self.time_s)

    def column(self, name: str) -> np.ndarray:
        """``name`` (a column of ``ReplicaSeries.table``) of every replica: (num_times, num_replicas)."""
        out = np.zeros((len(self.time_s), len(self._tables)))
        for j, (table, rows) in enumerate(zip(self._tables, self._rows, strict=True)):
            out[:, j] = np.where(rows >= 0, table[name][np.maximum(rows, 0)], 0.0)
        return out


def _bucketed(time_s: np.ndarray, values: np.ndarray,
              how: Literal["mean", "min", "max", "last"]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``values`` (one per time) reduced over at most TIME_POINTS consecutive buckets; x is each
    bucket's first time."""
    num_rows = len(time_s)
    step = max(1, math.ceil(num_rows / TIME_POINTS))
    starts = np.arange(0, num_rows, step)
    if how == "last":
        out = values[np.minimum(starts + step, num_rows) - 1]
    elif how == "mean":
        sizes = np.diff(np.append(starts, num_rows)).reshape(-1, *[1] * (values.ndim - 1))
        out = np.add.reduceat(values, starts, axis=0) / sizes
    else:
        out = (np.minimum if how == "min" else np.maximum).reduceat(values, starts, axis=0)
    return time_s[starts], out


# --------------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------------


def _figure(title: str, xaxis: str, yaxis: str, *layouts: Mapping[str, Any]) -> Figure:
    return figure(_LAYOUT, titles(title, xaxis, yaxis), *layouts)


class _Requests:
    """The per-request arrays the plots need, computed once per variant without building a DataFrame
    (a million-row frame costs more than every plot together)."""

    def __init__(self, variant: VariantResult) -> None:
        log = variant.requests
        c = log.columns()
        done = log.outcomes()[RequestOutcome.COMPLETED]
        self.arrival_s = c["arrival_s"][~np.isnan(c["arrival_s"])]
        self.finish_s = c["finish_s"][done]
        # Latency curves cover completed requests only, like the Summary's percentiles.
        self.latency_ms = {k: v[done] for k, v in log.latencies_ms().items()}
        ends = [a[np.isfinite(a)] for a in (c["arrival_s"], c["finish_s"], c["rejected_s"])]
        self.end_s = max((float(a.max()) for a in ends if a.size), default=0.0)


LOG_X_SPREAD = 30.0
"""A CDF's x axis turns logarithmic when its values span more than this factor (1st percentile of the
fastest variant to the 99th of the slowest): variants 100× apart would otherwise collapse onto the axis."""


def _cdf_figure(result: RunResult, reqs: dict[str, _Requests], metric: str, label: str) -> Figure:
    fig = _figure(f"{label} CDF (completed requests)", f"{label} (ms)", "fraction of requests",
                  {"hovermode": "closest", "title": {"x": 0.01}, "legend": {"orientation": "h", "y": -0.25},
                   "yaxis": {"range": [0, 1.01]}})
    lows, highs = [], []
    for i, name in enumerate(result.variants):
        values = reqs[name].latency_ms[metric]
        x, y = _cdf(values)
        add_scatter(fig, _f32(x), _f32(y), mode="lines", name=name, line={"color": _color(i)})
        positive = values[np.isfinite(values) & (values > 0)]
        if positive.size:
            low, high = percentiles(positive, (1, 99))
            lows.append(low)
            highs.append(high)
    log_x = bool(lows) and min(lows) > 0 and max(highs) / min(lows) > LOG_X_SPREAD
    if log_x:
        fig["layout"]["xaxis"]["type"] = "log"
    for threshold in _slo_thresholds(result, metric):
        add_vline(fig, threshold, color="#c0392b")
        # A shape takes data values on a log axis, an annotation the value's log10 (plotly's rule).
        fig["layout"].setdefault("annotations", []).append(
            {"font": {"color": "#c0392b"}, "showarrow": False, "text": f"SLO {threshold:g} ms",
             "x": math.log10(threshold) if log_x else threshold, "xanchor": "right", "y": 1.0, "yanchor": "bottom",
             "yref": "paper"})
    return fig


def _slo_thresholds(result: RunResult, metric: str) -> list[float]:
    """The distinct SLO thresholds on ``metric`` (e.g. 'ttft_ms') of the run's variants: the resolved
    scenario is recorded per variant (or, from the API, as one scenario with a top-level ``slo``)."""
    records = result.scenario if isinstance(result.scenario, dict) else {}
    sections = [records.get("slo")] + [r.get("slo") for r in records.values() if isinstance(r, dict)]
    found = {float(v) for sec in sections if isinstance(sec, dict)
             for v in [sec.get(metric)] if isinstance(v, int | float) and not isinstance(v, bool) and v > 0}
    return sorted(found)


def _throughput_figure(result: RunResult, reqs: dict[str, _Requests], end_s: float) -> Figure:
    fig = _figure("Throughput over time", "time (s)", "requests / s")
    base_arrivals: np.ndarray | None = None
    for i, name in enumerate(result.variants):
        x, y = _rate(reqs[name].finish_s, end_s)
        add_scatter(fig, _f32(x), _f32(y), mode="lines", name=f"{name} completions", line={"color": _color(i)})
        arrivals = reqs[name].arrival_s
        # Variants usually share one request stream: draw the offered load once, unless a variant changed it.
        if base_arrivals is None or not np.array_equal(arrivals, base_arrivals):
            x, y = _rate(arrivals, end_s)
            label = "arrivals" if base_arrivals is None else f"{name} arrivals"
            add_scatter(fig, _f32(x), _f32(y), mode="lines", name=label,
                        line={"color": "#7f7f7f" if base_arrivals is None else _color(i), "dash": "dot"})
            base_arrivals = arrivals if base_arrivals is None else base_arrivals
    return fig


def _queue_figure(result: RunResult, tables: dict[str, _ReplicaTable]) -> Figure:
    fig = _figure("Waiting requests over time (all replicas)", "time (s)", "waiting requests")
    for i, name in enumerate(result.variants):
        table = tables[name]
        if not len(table):
            continue
        x, waiting = _bucketed(table.time_s, table.column("waiting").sum(axis=1), "mean")
        add_scatter(fig, _f32(x), _f32(waiting), mode="lines", name=name, line={"color": _color(i)})
    return fig


def _kv_figure(variant: VariantResult, table: _ReplicaTable, index: int) -> Figure:
    fig = _figure(f"KV cache use per replica — {variant.name}", "time (s)", "KV blocks used / capacity",
                  {"yaxis": {"range": [0, 1.02]}})
    if not len(table):
        return fig
    util = table.column("kv_util")
    if len(table.replicas) <= MAX_REPLICA_LINES:
        x, util = _bucketed(table.time_s, util, "mean")
        for j, replica in enumerate(table.replicas):
            add_scatter(fig, _f32(x), _f32(util[:, j]), mode="lines", name=f"replica {replica}",
                        line={"color": _color(j)})
        return fig
    x, low = _bucketed(table.time_s, util.min(axis=1), "min")
    _, mean = _bucketed(table.time_s, util.mean(axis=1), "mean")
    _, high = _bucketed(table.time_s, util.max(axis=1), "max")
    color = _color(index)
    add_scatter(fig, _f32(x), _f32(high), mode="lines", name="max over replicas", line={"color": color, "width": 0.5})
    add_scatter(fig, _f32(x), _f32(low), mode="lines", name="min over replicas", line={"color": color, "width": 0.5},
                fill="tonexty")
    add_scatter(fig, _f32(x), _f32(mean), mode="lines", name="mean", line={"color": color, "width": 2})
    return fig


def _prefix_figure(result: RunResult, tables: dict[str, _ReplicaTable]) -> Figure:
    fig = _figure(
        "Prefix-cache hit rate over time (fleet, per bucket)",
        "time (s)",
        "prompt tokens from cache / prompt tokens",
        {"yaxis": {"range": [0, 1.02]}},
    )
    for i, name in enumerate(result.variants):
        table = tables[name]
        if not len(table):
            continue
        cum = np.stack([table.column("prefix_hit_tokens_cum").sum(axis=1),
                        table.column("prompt_tokens_cum").sum(axis=1)], axis=1)  # (num_times, 2)
        # Windowed rate from the cumulative counters at bucket ends, so no prompt token is lost between
        # buckets; NaN where no prompt was admitted in the bucket.
        x, last = _bucketed(table.time_s, cum, "last")
        d_hit = np.diff(last[:, 0], prepend=0.0)
        d_prompt = np.diff(last[:, 1], prepend=0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(d_prompt > 0, d_hit / d_prompt, np.nan)
        add_scatter(fig, _f32(x), _f32(rate), mode="lines", name=name, line={"color": _color(i)}, connectgaps=False)
    return fig


# --------------------------------------------------------------------------------------------------------
# Page
# --------------------------------------------------------------------------------------------------------

SUMMARY_ROWS: Sequence[tuple[str, str, str]] = (
    # (Summary field, label, format)
    ("requests_arrived", "requests arrived", "int"),
    ("requests_completed", "completed", "int"),
    ("requests_in_flight", "in flight at end", "int"),
    ("requests_rejected", "rejected", "int"),
    ("ttft_p50_ms", "TTFT p50 (ms)", "num"),
    ("ttft_p90_ms", "TTFT p90 (ms)", "num"),
    ("ttft_p99_ms", "TTFT p99 (ms)", "num"),
    ("tpot_p50_ms", "TPOT p50 (ms)", "num"),
    ("tpot_p90_ms", "TPOT p90 (ms)", "num"),
    ("tpot_p99_ms", "TPOT p99 (ms)", "num"),
    ("e2e_p50_ms", "E2E p50 (ms)", "num"),
    ("e2e_p90_ms", "E2E p90 (ms)", "num"),
    ("e2e_p99_ms", "E2E p99 (ms)", "num"),
    ("queue_p50_ms", "queue delay p50 (ms)", "num"),
    ("queue_p99_ms", "queue delay p99 (ms)", "num"),
    ("throughput_rps", "throughput (req/s)", "num"),
    ("throughput_tok_s", "output throughput (tok/s)", "num"),
    ("goodput_rps", "goodput (req/s)", "num"),
    ("slo_attainment", "SLO attainment", "pct"),
    ("kv_util_mean", "mean KV use", "pct"),
    ("prefix_hit_rate", "prefix-cache hit rate", "pct"),
    ("preemptions", "preemptions", "int"),
    ("num_gpus", "GPUs", "int"),
    ("cost_per_mtok_usd", "cost ($ / M output tokens)", "usd"),
    ("duration_s", "measured duration (s)", "num"),
)


def format_value(value: float | int | bool, kind: str) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "—"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "pct":
        return f"{100 * float(value):.1f} %"
    if kind == "usd":
        return f"${float(value):#.3g}" if abs(float(value)) < 1000 else f"${float(value):,.0f}"
    v = float(value)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _summary_table(result: RunResult) -> str:
    names = list(result.variants)
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = []
    verdicts = []
    for name in names:
        s: Summary = result.variants[name].summary
        cls, word = ("ok", "SLO met") if s.slo_met else ("fail", "SLO missed")
        target = format_value(s.slo_target_attainment, "pct")
        verdicts.append(f'<td><span class="verdict {cls}">{word}</span><br><small>target {target}</small></td>')
    rows.append(f"<tr><th>verdict</th>{''.join(verdicts)}</tr>")
    for attr, label, kind in SUMMARY_ROWS:
        cells = "".join(f"<td>{format_value(getattr(result.variants[n].summary, attr), kind)}</td>" for n in names)
        rows.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
        if attr == "num_gpus":
            cells = "".join(f"<td>{format_value(goodput_per_gpu(result.variants[n].summary), 'num')}</td>"
                            for n in names)
            rows.append(f"<tr><th>goodput per GPU (req/s)</th>{cells}</tr>")
    profiles = "".join(
        f"<td>{html.escape(v.profile.name)} ({html.escape(v.profile.kind)})</td>" for v in result.variants.values()
    )
    rows.append(f"<tr><th>profile</th>{profiles}</tr>")
    body = "".join(rows)
    return f'<table class="summary"><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>'


def _pools_table(result: RunResult) -> str:
    """Each pooled variant's pools (GPUs, busy share, KV use) and hand-offs; empty when none has pools."""
    rows = []
    for name, variant in result.variants.items():
        fleet = variant.fleet
        if fleet is None:
            continue
        for pool in fleet.pools:
            rows.append(
                f"<tr><th>{html.escape(name)}</th><td>{html.escape(pool.name)}</td><td>{html.escape(pool.role)}</td>"
                f"<td>{pool.replicas} × {html.escape(pool.hardware)} tp {pool.tp}</td>"
                f"<td>{format_value(pool.busy_frac, 'pct')}</td><td>{format_value(pool.kv_util_mean, 'pct')}</td>"
                f"<td>{format_value(pool.usd_per_gpu_hour * pool.num_gpus, 'usd')}</td></tr>")
        handoffs = fleet.handoffs
        if handoffs is not None:
            rows.append(
                f'<tr><th></th><td colspan="6" class="note">hand-offs: {handoffs.num_landed:,} transferred '
                f"({handoffs.sent_gb:.3g} GB), transfer after the first token p50 "
                f"{format_value(handoffs.transfer_p50_ms, 'num')} ms, p99 "
                f"{format_value(handoffs.transfer_p99_ms, 'num')} ms; {handoffs.num_waited:,} waited for decode "
                "memory (mean "
                f"{format_value(handoffs.reserve_wait_mean_ms, 'num')} ms)</td></tr>")
    if not rows:
        return ""
    head = ("<tr><th>variant</th><th>pool</th><th>role</th><th>replicas</th><th>busy</th><th>KV use</th>"
            "<th>$ / h</th></tr>")
    return f'<h2>Pools</h2><table class="summary"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 24px auto; max-width: 1280px;
       color: #222; padding: 0 16px; }
h1 { margin-bottom: 4px; } .meta { color: #555; margin-top: 0; }
.banner { background: #fff3cd; border: 2px solid #e0a800; color: #533f03; padding: 12px 16px;
          border-radius: 6px; font-weight: 600; margin: 16px 0; }
table.summary { border-collapse: collapse; margin: 16px 0; font-variant-numeric: tabular-nums; }
table.summary th, table.summary td { border-bottom: 1px solid #ddd; padding: 4px 12px; text-align: right; }
table.summary tbody th { text-align: left; font-weight: normal; color: #444; }
.verdict { padding: 2px 8px; border-radius: 4px; font-weight: 700; }
.verdict.ok { background: #d4edda; color: #155724; } .verdict.fail { background: #f8d7da; color: #721c24; }
.grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px; }
@media (max-width: 1100px) { .grid { grid-template-columns: minmax(0, 1fr); } }
.grid > div { min-width: 0; }
.note { color: #666; font-size: 0.9em; }
"""


def build_figures(result: RunResult) -> dict[str, Figure]:
    """Every plot of the report, keyed by its div id, in page order: ``ttft-cdf``, ``tpot-cdf``,
    ``e2e-cdf``, ``throughput``, ``queue``, ``prefix-hit``, then ``kv-util-<i>`` per variant. The
    dashboard shows the same figures."""
    reqs = {name: _Requests(v) for name, v in result.variants.items()}
    tables = {name: _ReplicaTable(v.series) for name, v in result.variants.items()}
    end_s = max(
        *(r.end_s for r in reqs.values()),
        *(v.summary.duration_s + v.summary.warmup_s for v in result.variants.values()),
    )

    figures: dict[str, Figure] = {
        "ttft-cdf": _cdf_figure(result, reqs, "ttft_ms", "TTFT"),
        "tpot-cdf": _cdf_figure(result, reqs, "tpot_ms", "TPOT"),
        "e2e-cdf": _cdf_figure(result, reqs, "e2e_ms", "E2E"),
        "throughput": _throughput_figure(result, reqs, end_s),
        "queue": _queue_figure(result, tables),
        "prefix-hit": _prefix_figure(result, tables),
    }
    for i, (name, v) in enumerate(result.variants.items()):
        figures[f"kv-util-{i}"] = _kv_figure(v, tables[name], i)
    figures.update(tier_figures(result))
    figures.update(day_plots({name: v.day for name, v in result.variants.items() if v.day is not None}))

    warmup_s = max(v.summary.warmup_s for v in result.variants.values())
    if warmup_s > 0:
        for div_id, fig in figures.items():
            if div_id in ("ttft-cdf", "tpot-cdf", "e2e-cdf"):
                continue
            x_per_s = _HOURS_AXIS.get(div_id, 1.0)  # the day's plots count hours on their x axis
            add_vrect(fig, 0, warmup_s * x_per_s, fillcolor="#999", opacity=0.12, text="warm-up")
    return figures


_HOURS_AXIS = {"day-replicas": 1 / 3600, "day-slo-hourly": 1 / 3600}
"""Plots whose x axis is in hours (the day's replicas; SLO attainment per hour, by hour index)."""


def render_report(result: RunResult) -> str:
    """The whole report as one HTML string (plotly.js inlined once; no network needed to view it)."""
    plots = figure_html(build_figures(result))

    title = html.escape(result.scenario_name)
    profiles = ", ".join(
        sorted({f"{html.escape(v.profile.name)} ({html.escape(v.profile.kind)})" for v in result.variants.values()})
    )
    banner = ""
    if result.analytic:
        analytic = ", ".join(sorted({html.escape(v.profile.label or v.profile.name)
                                     for v in result.variants.values() if v.profile.kind == "analytic"}))
        banner = (
            '<div class="banner" id="analytic-banner">Cost model analytic, not measured: step times for '
            f"{analytic} come from datasheet figures, not from timings on a real engine. Read latencies and "
            "costs as estimates.</div>"
        )
    if result.fitted_published:
        fitted = ", ".join(sorted({html.escape(v.profile.label or v.profile.name)
                                   for v in result.variants.values() if v.profile.kind == "fitted-published"}))
        banner += (
            '<div class="banner" id="published-banner">Cost model fitted to published GPU measurements: '
            f"{fitted}. Operator and collective timings were measured by others and composed into steps by "
            "stated rules (the profile's provenance lists them); not timed on this engine.</div>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>fleetsim — {title}</title><style>{_CSS}</style></head><body>"
        f'<h1>{title}</h1><p class="meta">fleetsim report · profile {profiles} · '
        f"{len(result.variants)} variant(s)</p>{banner}"
        f"<h2>Summary</h2>{_summary_table(result)}{_pools_table(result)}{tiers_table(result)}"
        f"{day_table({name: v.day for name, v in result.variants.items() if v.day is not None})}"
        '<p class="note">Latency percentiles are over completed requests; SLO attainment counts rejected '
        "and unfinished requests as failures against all arrivals.</p>"
        f'<h2>Latency and load</h2><div class="grid">{plots}</div>'
        "</body></html>\n"
    )
