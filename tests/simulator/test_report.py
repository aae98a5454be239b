"""The HTML report: every plot present, the analytic banner when it applies, small at a million requests,
curves as sent equal to the curves computed, names that cannot break out of the page's scripts, and neither
plotly (the Python package) nor pandas imported to write it."""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simulator.results.report import (
    CDF_POINTS,
    MAX_REPLICA_LINES,
    TIME_POINTS,
    _bucketed,
    _ReplicaTable,
    build_figures,
    render_report,
)
from simulator.results.request_log import RequestLog, RequestOutcome
from simulator.results.run_result import ProfileInfo, RunResult, VariantResult
from simulator.results.series import ReplicaSeries
from simulator.results.summary import SLO, summarize

PLOT_IDS = ("ttft-cdf", "tpot-cdf", "e2e-cdf", "throughput", "queue", "prefix-hit", "kv-util-0")


def synthetic_log(num_requests: int, seed: int) -> RequestLog:
    """A plausible run built column-wise (fast at a million rows): Poisson arrivals, some unfinished."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.001, num_requests))
    output = rng.integers(1, 400, num_requests)
    queue = rng.exponential(0.05, num_requests)
    ttft = queue + rng.gamma(2.0, 0.05, num_requests)
    finish = arrival + ttft + output * rng.uniform(0.01, 0.03, num_requests)
    finish[rng.random(num_requests) < 0.02] = np.nan  # still in flight at the end
    rejected = rng.random(num_requests) < 0.005
    return RequestLog.from_columns(
        {
            "arrival_s": arrival,
            "first_scheduled_s": arrival + queue,
            "first_token_s": arrival + ttft,
            "finish_s": finish,
            "replica": rng.integers(0, 8, num_requests).astype(np.int32),
            "prompt_tokens": rng.integers(1, 2000, num_requests),
            "output_tokens": output,
            "rejected": rejected,
        }
    )


def synthetic_series(num_replicas: int, end_s: float) -> list[ReplicaSeries]:
    """Replica states reported every 0.25 s (a coarse step keeps the test fast) on a 1 s grid."""
    out = []
    for r in range(num_replicas):
        s = ReplicaSeries(r, sample_interval_s=1.0)
        for i, t in enumerate(np.arange(0.0, end_s, 0.25)):
            s.maybe_sample(float(t), 4, (i + r) % 7, (i * 3 + r) % 100, 100, i * 20, i * 60)
        s.close(end_s)
        out.append(s)
    return out


def make_result(
    *, num_requests: int = 2000, num_replicas: int = 4, kind: str = "measured", variants: int = 2
) -> RunResult:
    results = {}
    for v in range(variants):
        log = synthetic_log(num_requests, seed=v)
        end_s = float(np.nanmax(log.columns()["finish_s"]))
        summary = summarize(
            log,
            duration_s=end_s,
            slo=SLO(ttft_ms=300, tpot_ms=40),
            num_gpus=num_replicas,
            usd_per_gpu_hour=3.5,
            kv_util_mean=0.4,
            prefix_hit_rate=0.33,
            preemptions=3,
        )
        name = f"variant-{v}"
        results[name] = VariantResult(
            name=name,
            requests=log,
            series=synthetic_series(num_replicas, end_s),
            summary=summary,
            profile=ProfileInfo(name="h200-llama3-8b-tp1", kind=kind),  # type: ignore[arg-type]
        )
    return RunResult(scenario_name="chat <burst>", variants=results)


def test_report_has_every_plot_and_inlines_plotly_once() -> None:
    page = render_report(make_result())
    for div_id in (*PLOT_IDS, "kv-util-1"):
        assert f'id="{div_id}"' in page, div_id
    assert page.count("Plotly.newPlot") == len(PLOT_IDS) + 1
    assert page.count("plotly.js v") == 1  # the library's banner comment: inlined exactly once
    assert "<script src=" not in page  # nothing fetched from the network
    assert "chat &lt;burst&gt;" in page  # scenario name shown, escaped
    assert "h200-llama3-8b-tp1" in page
    assert "SLO met" in page or "SLO missed" in page
    assert "analytic-banner" not in page


def test_analytic_profile_gets_a_banner() -> None:
    page = render_report(make_result(kind="analytic", variants=1))
    assert 'id="analytic-banner"' in page
    assert "Cost model analytic, not measured" in page


def test_many_replicas_draw_a_band() -> None:
    page = render_report(make_result(num_replicas=MAX_REPLICA_LINES + 4, variants=1, num_requests=500))
    assert "min over replicas" in page and "replica 17" not in page
    few = render_report(make_result(num_replicas=3, variants=1, num_requests=500))
    assert "replica 2" in few and "min over replicas" not in few


def test_a_million_requests_make_a_small_report() -> None:
    page = render_report(make_result(num_requests=1_000_000, num_replicas=24, variants=1))
    assert len(page.encode()) < 5 * 1024 * 1024


@pytest.mark.parametrize("num_requests", [0, 1])
def test_degenerate_runs_render(num_requests: int) -> None:
    log = RequestLog(1)
    if num_requests:
        log.on_arrival(0, 0.0, 10, 1, None)
    summary = summarize(
        log,
        duration_s=1.0,
        slo=None,
        num_gpus=1,
        usd_per_gpu_hour=None,
        kv_util_mean=float("nan"),
        prefix_hit_rate=float("nan"),
        preemptions=0,
    )
    result = RunResult(
        scenario_name="empty",
        variants={
            "base": VariantResult(
                name="base",
                requests=log,
                series=[],
                summary=summary,
                profile=ProfileInfo(name="p", kind="measured"),
            )
        },
    )
    page = render_report(result)
    assert 'id="ttft-cdf"' in page and "SLO missed" in page


def test_cdfs_draw_the_slo_and_go_logarithmic_when_variants_spread() -> None:
    base = make_result(variants=2)
    slow = base.variants["variant-1"]
    # The second variant 100× slower: its TTFT column scaled by stretching first_token_s.
    cols = slow.requests.columns()
    stretched = dict(cols)
    stretched["first_token_s"] = cols["arrival_s"] + (cols["first_token_s"] - cols["arrival_s"]) * 100
    stretched["finish_s"] = np.maximum(cols["finish_s"], stretched["first_token_s"])
    slow_log = RequestLog.from_columns({k: stretched[k] for k in (
        "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "replica", "prompt_tokens",
        "output_tokens", "rejected")})
    variants = {"variant-0": base.variants["variant-0"],
                "variant-1": VariantResult(name="variant-1", requests=slow_log, series=slow.series,
                                           summary=slow.summary, profile=slow.profile)}
    slo = {"slo": {"ttft_ms": 300, "tpot_ms": 40, "e2e_ms": None}}
    # The resolved scenario is recorded per variant, as simulation.run writes it.
    result = RunResult(scenario_name="spread", variants=variants, scenario={"variant-0": slo, "variant-1": slo})
    figures = build_figures(result)
    ttft = figures["ttft-cdf"]["layout"]
    assert ttft["xaxis"]["type"] == "log"
    assert any(shape["x0"] == 300 for shape in ttft["shapes"])
    assert "type" not in build_figures(base)["ttft-cdf"]["layout"]["xaxis"]  # variants close together: linear
    assert any(shape["x0"] == 40 for shape in figures["tpot-cdf"]["layout"]["shapes"])
    assert "shapes" not in figures["e2e-cdf"]["layout"]  # no E2E threshold set


# ----- the page as the browser reads it ---------------------------------------------------------------------


def plot_args(page: str, div_id: str) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(data, layout, config) that the page hands ``Plotly.newPlot`` for ``div_id``, parsed as JSON (which
    rejects NaN: plain JSON has none)."""
    call = f'Plotly.newPlot("{div_id}",'
    assert page.count(call) == 1, div_id
    at = page.index(call) + len(call)
    decoder = json.JSONDecoder(parse_constant=lambda name: pytest.fail(f"{name} in the JSON of {div_id}"))
    values = []
    for _ in range(3):
        while page[at] in " ,":
            at += 1
        value, at = decoder.raw_decode(page, at)
        values.append(value)
    return values[0], values[1], values[2]


def decoded(array: Any) -> np.ndarray:
    """A plotly.js typed array (``{"dtype": "f4", "bdata": ...}``) as numpy."""
    assert set(array) == {"dtype", "bdata"}, array
    dtype = {"f4": "<f4", "f8": "<f8", "i4": "<i4"}[array["dtype"]]
    return np.frombuffer(base64.b64decode(array["bdata"]), dtype=dtype)


def test_curves_travel_as_float32_binary_equal_to_the_computed_curves() -> None:
    result = make_result(num_requests=300, variants=1)
    page = render_report(result)
    data, layout, config = plot_args(page, "ttft-cdf")
    assert config == {"displaylogo": False, "responsive": True}
    assert layout["xaxis"]["title"]["text"] == "TTFT (ms)" and layout["height"] == 360
    (trace,) = data
    assert trace["type"] == "scatter" and trace["name"] == "variant-0" and trace["line"] == {"color": "#1f77b4"}
    assert trace["x"]["dtype"] == trace["y"]["dtype"] == "f4"
    log = result.variants["variant-0"].requests
    completed = np.sort(log.latencies_ms()["ttft_ms"][log.outcomes()[RequestOutcome.COMPLETED]])
    x, y = decoded(trace["x"]), decoded(trace["y"])
    assert np.array_equal(x, completed.astype(np.float32))  # under CDF_POINTS requests: every one, sorted
    assert np.array_equal(y, (np.arange(1, completed.size + 1) / completed.size).astype(np.float32))
    # The windowed hit rate is NaN where no prompt was admitted: a gap in the binary, never NaN in the JSON.
    figures = build_figures(result)
    for div_id, figure in figures.items():
        sent, _, _ = plot_args(page, div_id)
        for mine, theirs in zip(figure["data"], sent, strict=True):
            for axis in ("x", "y"):
                assert np.array_equal(decoded(theirs[axis]), mine[axis], equal_nan=True), (div_id, axis)


def test_a_hostile_name_stays_text() -> None:
    hostile = "</script><script>alert(1)</script>"
    base = make_result(num_requests=200, variants=1).variants["variant-0"]
    variant = VariantResult(name=hostile, requests=base.requests, series=base.series, summary=base.summary,
                            profile=ProfileInfo(name=hostile, kind="analytic"))
    page = render_report(RunResult(scenario_name=f"<b>{hostile}", variants={hostile: variant}))
    assert "alert(1)</script>" not in page and "<b>" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the tables show it as text
    assert page.count("<script") == page.count("</script>")
    data, _, _ = plot_args(page, "ttft-cdf")
    assert data[0]["name"] == hostile  # the plot's legend shows it too, unchanged
    _, layout, _ = plot_args(page, "kv-util-0")
    assert layout["title"]["text"] == f"KV cache use per replica — {hostile}"


def test_a_plain_report_imports_neither_plotly_nor_pandas(tmp_path: Path) -> None:
    child = """
import json, sys
from simulator.scenario import load_scenario
from simulator.simulation import run
result = run(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=10"]))
before = {name for name in ("pandas", "plotly") if name in sys.modules}
from simulator.results.report import render_report
page = render_report(result)
print(json.dumps([sorted(before), sorted(name for name in ("pandas", "plotly") if name in sys.modules), len(page)]))
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", child], cwd=root, capture_output=True, text=True, check=True)
    before, after, size = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == [], f"the run itself imported {before}"
    assert after == [], f"render_report imported {after}"
    assert size > 1_000_000  # plotly.js inlined all the same


# ----- what is plotted --------------------------------------------------------------------------------------


def test_curves_are_capped_and_the_warm_up_is_banded() -> None:
    result = make_result(num_requests=5000, variants=1)
    s = result.variants["variant-0"].summary
    warm = VariantResult(name="warm", requests=result.variants["variant-0"].requests,
                         series=synthetic_series(3, 2000.0), summary=dataclasses.replace(s, warmup_s=30.0),
                         profile=result.variants["variant-0"].profile)
    figures = build_figures(RunResult(scenario_name="warm", variants={"warm": warm}))
    for div_id, fig in figures.items():
        for trace in fig["data"]:
            limit = CDF_POINTS if div_id.endswith("-cdf") else TIME_POINTS
            assert 0 < len(trace["x"]) <= limit, (div_id, len(trace["x"]))
        band = [shape for shape in fig["layout"].get("shapes", []) if shape["type"] == "rect"]
        if div_id.endswith("-cdf"):
            assert not band, div_id  # latencies already leave the warm-up out
        else:
            assert [(b["x0"], b["x1"]) for b in band] == [(0, 30.0)], div_id
            assert {"text": "warm-up"}.items() <= fig["layout"]["annotations"][-1].items()
    assert len(figures["ttft-cdf"]["data"][0]["x"]) == CDF_POINTS  # 5,000 requests: quantiles


def reference_pivot(series: list[ReplicaSeries], value: str) -> pd.DataFrame:
    """What the report drew with pandas: time × replica, a stopped replica's last value kept, 0 before a
    replica's first sample."""
    frame = pd.concat([s.to_frame() for s in series], ignore_index=True)
    table = frame.pivot_table(index="time_s", columns="replica", values=value, aggfunc="last")
    return table.sort_index().ffill().fillna(0)


def test_replica_tables_of_a_fleet_that_changed_size_match_pandas() -> None:
    """Replicas that start late (on a grid offset that is not bit-identical to the first one's) and stop
    early: the union of their times, last values carried forward, zeros before a start."""
    series = []
    for replica, start_s, end_s in ((2, 0.0, 900.0), (0, 30.3, 900.0), (5, 0.0, 410.0), (1, 600.1, 640.0)):
        s = ReplicaSeries(replica, sample_interval_s=0.7, start_s=np.ceil(start_s / 0.7) * 0.7)
        for i, t in enumerate(np.arange(start_s, end_s, 0.3)):
            s.maybe_sample(float(t), 1, (i * 7 + replica) % 11, (i + replica) % 50, 50, i * 3, i * 10)
        s.close(end_s)
        series.append(s)
    table = _ReplicaTable(series)
    for value in ("waiting", "kv_util", "prompt_tokens_cum"):
        reference = reference_pivot(series, value)
        assert table.replicas == list(reference.columns) == [0, 1, 2, 5]
        assert np.array_equal(table.time_s, reference.index.to_numpy())
        assert np.array_equal(table.column(value), reference.to_numpy(dtype=np.float64)), value
    waiting = reference_pivot(series, "waiting").sum(axis=1)
    assert len(waiting) > TIME_POINTS  # so the buckets hold several rows
    step = int(np.ceil(len(waiting) / TIME_POINTS))
    groups = waiting.groupby(np.arange(len(waiting)) // step)
    for how, expected in (("mean", groups.mean()), ("last", groups.last()), ("min", groups.min()),
                          ("max", groups.max())):
        x, got = _bucketed(table.time_s, table.column("waiting").sum(axis=1), how)  # type: ignore[arg-type]
        assert np.array_equal(x, waiting.index.to_numpy()[::step])
        assert np.allclose(got, expected.to_numpy(), rtol=1e-12, atol=0), how
