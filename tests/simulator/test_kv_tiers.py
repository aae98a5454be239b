"""KV tiers in the simulator: the Mooncake hit rate climbs toward the unbounded-cache ideal as tiers are added
and reaches it exactly with an unbounded tier; a shared store lets one replica load what another computed;
the load-or-recompute choice flips at the bandwidth the cost model implies; bad settings are one line."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from simulator.core.config import SchedulerConfig
from simulator.core.kv_tiers import KVTiers, TierStore
from simulator.core.request import RequestSpec
from simulator.core.scheduler import Scheduler
from simulator.cost.cost_model import CostModel
from simulator.cost.kv_tiers import KVTiersConfig, TierConfig, TierPricing
from simulator.cost.profile import load_profile
from simulator.errors import ConfigError
from simulator.fleet.kv_store import TierGroup, check_groups
from simulator.results.kv_tiers import ideal_hit_rate
from simulator.scenario import load_mapping
from simulator.simulation import run
from simulator.workload.generate import generate
from simulator.workload.traces import traces_dir

PROFILE = "h200-llama-3-8b-tp1-analytic"


def test_ideal_hit_rate_by_hand() -> None:
    # Block size 4. Request 1 shares request 0's first two blocks (8 of its 13 tokens); request 2 repeats request 1
    # whole but its lookup stops a block short of its last token (12 of 13 tokens: 3 blocks of its 3 hashed).
    hashes = [[1, 2, 3], [1, 2, 9], [1, 2, 9]]
    prompts = [12, 13, 13]
    assert ideal_hit_rate(hashes, prompts, 4) == (0 + 8 + 12) / (12 + 13 + 13)
    assert ideal_hit_rate([], [], 4) == 0.0


def tiered(tiers: list[dict[str, Any]], store: dict[str, Any] | None = None) -> dict[str, Any]:
    section: dict[str, Any] = {"tiers": tiers}
    if store is not None:
        section["shared_store"] = store
    return {"kv_tiers": section}


HOST = {"name": "host", "kind": "host", "capacity_gib": 48, "read_gb_s": 50, "write_gb_s": 50, "latency_us": 5}
SSD = {"name": "ssd", "kind": "disk", "capacity_gib": 64, "read_gb_s": 6, "write_gb_s": 6, "latency_us": 80}
STORE = {"name": "store", "kind": "remote", "capacity_gib": 40, "read_gb_s": 12, "write_gb_s": 12, "latency_us": 40}
UNBOUNDED = {"name": "host", "read_gb_s": 1000, "write_gb_s": 1000}


def mooncake(variants: dict[str, Any], *, replicas: int = 1) -> dict[str, Any]:
    """The first 300 Mooncake conversation requests (prompts cut at 8000 tokens, 8-token answers), slowed 20x
    so that each prefix is computed before its next use, on one H200 with 600 KV blocks."""
    return {
        "schema_version": 1, "name": "tiers", "seed": 0,
        "workload": {"num_requests": 300, "trace": {
            "format": "mooncake", "path": str(traces_dir() / "mooncake_fast25_conversation.jsonl"),
            "max_prompt_tokens": 8000, "max_output_tokens": 8, "time_scale": 20}},
        "fleet": {"replicas": replicas, "hardware": "H200", "model": "llama-3-8b", "profile": PROFILE},
        "engine": {"preset": "vllm", "kv": {"num_blocks": 600}},
        "variants": variants,
    }


@pytest.fixture(scope="module")
def mooncake_run() -> tuple[float, dict[str, float]]:
    if not (traces_dir() / "mooncake_fast25_conversation.jsonl").is_file():
        pytest.skip(f"the Mooncake trace is not at {traces_dir()} (set FLEETSIM_TRACES to the shared traces)")
    raw = mooncake({
        "gpu_only": {},
        "host": tiered([HOST]),
        "host_ssd": tiered([HOST, SSD]),
        "host_ssd_store": tiered([HOST, SSD], {**STORE, "source": "device"}),
        "unbounded": tiered([UNBOUNDED]),
    })
    loaded = load_mapping(raw)
    scenario = loaded.variants()["gpu_only"]
    workload = generate(scenario.workload, seed=0, block_size=16, base_dir=None)
    ideal = ideal_hit_rate([spec.block_hashes for spec in workload.iter_specs(block_hashes=True)],
                           workload.prompt_tokens, 16)
    result = run(loaded, check=True)
    rates = {}
    for name, variant in result.variants.items():
        rates[name] = variant.summary.prefix_hit_rate if variant.tiers is None else variant.tiers.hit_rate["total"]
    return ideal, rates


def test_mooncake_hit_rate_rises_toward_the_ideal_as_tiers_are_added(
        mooncake_run: tuple[float, dict[str, float]]) -> None:
    ideal, rates = mooncake_run
    chain = [rates[n] for n in ("gpu_only", "host", "host_ssd", "host_ssd_store")]
    assert all(a < b for a, b in itertools.pairwise(chain)), chain
    assert chain[-1] < ideal


def test_mooncake_hit_rate_with_an_unbounded_tier_is_the_ideal_exactly(
        mooncake_run: tuple[float, dict[str, float]]) -> None:
    ideal, rates = mooncake_run
    assert rates["unbounded"] == ideal
    assert rates["gpu_only"] < ideal


def synthetic(replicas: int, variants: dict[str, Any], **router: Any) -> dict[str, Any]:
    """Requests sharing one 2048-token document, each with 64 tokens of its own, a second apart."""
    return {
        "schema_version": 1, "name": "store", "seed": 0,
        "workload": {"num_requests": 8, "arrival": {"process": "constant", "rate_rps": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 64},
                     "output_tokens": {"dist": "fixed", "value": 4},
                     "system_prompts": {"num_prompts": 1, "tokens": 2048}},
        "fleet": {"replicas": replicas, "hardware": "H200", "model": "llama-3-8b", "profile": PROFILE},
        "engine": {"preset": "vllm"},
        "router": {"policy": "round_robin", **router},
        "variants": variants,
    }


def test_a_replica_loads_from_the_shared_store_a_prefix_another_replica_computed() -> None:
    store = {**STORE, "source": "compute"}
    result = run(load_mapping(synthetic(2, {"store": tiered([HOST], store), "none": {}})), check=True)
    tiers = result.variants["store"].tiers
    assert tiers is not None
    # Request 0 computes the document on replica 0; request 1, on replica 1, loads its 128 blocks from the store.
    assert tiers.hit_rate["store"] > 0 and tiers.read_bytes["store"] >= 128 * 16 * 131072
    assert tiers.num_loads >= 1
    without = result.variants["none"].summary
    assert tiers.hit_rate["total"] > without.prefix_hit_rate
    assert result.variants["store"].summary.ttft_mean_ms < without.ttft_mean_ms


def test_loads_or_recomputes_where_the_cost_models_bandwidth_says() -> None:
    """A 2-tier setup (GPU, host) on the H200 cost model: a request's 1024-token prefix sits in host memory.
    Loading it costs latency + 64 blocks x 2 MiB / bandwidth; recomputing it costs the prefill of the whole
    prompt minus the prefill of its last 65 tokens after the prefix. The crossover bandwidth is where the two
    meet; 1 % either side must load and recompute respectively."""
    cost = CostModel(load_profile(PROFILE))
    block_bytes = int(cost.profile.memory.kv_bytes_per_token) * 16
    prompt, prefix = 1024 + 65, 1024
    full = cost.time_of(1, prompt, 0, 0, prompt, prompt * prompt / 2, 0)
    tail = prompt - prefix
    rest = cost.time_of(1, tail, 0, 0, tail, tail * (prefix + tail / 2), 0)
    latency_s = 20e-6
    crossover_gb_s = 64 * block_bytes / (full - rest - latency_s) / 1e9
    for factor, loads in ((1.01, True), (0.99, False)):
        host = TierConfig(name="host", read_gb_s=crossover_gb_s * factor, write_gb_s=10, latency_us=latency_s * 1e6)
        scheduler = Scheduler(SchedulerConfig(num_blocks=200, block_size=16))
        tiers = KVTiers([TierStore(host.spec(block_bytes=block_bytes))], TierPricing([host], cost, block_size=16),
                        block_size=16)
        scheduler.attach_tiers(tiers)
        hashes = tuple(range(1000, 1068))
        for h in hashes[:64]:
            tiers.on_evict(h)
        scheduler.add_request(RequestSpec(0, 0.0, prompt, 1, hashes))
        plan = scheduler.schedule()
        assert (plan.loads is not None) is loads, factor
        assert plan.num_new_tokens == ([tail] if loads else [prompt])


@pytest.mark.parametrize(("section", "field"), [
    ({"tiers": [{**HOST, "read_gb_s": 0}]}, "kv_tiers.tiers.0.read_gb_s"),
    ({"tiers": [{**HOST, "capacity_gib": -1}]}, "kv_tiers.tiers.0.capacity_gib"),
    ({"tiers": [{**HOST, "eviction": "random"}]}, "kv_tiers.tiers.0.eviction"),
    ({"tiers": [], "shared_store": {**STORE, "write_gb_s": 0}}, "kv_tiers.shared_store.write_gb_s"),
    ({"overlap": False}, "kv_tiers: kv_tiers needs tiers"),  # the fuzzer's: a section that names no tier
])
def test_bad_tier_settings_are_one_line_naming_the_field(section: dict[str, Any], field: str) -> None:
    raw = synthetic(1, {})
    raw["kv_tiers"] = section
    with pytest.raises(ConfigError) as err:
        load_mapping(raw)
    text = str(err.value)
    assert "\n" not in text and field in text, text


def pools(second: dict[str, Any]) -> dict[str, Any]:
    raw = synthetic(1, {})
    del raw["fleet"]
    pool = {"replicas": 1, "hardware": "H200", "model": "llama-3-8b", "profile": PROFILE}
    raw["fleet"] = {"pools": {"a": pool, "b": {**pool, **second}}}
    raw["kv_tiers"] = {"tiers": [], "shared_store": STORE}
    return raw


def test_a_store_shared_by_pools_of_other_models_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        load_mapping(pools({"model": "llama-3-70b", "tp": 4, "profile": None}))
    text = str(err.value)
    assert "\n" not in text and "kv_tiers.shared_store" in text and "llama-3-70b" in text, text


def test_a_store_shared_by_groups_of_other_block_sizes_is_refused() -> None:
    # A fleet of pools already has one block size (the pools' own rule); the store checks it for itself.
    cost = CostModel(load_profile(PROFILE))
    config = KVTiersConfig(tiers=[], shared_store=TierConfig(**STORE))
    with pytest.raises(ConfigError) as err:
        check_groups(config, [TierGroup(model="m", block_size=16, cost=cost, num_replicas=1),
                              TierGroup(model="m", block_size=32, cost=cost, num_replicas=1)])
    assert err.value.field == "kv_tiers.shared_store" and "16 and 32" in str(err.value)


def test_tiers_without_the_prefix_cache_are_refused() -> None:
    raw = synthetic(1, {})
    raw["engine"]["prefix_caching"] = False
    raw["kv_tiers"] = {"tiers": [HOST]}
    with pytest.raises(ConfigError, match=r"engine\.prefix_caching"):
        load_mapping(raw)


def sessions_through_tiers(store: dict[str, Any] | None = None) -> dict[str, Any]:
    """Sessions on six 2048-token documents, two replicas of 400 blocks each over a small host tier and an
    SSD (and ``store``, shared): blocks move down and are loaded back, step after step."""
    raw = synthetic(2, {"tiers": tiered([{**HOST, "capacity_gib": 0.5}, SSD], store)})
    raw["workload"].update({"num_requests": 40, "arrival": {"process": "poisson", "rate_rps": 4.0},
                            "output_tokens": {"dist": "fixed", "value": 40},
                            "sessions": {"turns": {"dist": "uniform", "low": 2, "high": 5}, "think_time_s": 2,
                                         "response_time_estimate_s": 1, "max_context_tokens": 6000},
                            "system_prompts": {"num_prompts": 6, "tokens": 2048}})
    raw["engine"]["kv"] = {"num_blocks": 400}
    return raw


def test_the_fast_path_runs_tiers_exactly_as_step_by_step() -> None:
    """Decode runs evict blocks (decode tokens fill hashed blocks of a session's next turn) lazily, as their
    steps are applied: with local tiers the run is still the step-by-step run, to the last figure."""
    raw = sessions_through_tiers()
    fast = run(load_mapping(raw), check=True)
    slow = run(load_mapping(raw, ["simulation.fast_path=false"]), check=True)
    tiers = fast.variants["tiers"].tiers
    assert tiers is not None and tiers.num_loads > 0 and tiers.num_device_evictions > 0
    assert fast.summary_json() != "" and fast.summary_json().replace('"fast_path": true', '"fast_path": false') \
        == slow.summary_json()


def test_a_blocked_head_refreshing_its_tier_blocks_runs_as_step_by_step() -> None:
    """Fuzz seed 508197: Mooncake's prefixes on one H100 of 3,000 one-token blocks over a 0.01 GiB host tier,
    preempting. A head that could not fit touched its blocks in the tier at every step's try, which decode
    runs skipped: the tier evicted other blocks, later loads differed, and 8 of 60 requests finished up to
    0.6 ms apart from the step-by-step run."""
    path = traces_dir() / "mooncake_fast25_conversation.jsonl"
    if not path.is_file():
        pytest.skip(f"the Mooncake trace is not at {traces_dir()} (set FLEETSIM_TRACES to the shared traces)")
    raw = {"schema_version": 1, "name": "tier-refresh", "seed": 452708620,
           "workload": {"num_requests": 60, "trace": {"format": "mooncake", "path": str(path),
                                                      "max_prompt_tokens": 32000, "rate_rps": 77.04}},
           "engine": {"preset": "vllm", "async_scheduling": False, "max_num_seqs": 16,
                      "kv": {"num_blocks": 3000, "block_size": 1}},
           "fleet": {"replicas": 1, "hardware": "H100"},
           "simulation": {"sample_interval_s": 10.0},
           **tiered([{"name": "host", "kind": "host", "capacity_gib": 0.01, "read_gb_s": 20, "write_gb_s": 20}])}
    fast = run(load_mapping(raw), check=True).variants["base"]
    slow = run(load_mapping(raw, ["simulation.fast_path=false"]), check=True).variants["base"]
    assert fast.summary.preemptions > 0 and fast.tiers is not None and fast.tiers.num_loads > 0
    for column, values in slow.requests.columns().items():
        np.testing.assert_array_equal(fast.requests.columns()[column], values, err_msg=column)


def test_a_host_tier_written_on_compute_passes_the_run_check() -> None:
    """A first tier written as blocks are computed, admitting only blocks hit before, turns most of those
    writes away; they are not passed down (the GPU still holds the block), and the run check counts them
    so (it used to fail such a run: the tier below was offered fewer blocks than the host turned away)."""
    raw = sessions_through_tiers()
    raw["variants"] = {"compute": tiered([{**HOST, "capacity_gib": 0.5, "source": "compute", "min_hits": 1}, SSD])}
    result = run(load_mapping(raw), check=True).variants["compute"]
    assert result.tiers is not None and result.tiers.num_device_evictions > 0


def test_tier_capacity_is_priced_per_gpu_and_the_store_in_all() -> None:
    config = KVTiersConfig(tiers=[TierConfig(**{**HOST, "usd_per_gib_hour": 0.01})],
                           shared_store=TierConfig(**{**STORE, "usd_per_gib_hour": 0.002}))
    assert config.usd_per_hour(num_gpus=4) == pytest.approx(48 * 0.01 * 4 + 40 * 0.002)
    raw = synthetic(1, {})
    raw["kv_tiers"] = {"tiers": [{**UNBOUNDED, "usd_per_gib_hour": 0.01}]}
    with pytest.raises(ConfigError, match="cannot be priced"):
        load_mapping(raw)


def test_the_report_shows_the_tiers() -> None:
    from simulator.results.report import build_figures, render_report

    result = run(load_mapping(synthetic(2, {"none": {}, "store": tiered([HOST], {**STORE, "source": "compute"})})))
    figures = build_figures(result)
    assert "kv-tiers-1" in figures and "kv-tiers-0" not in figures
    assert [trace["name"] for trace in figures["kv-tiers-1"]["data"]] == ["device", "host", "store"]
    page = render_report(result)
    assert "<h2>KV tiers</h2>" in page and 'id="kv-tiers-1"' in page
    assert '"kv_tiers"' in result.summary_json() and "store" in result.summary_json()
    frame = result.requests_df()
    loads = frame.groupby("variant")["load_ms"]
    assert loads.sum()["store"] > 0 and loads.count()["none"] == 0  # the untiered variant has no load column
    store = frame[frame["variant"] == "store"]
    tiers = result.variants["store"].tiers
    assert tiers is not None
    assert store["load_ms"].sum() == pytest.approx(sum(tiers.load_s.values()) * 1e3)
    # The store took every block once, as computed: the document's 128 and each of the 8 requests' own 4 (64
    # tokens), 2 MiB each, written over 2 GPUs' 12 GB/s links.
    written = (128 + 8 * 4) * 2 * 2**20
    assert tiers.written_bytes["store"] == written
    duration_s = result.variants["store"].summary.duration_s
    assert tiers.write_busy["store"] == pytest.approx(written / (2 * 12e9 * duration_s))


def test_overlapped_loads_hide_behind_compute() -> None:
    """The same loads, added to their steps or overlapped with them: overlapping never lengthens a step, so
    the load share of TTFT shrinks and TTFT does not grow."""
    serial_tiers = tiered([{**HOST, "read_gb_s": 8}], {**STORE, "read_gb_s": 8, "source": "compute"})
    overlap_tiers = {"kv_tiers": {**serial_tiers["kv_tiers"], "overlap": True}}
    result = run(load_mapping(synthetic(2, {"serial": serial_tiers, "overlap": overlap_tiers})))
    serial, overlap = result.variants["serial"], result.variants["overlap"]
    assert serial.tiers is not None and overlap.tiers is not None
    assert serial.tiers.num_loads == overlap.tiers.num_loads > 0
    assert overlap.tiers.ttft_split_ms["load"] < serial.tiers.ttft_split_ms["load"]
    assert overlap.summary.ttft_mean_ms <= serial.summary.ttft_mean_ms


def test_the_prefix_aware_router_sees_a_replicas_tiers() -> None:
    import simpy

    from simulator.fleet.kv_store import attach_tiers
    from simulator.fleet.replica import Replica
    from simulator.results.request_log import RequestLog
    from simulator.results.series import ReplicaSeries

    cost = CostModel(load_profile(PROFILE))
    replica = Replica(simpy.Environment(), 0, SchedulerConfig(num_blocks=64, block_size=16), cost, RequestLog(1),
                      ReplicaSeries(0, 1.0))
    config = KVTiersConfig(tiers=[TierConfig(**{**HOST, "router_weight": 0.5})])
    attach_tiers(config, [TierGroup(model="llama-3-8b", block_size=16, cost=cost, num_replicas=1)], [replica], {})
    tiers = replica.scheduler.tiers
    assert tiers is not None
    for h in (1, 2, 3):
        tiers.on_evict(h)
    # Each block in the host tier counts at its router_weight (here 0.5) against one on the GPU.
    assert replica.prefix_match_blocks([1, 2, 3, 4]) == 1.5
    assert replica.prefix_match_blocks([2, 3]) == 1.0 and replica.prefix_match_blocks([9, 1]) == 0
    # By default a replica's own tier counts fully and the store every replica shares at half.
    assert KVTiersConfig(tiers=[TierConfig(**HOST)], shared_store=TierConfig(**STORE)).router_weights() == [1.0, 0.5]
