"""The prefix-aware router's fleet-wide index (``fleet.prefix_index``) changes what a pick costs, not the pick:
a fleet routed through it gives every request, series and summary figure a fleet whose replicas are each
walked gives, on multi-turn sessions sharing system prompts, with pools small enough to evict indexed
prefixes, on the decode-run fast path or step by step, and in a fleet of mixed pools where one pool keeps
no prefix cache. Replicas with KV tiers are walked one by one (their hits count the tiers)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fast_path import assert_same_results

from simulator.fleet import router
from simulator.fleet.arrival_feed import RouteFn
from simulator.fleet.prefix_index import PrefixIndex
from simulator.fleet.prefix_route import PrefixAwareRoute
from simulator.fleet.replica import Replica
from simulator.results.run_result import VariantResult
from simulator.scenario import load_mapping
from simulator.simulation import run


def _walking_route(self: router.PrefixAwareRouter, views: router.LiveViews) -> RouteFn:
    """``PrefixAwareRouter.live_route`` without the index: every replica walked."""
    return PrefixAwareRoute(views, self._prefix_weight, self._load_weight)


def _sessions(num_requests: int, replicas: int, num_blocks: int | None, **engine: Any) -> dict[str, Any]:
    kv = {} if num_blocks is None else {"kv": {"num_blocks": num_blocks}}
    return {
        "schema_version": 1, "name": "prefix-index", "seed": 3,
        "workload": {
            "num_requests": num_requests,
            "arrival": {"process": "poisson", "rate_rps": 6.0 * replicas},
            "prompt_tokens": {"dist": "lognormal", "median": 120, "sigma": 0.8, "max": 1200},
            "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "max": 400},
            "system_prompts": {"num_prompts": 5, "tokens": 300},
            "sessions": {"turns": {"dist": "uniform", "low": 2, "high": 5}, "think_time_s": 2,
                         "response_time_estimate_s": 1},
        },
        "fleet": {"replicas": replicas, "profile": "h200-llama-3-8b-tp1-analytic"},
        "engine": {"preset": "vllm", **kv, **engine},
        "router": {"policy": "prefix_aware"},
    }


def _run(raw: dict[str, Any], overrides: list[str], *, indexed: bool,
         monkeypatch: pytest.MonkeyPatch) -> tuple[VariantResult, list[bool]]:
    """The scenario's base variant, and whether each replica's pool mirrored its index into a shared one."""
    shares: list[bool] = []

    def attached(variant: str, replicas: Sequence[Replica]) -> None:
        shares[:] = [r.scheduler.kv.pool.shares_index for r in replicas]

    with monkeypatch.context() as patch:
        if not indexed:
            patch.setattr(router.PrefixAwareRouter, "live_route", _walking_route)
        result = run(load_mapping(raw, overrides), inspect=attached, check=True).variants["base"]
    return result, shares


EXAMPLES = int(os.environ.get("FLEETSIM_FUZZ_EXAMPLES", "12"))
"""Scenarios drawn (each run twice, ~300 requests): a long round with ``FLEETSIM_FUZZ_EXAMPLES=500``."""


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replicas=st.integers(2, 6), num_blocks=st.sampled_from([None, 120, 300]), fast=st.booleans(),
       async_scheduling=st.booleans(), block_size=st.sampled_from([8, 16]),
       weights=st.sampled_from([(1.0, 2.0), (1.0, 0.5), (3.0, 0.2), (0.5, 4.0)]))
def test_an_indexed_fleet_routes_as_one_whose_replicas_are_each_walked(
        replicas: int, num_blocks: int | None, fast: bool, async_scheduling: bool, block_size: int,
        weights: tuple[float, float], monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _sessions(300, replicas, num_blocks, async_scheduling=async_scheduling)
    raw["engine"].setdefault("kv", {})["block_size"] = block_size
    raw["router"].update(prefix_weight=weights[0], load_weight=weights[1])
    overrides = [f"simulation.fast_path={str(fast).lower()}"]
    indexed, shares = _run(raw, overrides, indexed=True, monkeypatch=monkeypatch)
    walked, walked_shares = _run(raw, overrides, indexed=False, monkeypatch=monkeypatch)
    assert shares == [True] * replicas and walked_shares == [False] * replicas
    assert indexed.summary.prefix_hit_rate > 0.2, "the prefixes were not hit: the index went untested"
    assert_same_results(walked, indexed)


def test_small_pools_evict_indexed_prefixes_and_still_route_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools of 120 blocks evict system prompts' blocks (indexed, shared by sessions) as they fill: the index
    drops a replica's bit as its pool drops the hash."""
    raw = _sessions(400, 3, 120)
    evictions: list[int] = []

    def count(variant: str, replicas: Sequence[Replica]) -> None:
        evictions.append(sum(r.scheduler.kv.pool.num_evictions for r in replicas))

    indexed = run(load_mapping(raw, []), inspect=count, check=True).variants["base"]
    walked, _ = _run(raw, [], indexed=False, monkeypatch=monkeypatch)
    assert evictions[0] > 1000
    assert_same_results(walked, indexed)


def test_a_mixed_fleet_with_a_pool_that_keeps_no_prefix_cache_routes_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _sessions(300, 2, None)
    raw["fleet"] = {"pools": {"cached": {"replicas": 2, "profile": "h200-llama-3-8b-tp1-analytic"},
                              "plain": {"replicas": 2, "profile": "h200-llama-3-8b-tp1-analytic",
                                        "engine": {"prefix_caching": False}}}}
    indexed, shares = _run(raw, [], indexed=True, monkeypatch=monkeypatch)
    walked, _ = _run(raw, [], indexed=False, monkeypatch=monkeypatch)
    assert shares == [True] * 4
    assert_same_results(walked, indexed)


def test_replicas_with_kv_tiers_are_walked_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _sessions(200, 2, 150)
    raw["kv_tiers"] = {"tiers": [{"name": "host", "kind": "host", "capacity_gib": 1, "read_gb_s": 25,
                                  "write_gb_s": 25, "latency_us": 10}]}
    _, shares = _run(raw, [], indexed=True, monkeypatch=monkeypatch)
    assert shares == [False, False]


def test_an_index_of_no_replicas_is_refused() -> None:
    with pytest.raises(ValueError, match="without KV tiers"):
        PrefixIndex([], [])
