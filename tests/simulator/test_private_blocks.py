"""Private blocks (a request's own prompt and answer, marked in the pool instead of indexed) and chained blocks
(a session's, handed from turn to turn without the index) change nothing a run reports: the same scenario with
the workload's ``private_from`` and ``chain_from`` withheld (every block indexed, the reference) gives the same
per-request results, series and summary, on every path where a request leaves a replica unfinished
(preemption by recompute and by swap, a prefill worker's hand-off, a failed node)."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator import yaml_text
from simulator.fleet.replica import Replica
from simulator.results.run_result import VariantResult
from simulator.scenario import load_mapping
from simulator.simulation import run
from simulator.workload import workload
from simulator.workload.block_keys import SyntheticBlockKeys

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "private-blocks",
    "seed": 3,
    "workload": {
        "num_requests": 300,
        "arrival": {"process": "poisson", "rate_rps": 30},
        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 3000},
        "output_tokens": {"dist": "lognormal", "median": 120, "sigma": 0.8, "max": 800},
        "system_prompts": {"num_prompts": 3, "tokens": 200},
    },
    "fleet": {"replicas": 3, "profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm"},
    "router": {"policy": "prefix_aware"},
}

OVERLOAD = ["engine.kv.num_blocks=500", "engine.max_num_seqs=24", "workload.arrival.rate_rps=120"]

CASES: dict[str, list[str]] = {
    "chunked": [],
    "overload-preemption": [*OVERLOAD, "router.policy=least_kv"],
    "async-overload-preemption": [*OVERLOAD, "engine.async_scheduling=true"],
    "step-by-step-overload": [*OVERLOAD, "simulation.fast_path=false"],
    "tgi-swap": ["engine.preset=tgi", "engine.kv.policy=paged", "engine.kv.preemption=swap", "engine.kv.num_blocks=400",
                 "workload.arrival.rate_rps=80"],
    "sessions-overload": [*OVERLOAD, "workload.sessions={turns: {dist: uniform, low: 1, high: 4}, think_time_s: 1, "
                          "response_time_estimate_s: 0.5}",
                          "workload.prompt_tokens={dist: lognormal, median: 120, sigma: 0.5, max: 800}"],
    "sessions-kv-tiers": ["workload.sessions={turns: {dist: uniform, low: 1, high: 4}, think_time_s: 1, "
                          "response_time_estimate_s: 0.5}", "engine.kv.num_blocks=600",
                          "kv_tiers={tiers: [{name: host, kind: host, capacity_gib: 1, read_gb_s: 25, write_gb_s: 25,"
                          " latency_us: 10}]}"],
    "disaggregated": ["fleet.pools={prefill: {role: prefill, replicas: 1}, decode: {role: decode, replicas: 2}}",
                      "disaggregation={link: {preset: nvlink4}}", "router.policy=least_requests"],
}

DAY = Path(__file__).resolve().parents[2] / "scenarios" / "day.yaml"


def _day(overrides: list[str]) -> Any:
    """The day scenario's static fleet for its first half hour, a node failing with requests in flight."""
    raw = yaml_text.safe_load(DAY.read_text())
    raw["variants"] = {"static-5": {}}
    return load_mapping(raw, ["workload.duration_s=1800", "failures.node_failures=[{at_s: 900, node: 0}]",
                              "workload.arrival.peak_rps=16", "workload.arrival.trough_rps=16", *overrides],
                        source=DAY)


def _run(loaded: Any, *, private: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[VariantResult, list[int]]:
    """The run's only variant and, over its replicas: blocks still marked, and requests whose private blocks
    were indexed as they left unfinished."""
    with monkeypatch.context() as patch:
        if not private:
            patch.setattr(SyntheticBlockKeys, "private_from", lambda self, start, stop: None)
            patch.setattr(workload, "_chain_from", lambda keys, start, stop: None)
        seen = [0, 0]

        def count(variant: str, replicas: Sequence[Replica]) -> None:
            for replica in replicas:
                kv = replica.scheduler.kv
                seen[0] += kv.pool.num_cached - len(kv.pool.cached)
                seen[1] += len(kv._exposed)

        result = run(loaded, inspect=count)
    return next(iter(result.variants.values())), seen


def _assert_same(reference: VariantResult, private: VariantResult) -> None:
    for column, values in reference.requests.columns().items():
        np.testing.assert_array_equal(private.requests.columns()[column], values, err_msg=column)
    for ref_series, series in zip(reference.series, private.series, strict=True):
        for column, values in ref_series.columns().items():
            np.testing.assert_array_equal(series.columns()[column], values, err_msg=column)
    assert private.summary.to_dict() == reference.summary.to_dict()


@pytest.mark.parametrize("case", sorted(CASES))
def test_private_blocks_change_no_result(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_mapping(BASE, CASES[case])
    reference, (marked_ref, exposed_ref) = _run(loaded, private=False, monkeypatch=monkeypatch)
    private, (marked, exposed) = _run(loaded, private=True, monkeypatch=monkeypatch)
    assert marked_ref == exposed_ref == 0, "the reference marked blocks: it would prove nothing"
    if "kv-tiers" in case:  # the tiers are told of every block cached or evicted: nothing is marked
        assert marked == 0
    else:
        assert marked > 0, "no block was marked: the test would prove nothing"
    if "overload" in case or "swap" in case:
        assert reference.summary.preemptions > 0, "no preemption: the case tests nothing of its own"
        assert exposed > 0, "no request left unfinished with marked blocks: its indexing went untested"
    assert private.summary.preemptions == reference.summary.preemptions
    _assert_same(reference, private)


def test_private_blocks_change_nothing_on_a_day_with_a_node_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _day([])
    reference, _ = _run(loaded, private=False, monkeypatch=monkeypatch)
    private, (marked, _) = _run(loaded, private=True, monkeypatch=monkeypatch)
    assert marked > 0
    assert reference.day is not None and reference.day.figures.requests_retried > 0, "no retry: nothing tested"
    _assert_same(reference, private)
    assert private.day is not None and private.day.figures == reference.day.figures
