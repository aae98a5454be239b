"""The report's KV-tier parts: a table of each tiered variant's hits, bytes, decisions and TTFT split, and a
plot per variant of the hit rate per tier over time. Renders only (``kv_tiers.TierFigures`` computes)."""

from __future__ import annotations

import html

import numpy as np

from simulator.results.figure import WHITE_TEMPLATE, Figure, add_scatter, figure, titles
from simulator.results.run_result import RunResult, VariantResult

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def tier_figures(result: RunResult) -> dict[str, Figure]:
    """``kv-tiers-<i>`` for each variant with KV tiers: the share of the prompt tokens admitted in each
    interval served by the device's prefix cache and by each tier, stacked."""
    figures: dict[str, Figure] = {}
    for i, (name, variant) in enumerate(result.variants.items()):
        if variant.tiers is not None:
            figures[f"kv-tiers-{i}"] = _hit_figure(name, variant)
    return figures


def _hit_figure(name: str, variant: VariantResult) -> Figure:
    tiers = variant.tiers
    assert tiers is not None
    series = tiers.rate_series
    fig = figure({"template": WHITE_TEMPLATE, "height": 360, "margin": {"l": 60, "r": 20, "t": 50, "b": 50}},
                 titles(f"{name}: prefix hits per tier over time (fleet, per interval)", "time (s)",
                        "prompt tokens served / prompt tokens"),
                 {"yaxis": {"range": [0, 1.02]}})
    x = np.asarray(series["time_s"], dtype=np.float32)
    for j, place in enumerate(["device", *tiers.names]):
        add_scatter(fig, x, np.asarray(series[place], dtype=np.float32), mode="lines", name=place, stackgroup="hits",
                    line={"color": _PALETTE[j % len(_PALETTE)]})
    return fig


def tiers_table(result: RunResult) -> str:
    """One row per tiered variant; empty when none has tiers."""
    rows = []
    for name, variant in result.variants.items():
        t = variant.tiers
        if t is None:
            continue
        hits = ", ".join(f"{html.escape(k)} {v:.1%}" for k, v in t.hit_rate.items())
        read = ", ".join(f"{html.escape(k)} {v / 1e9:.3g}" for k, v in t.read_bytes.items())
        written = ", ".join(f"{html.escape(k)} {v / 1e9:.3g}" for k, v in t.written_bytes.items())
        split = t.ttft_split_ms
        rows.append(f"<tr><th>{html.escape(name)}</th><td>{hits}</td><td>{read}</td><td>{written}</td>"
                    f"<td>{t.num_loads:,} / {t.num_recomputes:,}</td>"
                    f"<td>{split['queue']:.4g} / {split['load']:.4g} / {split['compute']:.4g}</td>"
                    f"<td>{t.usd_per_hour:.3g}</td><td>{t.cost_per_mtok_usd:.4g}</td></tr>")
    if not rows:
        return ""
    head = ("<tr><th>variant</th><th>hit rate by place</th><th>GB loaded</th><th>GB written</th>"
            "<th>loads / recomputes</th><th>TTFT queue / load / compute (ms, mean)</th><th>tiers $ / h</th>"
            "<th>$ / M output tokens, GPUs + tiers</th></tr>")
    return f'<h2>KV tiers</h2><table class="summary"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
