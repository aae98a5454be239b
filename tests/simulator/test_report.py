"""The HTML report: every plot present, the analytic banner when it applies, small at a million requests."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.results.report import MAX_REPLICA_LINES, render_report
from simulator.results.request_log import RequestLog
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
    from simulator.results.report import build_figures

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
    ttft = figures["ttft-cdf"]
    assert ttft.layout.xaxis.type == "log"
    assert any(shape.x0 == 300 for shape in ttft.layout.shapes)
    assert build_figures(base)["ttft-cdf"].layout.xaxis.type != "log"  # variants close together: linear
    assert any(shape.x0 == 40 for shape in figures["tpot-cdf"].layout.shapes)
    assert not figures["e2e-cdf"].layout.shapes  # no E2E threshold set
