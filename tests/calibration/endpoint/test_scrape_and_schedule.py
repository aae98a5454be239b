"""The bench's pure parts: server metrics read under fleetsim's and vLLM's names, and the request stream
it sends (lengths as the workload's, shared prefixes as shared ids, seeded Poisson re-timing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("prometheus_client")

from calibration.endpoint.schedule import PromptFormat, load_workload, poisson_arrivals
from calibration.endpoint.scrape import parse_metrics
from simulator.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]

VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 160.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 640.0
"""


def test_vllm_metric_names_are_read() -> None:
    figures = parse_metrics(VLLM_PAGE)
    assert figures == {"running": 7, "waiting": 2, "kv_frac": 0.25, "prefix_hits": 160, "prefix_queries": 640}


def test_scenario_requests_keep_the_workloads_lengths_and_shared_prefixes() -> None:
    scenario = ROOT / "scenarios" / "routing.yaml"  # multi-turn sessions: turns share prefixes
    bench = load_workload(scenario=scenario, trace=None, num_requests=40, rate_rps=None, seed=None)
    w = bench.workload
    assert [r.prompt_tokens for r in bench.requests] == w.prompt_tokens.tolist()
    assert [len(r.prompt) for r in bench.requests] == w.prompt_tokens.tolist()
    shared = 0
    for i, a in enumerate(bench.requests):
        for j in range(i):
            common = 0
            for x, y in zip(w.block_hashes(i), w.block_hashes(j), strict=False):
                if x != y:
                    break
                common += 1
            n = min(common * w.block_size, a.prompt_tokens, bench.requests[j].prompt_tokens)
            if n:
                shared += 1
                assert a.prompt[:n] == bench.requests[j].prompt[:n]
    assert shared > 0


def test_text_prompts_are_one_character_per_token() -> None:
    bench = load_workload(scenario=ROOT / "scenarios" / "serve_cpu.yaml", trace=None, num_requests=5,
                          rate_rps=None, seed=None, prompt_format=PromptFormat.TEXT)
    assert all(isinstance(r.prompt, str) and len(r.prompt) == r.prompt_tokens for r in bench.requests)


def test_rate_retimes_as_seeded_poisson() -> None:
    a, b = poisson_arrivals(1000, 10.0, 3), poisson_arrivals(1000, 10.0, 3)
    assert np.array_equal(a, b) and a[0] == 0 and 80 < a[-1] < 120
    assert not poisson_arrivals(5, float("inf"), 0).any()
    with pytest.raises(ConfigError):
        poisson_arrivals(5, 0.0, 0)


def test_one_source_only() -> None:
    with pytest.raises(ConfigError, match="--scenario or --trace"):
        load_workload(scenario=None, trace=None, num_requests=1, rate_rps=None, seed=None)
