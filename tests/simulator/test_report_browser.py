"""report.html and plan.html in a real browser at 1,280 px: every plot is drawn at the width of its place in
the page (nothing clipped on the right), each curve's x range is on the axis, the SLO lines and their labels
are inside their plot, and a CDF whose variants are far apart has a log x axis. Skips without Chromium or
Playwright, as the dashboard's browser test does."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dashboard import browser
from simulator.results.report import render_report
from simulator.results.request_log import RequestLog
from simulator.results.run_result import RunResult, VariantResult

CHROMIUM = browser.find_chromium()
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                       reason="playwright is not installed (pip install playwright)"),
    pytest.mark.skipif(CHROMIUM is None,
                       reason="no Chromium at /usr/bin/chromium (apt-get install chromium, or set FLEETSIM_CHROMIUM)"),
]

MEASURE = """() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => {
  const box = gd.getBoundingClientRect();
  const full = gd._fullLayout;
  const xs = gd.data.flatMap(t => Array.from(t.x || []).map(Number)).filter(Number.isFinite);
  const labels = [...gd.querySelectorAll('.annotation-text')].map(a => {
    const r = a.getBoundingClientRect();
    return {text: a.textContent, left: r.left - box.left, right: r.right - box.left};
  });
  return {id: gd.id, width: box.width, drawn: full.width, xtype: full.xaxis.type, range: full.xaxis.range,
          xmin: Math.min(...xs), xmax: Math.max(...xs), labels: labels, page: document.documentElement.scrollWidth};
})"""


def measure(page: Any, html: Path) -> dict[str, dict[str, Any]]:
    page.goto(html.as_uri())
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
    page.wait_for_timeout(500)
    return {plot["id"]: plot for plot in page.evaluate(MEASURE)}


def on_axis(plot: dict[str, Any]) -> bool:
    """The curves' x extent lies inside the axis range (log axes keep their range in log10)."""
    low, high = plot["range"]
    if plot["xtype"] == "log":
        low, high = 10**low, 10**high
    return bool(low <= plot["xmin"] * (1 + 1e-6) and plot["xmax"] <= high * (1 + 1e-6))


def spread_result() -> RunResult:
    """Two variants 100x apart in TTFT, with TTFT and TPOT SLOs (the report test's synthetic logs)."""
    from test_report import make_result

    base = make_result(variants=2)
    cols = base.variants["variant-1"].requests.columns()
    stretched = dict(cols)
    stretched["first_token_s"] = cols["arrival_s"] + (cols["first_token_s"] - cols["arrival_s"]) * 100
    stretched["finish_s"] = np.maximum(cols["finish_s"], stretched["first_token_s"])
    slow = RequestLog.from_columns(stretched)
    variants = dict(base.variants)
    old = variants["variant-1"]
    variants["variant-1"] = VariantResult(name="variant-1", requests=slow, series=old.series, summary=old.summary,
                                          profile=old.profile)
    slo = {"slo": {"ttft_ms": 300, "tpot_ms": 40}}
    return RunResult(scenario_name="spread", variants=variants, scenario={"variant-0": slo, "variant-1": slo})


def test_report_plots_fit_1280px_with_log_x_and_slo_lines(tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    html.write_text(render_report(spread_result()))
    assert CHROMIUM is not None
    with browser.browser_page(CHROMIUM, width=1280, height=900) as page:
        plots = measure(page, html)
    assert {"ttft-cdf", "tpot-cdf", "e2e-cdf", "throughput", "queue"} <= set(plots)
    for name, plot in plots.items():
        assert plot["page"] <= 1280, "the page scrolls sideways"
        # Drawn at the width of its grid cell: a plot laid out wider than its cell is cut on the right.
        assert abs(plot["drawn"] - plot["width"]) <= 2, (name, plot["drawn"], plot["width"])
        assert 500 <= plot["width"] <= 640, (name, plot["width"])  # two a row at 1,280 px
    for name in ("ttft-cdf", "tpot-cdf", "e2e-cdf"):
        assert on_axis(plots[name]), (name, plots[name]["range"], plots[name]["xmin"], plots[name]["xmax"])
    assert plots["ttft-cdf"]["xtype"] == "log"  # 100x apart
    for name, label in (("ttft-cdf", "SLO 300 ms"), ("tpot-cdf", "SLO 40 ms")):
        found = [a for a in plots[name]["labels"] if a["text"] == label]
        assert found, (name, plots[name]["labels"])
        assert all(a["left"] >= 0 and a["right"] <= plots[name]["width"] for a in found), found


def test_plan_page_plots_fit_1280px(tmp_path: Path) -> None:
    from test_plan import SMALL

    from simulator.planning.plan import plan
    from simulator.planning.plan_report import save_plan_report

    result = plan({**SMALL, "workload": {**SMALL["workload"], "num_requests": 60}}, seeds=1, workers=1,
                  max_replicas=4, knee=False, sensitivity=(1.1,))
    html = save_plan_report(result, tmp_path)
    assert CHROMIUM is not None
    with browser.browser_page(CHROMIUM, width=1280, height=900) as page:
        plots = measure(page, html)
    assert {"latency-ttft_p99_ms", "latency-tpot_p99_ms", "attainment"} <= set(plots)
    for name, plot in plots.items():
        assert abs(plot["drawn"] - plot["width"]) <= 2 and plot["page"] <= 1280, (name, plot)
        assert on_axis(plot), (name, plot["range"], plot["xmin"], plot["xmax"])
        texts = [a["text"] for a in plot["labels"]]
        if result.replicas is not None:
            assert f"answer: {result.replicas}" in texts, (name, texts)
        assert all(a["left"] >= 0 and a["right"] <= plot["width"] + 1 for a in plot["labels"]), plot["labels"]
    assert not math.isnan(plots["attainment"]["xmax"])
