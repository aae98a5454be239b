"""The simulator's decode-run fast path gives the same per-request results as one event per step."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from simulator.fleet.replica import Replica
from simulator.results.run_result import VariantResult
from simulator.scenario import load_mapping
from simulator.simulation import run

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "fast-path",
    "seed": 7,
    "workload": {
        "num_requests": 300,
        "arrival": {"process": "poisson", "rate_rps": 30},
        "prompt_tokens": {"dist": "lognormal", "median": 400, "sigma": 0.8, "max": 3000},
        "output_tokens": {"dist": "lognormal", "median": 120, "sigma": 0.8, "max": 800},
    },
    "fleet": {"replicas": 3, "profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm"},
    "router": {"policy": "least_requests"},
}

CASES = {
    "chunked": [],
    "overload-preemption": ["engine.kv.num_blocks=600", "engine.max_num_seqs=24", "workload.arrival.rate_rps=120",
                            "router.policy=least_kv"],
    "static-contiguous": ["engine.batching=static", "engine.kv.policy=contiguous", "engine.max_model_len=4096",
                          "engine.max_num_seqs=8"],
    "tgi-swap": ["engine.preset=tgi", "engine.kv.policy=paged", "engine.kv.preemption=swap",
                 "engine.kv.num_blocks=500", "workload.arrival.rate_rps=80"],
    "sessions-prefix": [
        "workload.sessions={turns: {dist: uniform, low: 2, high: 5}, think_time_s: 2, response_time_estimate_s: 1}",
        "workload.system_prompts={num_prompts: 3, tokens: 300}",
        "workload.prompt_tokens={dist: lognormal, median: 120, sigma: 0.5, max: 800}",
        "router.policy=prefix_aware",
        "router.refresh_s=0.05",
    ],
    "horizon": ["simulation.horizon_s=6", "workload.arrival.rate_rps=200", "engine.max_num_seqs=16"],
    # A prompt's last chunk of one token looks like a decode, but its step samples the first token.
    "sync-one-token-last-chunk": ["engine.async_scheduling=false", "engine.max_num_batched_tokens=2048",
                                  "workload.prompt_tokens.min=2049", "workload.prompt_tokens.max=2049",
                                  "workload.arrival.rate_rps=10"],
    "async": ["engine.async_scheduling=true"],
    # The token budget, not the seats, full of decodes: the decision that leaves out a finishing request has
    # its token to spare and admits the head of the queue.
    "async-budget-full": ["engine.async_scheduling=true", "engine.max_num_batched_tokens=2", "fleet.replicas=1",
                          "workload.prompt_tokens.median=1", "workload.prompt_tokens.max=1",
                          "workload.output_tokens.median=50", "workload.output_tokens.sigma=0.3",
                          "workload.arrival.rate_rps=37", "workload.num_requests=40"],
    "async-overload-preemption": ["engine.async_scheduling=true", "engine.kv.num_blocks=600", "engine.max_num_seqs=24",
                                  "workload.arrival.rate_rps=120", "router.policy=least_kv"],
    "async-no-cache": ["engine.async_scheduling=true", "engine.prefix_caching=false"],
    "async-sessions-prefix": [
        "engine.async_scheduling=true",
        "workload.sessions={turns: {dist: uniform, low: 2, high: 5}, think_time_s: 2, response_time_estimate_s: 1}",
        "workload.system_prompts={num_prompts: 3, tokens: 300}",
        "workload.prompt_tokens={dist: lognormal, median: 120, sigma: 0.5, max: 800}",
        "router.policy=prefix_aware",
        "router.refresh_s=0.05",
    ],
    "async-horizon": ["engine.async_scheduling=true", "simulation.horizon_s=6", "workload.arrival.rate_rps=200",
                      "engine.max_num_seqs=16"],
    # Mixture-of-experts profiles: the routed-expert term (per token count) and the all-to-all on every path.
    "moe-ep-sync": ["fleet.model=qwen3-30b-a3b", "fleet.tp=2", "fleet.profile=h200-qwen3-30b-a3b-tp2-ep2-analytic",
                    "engine.async_scheduling=false", "workload.arrival.rate_rps=60"],
    "moe-skewed-async": ["fleet.model=qwen3-30b-a3b", "fleet.profile=h200-qwen3-30b-a3b-tp1-analytic",
                         "fleet.expert_routing=zipf", "fleet.zipf_exponent=0.6", "engine.async_scheduling=true"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_path_matches_step_by_step(case: str) -> None:
    _assert_fast_path_matches_step_by_step(CASES[case])


@pytest.mark.parametrize("case", ["chunked", "async", "async-horizon", "async-overload-preemption"])
def test_fast_path_matches_step_by_step_when_a_runs_end_event_fires_well_before_its_end(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode run's end event is first due at a bound a few ulps before its last step's end
    (``StepEnds.end_floor``), so arrivals and other replicas' events almost never fall in between. Here the
    bound is moved far earlier (a wide margin): the event then often finds something due before the exact
    end and is scheduled again there, and arrivals cut runs after it fired; the results stay the reference's."""
    from simulator import native
    from simulator.cost import cost_model

    if native.active():
        pytest.skip("the margin is a constant of the compiled build: this runs in pure Python only")
    monkeypatch.setattr(cost_model, "_ROUNDING", 1e-4)
    _assert_fast_path_matches_step_by_step(CASES[case])


def _assert_fast_path_matches_step_by_step(overrides: list[str]) -> None:
    fast_steps: list[int] = []
    counters: list[list[tuple[int, float, int]]] = []

    def count_fast_steps(variant: str, replicas: Sequence[Replica]) -> None:
        fast_steps.append(sum(r.num_fast_steps for r in replicas))
        counters.append([(r.num_steps, r.busy_s, r.num_prefill_tokens) for r in replicas])

    results = {}
    for fast in (False, True):
        loaded = load_mapping(BASE, [*overrides, f"simulation.fast_path={str(fast).lower()}"])
        results[fast] = run(loaded, inspect=count_fast_steps).variants["base"]
    assert fast_steps[0] == 0, "the step-by-step reference took decode runs"
    assert fast_steps[1] > 0, "the fast path was never taken: the test would prove nothing"
    # Each replica's steps, busy time (a run adds its span, step by step adds each step: equal but for rounding)
    # and prompt tokens computed; with a horizon, only the steps that ended before it.
    for (steps, busy, prompt), (fast_steps_n, fast_busy, fast_prompt) in zip(*counters, strict=True):
        assert (fast_steps_n, fast_prompt) == (steps, prompt)
        assert fast_busy == pytest.approx(busy, rel=1e-12)
    assert_same_results(results[False], results[True])


def assert_same_results(slow_run: VariantResult, fast_run: VariantResult) -> None:
    """Every per-request column and every replica series equal (floats to rounding), and the summary."""
    slow, fast_result = slow_run.requests.columns(), fast_run.requests.columns()
    for column, values in slow.items():
        other = fast_result[column]
        if values.dtype.kind == "f":
            np.testing.assert_allclose(other, values, rtol=1e-9, atol=1e-9, err_msg=column)
        else:
            np.testing.assert_array_equal(other, values, err_msg=column)
    for slow_series, fast_series in zip(slow_run.series, fast_run.series, strict=True):
        for column, values in slow_series.columns().items():
            np.testing.assert_allclose(fast_series.columns()[column], values, rtol=1e-9, err_msg=column)
    slow_summary, fast_summary = slow_run.summary.to_dict(), fast_run.summary.to_dict()
    assert fast_summary.keys() == slow_summary.keys()
    for key, value in slow_summary.items():
        if isinstance(value, float):
            assert fast_summary[key] == pytest.approx(value, rel=1e-6), key
        else:
            assert fast_summary[key] == value, key


def test_a_replica_that_crashes_mid_run_leaves_the_series_of_the_step_by_step_path() -> None:
    """A crash inside a decode run: the last step that ended is sampled as step by step (a run sampled a step
    only when a later grid point needed it, counting on steps that never came), so the dead replica's KV
    figures at the grid points after the crash match."""
    raw = {"schema_version": 1, "name": "crash-series",
           "workload": {"arrival": {"process": "constant", "rate_rps": 75.0},
                        "prompt_tokens": {"dist": "lognormal", "median": 56.0, "sigma": 0.8},
                        "output_tokens": {"dist": "fixed", "value": 293}, "num_requests": 117},
           "fleet": {"replicas": 2, "hardware": "H100"},
           "failures": {"crashes": [{"at_s": 3.5, "replica": 0}]}}
    results = {fast: run(load_mapping(raw, [f"simulation.fast_path={str(fast).lower()}"])).variants["base"]
               for fast in (False, True)}
    for slow_series, fast_series in zip(results[False].series, results[True].series, strict=True):
        for column, values in slow_series.columns().items():
            np.testing.assert_allclose(fast_series.columns()[column], values, rtol=1e-9, err_msg=column)


def test_the_peak_of_running_requests_counts_steps_a_run_did_not_sample() -> None:
    """A decode worker whose batch of 1 lives inside decode runs that no grid point samples (every step but
    the last ends with the whole batch running, which the step-by-step path samples; the run samples only
    the steps grid points need): the summary's ``running_peak`` is the same on both paths (it was 0 here)."""
    raw: dict[str, Any] = {
        "schema_version": 1, "name": "peak", "seed": 755613590,
        "workload": {"arrival": {"process": "constant", "rate_rps": 51.49},
                     "prompt_tokens": {"dist": "uniform", "low": 89, "high": 228},
                     "output_tokens": {"dist": "lognormal", "median": 2.18, "sigma": 0.604, "max": 10, "min": 1},
                     "num_requests": 12,
                     "system_prompts": {"num_prompts": 1, "tokens": 1042, "zipf_exponent": 1.65}},
        "fleet": {"hardware": "H200", "model": "llama-3-8b", "tp": 1, "profile": "h200-llama-3-8b-tp1-analytic",
                  "pools": {"prefill": {"role": "prefill", "replicas": 3},
                            "decode": {"role": "decode", "replicas": 1}}},
        "engine": {"preset": "tgi", "max_num_batched_tokens": 2048, "prefix_caching": False,
                   "kv": {"preemption": "swap"}},
        "router": {"policy": "random"},
        "simulation": {"sample_interval_s": 0.1},
        "disaggregation": {"link": {"preset": "ib_ndr", "bandwidth_gb_s": 168.32}, "transfer": "after_prefill"},
    }
    peaks = [run(load_mapping(raw, [f"simulation.fast_path={fast}"])).variants["base"].summary.running_peak
             for fast in ("false", "true")]
    assert peaks[0] >= 1 and peaks[1] == peaks[0]


def test_a_crash_after_a_router_read_the_step_in_flight_samples_the_state_the_last_step_ended_with() -> None:
    """Arrivals routed after a step ended apply the next step's KV (allocated as it starts, as step by step)
    and join the queue; the replica then crashes before that step ends. The step-by-step path's last sample
    is the state as the earlier step ended: without the arrivals and the next step's blocks (205 vs 202
    blocks, 33 vs 32 waiting, before the run kept it)."""
    raw = {"schema_version": 1, "name": "crash-after-sync", "seed": 40378115,
           "workload": {"arrival": {"process": "constant", "rate_rps": 83.94},
                        "prompt_tokens": {"dist": "uniform", "low": 10, "high": 28},
                        "output_tokens": {"dist": "uniform", "low": 276, "high": 766}, "duration_s": 1.9,
                        "system_prompts": {"num_prompts": 2, "tokens": 309}},
           "fleet": {"replicas": 1, "hardware": "H100", "model": "llama-3-70b", "tp": 4, "weight_dtype": "int4"},
           "engine": {"max_num_seqs": 16, "kv": {"block_size": 8, "num_blocks": 1179}},
           "router": {"policy": "least_requests"}, "simulation": {"horizon_s": 1.387},
           "autoscaling": {"policy": "schedule", "min_replicas": 1, "max_replicas": 6, "interval_s": 3.38,
                           "metrics_delay_s": 0.12, "window_s": 6.39, "schedule": [[0.0, 4]]},
           "failures": {"crashes": [{"at_s": 0.59, "replica": 0}], "detection_s": 1.45, "max_retries": 3}}
    results = {fast: run(load_mapping(raw, [f"simulation.fast_path={str(fast).lower()}"]), check=True).variants["base"]
               for fast in (False, True)}
    for slow_series, fast_series in zip(results[False].series, results[True].series, strict=True):
        for column, values in slow_series.columns().items():
            np.testing.assert_array_equal(fast_series.columns()[column], values, err_msg=column)
    assert results[True].summary.to_dict()["kv_util_mean"] == results[False].summary.to_dict()["kv_util_mean"]
