"""The fleet's invariants: no request lost, KV blocks conserved, seeded runs reproducible, variants on one
request stream."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from simulator.core.request import RequestStatus
from simulator.fleet import fleet
from simulator.fleet.arrival_feed import ArrivalFeed
from simulator.fleet.replica import Replica
from simulator.results.request_log import RequestOutcome
from simulator.results.run_result import RunResult
from simulator.scenario import load_mapping
from simulator.simulation import run

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "fleet-invariants",
    "seed": 3,
    "workload": {
        "num_requests": 200,
        "arrival": {"process": "poisson", "rate_rps": 40},
        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 3000},
        "output_tokens": {"dist": "lognormal", "median": 80, "sigma": 0.8, "max": 600},
    },
    "fleet": {"replicas": 2, "profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm"},
    "router": {"policy": "least_requests"},
}

SESSIONS = [
    "workload.sessions={turns: {dist: uniform, low: 2, high: 5}, think_time_s: 1, response_time_estimate_s: 0.5}",
    "workload.system_prompts={num_prompts: 3, tokens: 200}",
]
POLICIES: dict[str, list[str]] = {
    "vllm": [],
    "static-contiguous": ["engine.batching=static", "engine.kv.policy=contiguous", "engine.max_model_len=4096",
                          "engine.kv.num_blocks=2048"],
    "continuous-reserve": ["engine.batching=continuous", "engine.kv.policy=reserve", "engine.kv.num_blocks=600"],
    "tgi": ["engine.preset=tgi"],
    "trtllm": ["engine.preset=trtllm"],
    "preempt-recompute": ["engine.kv.num_blocks=300", "workload.arrival.rate_rps=200"],
    "preempt-swap": ["engine.kv.num_blocks=300", "workload.arrival.rate_rps=200", "engine.kv.preemption=swap"],
    "sessions-prefix-aware": [*SESSIONS, "router.policy=prefix_aware", "engine.kv.num_blocks=400"],
    "sessions-affinity": [*SESSIONS, "router.policy=session_affinity"],
    "rejections": ["engine.max_model_len=512"],
    "async": ["engine.async_scheduling=true"],
    "async-preempt": ["engine.kv.num_blocks=300", "workload.arrival.rate_rps=200", "engine.async_scheduling=true"],
    "async-sessions-prefix-aware": [*SESSIONS, "router.policy=prefix_aware", "engine.kv.num_blocks=400",
                                    "engine.async_scheduling=true"],
}


def simulate(overrides: Sequence[str]) -> tuple[RunResult, dict[str, list[Replica]]]:
    """Run BASE with overrides; also return each variant's replicas as they stood when the clock stopped."""
    replicas: dict[str, list[Replica]] = {}

    def inspect(name: str, reps: Sequence[Replica]) -> None:
        replicas[name] = list(reps)

    return run(load_mapping(BASE, list(overrides)), inspect=inspect), replicas


def assert_blocks_consistent(replica: Replica) -> None:
    """Every block's reference count equals the request block tables holding it; the free queue holds
    exactly the unreferenced blocks; used + free = the pool."""
    kv = replica.scheduler.kv
    pool = kv.pool
    references = Counter(block for blocks in kv.req_blocks.values() for block in blocks)
    for block in range(pool.num_blocks):
        assert pool.ref_count(block) == references.get(block, 0), block
    free_ids = pool.free_queue
    assert len(free_ids) == len(set(free_ids)) == pool.num_free
    assert set(free_ids) == {b for b in range(pool.num_blocks) if pool.ref_count(b) == 0}
    assert pool.num_used + pool.num_free == pool.num_blocks
    assert pool.num_used == len(references)
    holders = {r.request_id for r in replica.scheduler.running}
    assert set(kv.req_blocks) <= holders | {rid for rid, blocks in kv.req_blocks.items() if not blocks}


def assert_accounted(result: RunResult) -> None:
    for variant in result.variants.values():
        s = variant.summary
        assert s.requests_completed + s.requests_in_flight + s.requests_rejected == s.requests_arrived
        frame = variant.requests.to_frame()
        counts = frame["outcome"].value_counts()
        assert counts[RequestOutcome.COMPLETED.value] == s.requests_completed
        assert counts[RequestOutcome.IN_FLIGHT.value] == s.requests_in_flight
        assert counts[RequestOutcome.REJECTED.value] == s.requests_rejected
        assert len(frame) == s.requests_arrived
        done = frame[frame["outcome"] == RequestOutcome.COMPLETED.value]
        assert done["finish_s"].notna().all() and (done["ttft_ms"] >= 0).all()
        assert (done["e2e_ms"] >= done["ttft_ms"]).all()


# ----- every arrival ends somewhere; KV conserved ---------------------------------------------------------


@pytest.mark.parametrize("case", sorted(POLICIES))
def test_drained_run_completes_everything_and_frees_every_block(case: str) -> None:
    result, replicas = simulate(POLICIES[case])
    assert_accounted(result)
    s = result.variants["base"].summary
    assert s.requests_in_flight == 0
    assert s.requests_arrived == BASE["workload"]["num_requests"]
    if case == "rejections":
        assert s.requests_rejected > 0
    else:
        assert s.requests_completed == s.requests_arrived
    if case.startswith("preempt"):
        assert s.preemptions > 0, "the case is meant to preempt"
    for replica in replicas["base"]:
        scheduler = replica.scheduler
        assert not scheduler.has_work and not scheduler.requests
        assert scheduler.kv.req_blocks == {} or all(not b for b in scheduler.kv.req_blocks.values())
        pool = scheduler.kv.pool
        assert pool.num_free == pool.num_blocks, f"replica {replica.replica_id} leaked {pool.num_used} blocks"
        assert all(pool.ref_count(block) == 0 for block in range(pool.num_blocks))
        assert scheduler.num_host_blocks_used == 0
        assert_blocks_consistent(replica)


@pytest.mark.parametrize("case", ["vllm", "static-contiguous", "preempt-swap", "sessions-prefix-aware"])
def test_horizon_leaves_requests_in_flight_counted(case: str) -> None:
    result, replicas = simulate([*POLICIES[case], "simulation.horizon_s=2", "workload.arrival.rate_rps=300"])
    assert_accounted(result)
    s = result.variants["base"].summary
    assert s.requests_in_flight > 0, "the horizon is meant to cut the run short"
    assert s.duration_s == pytest.approx(2.0)
    in_flight_on_replicas = 0
    for replica in replicas["base"]:
        assert_blocks_consistent(replica)
        scheduler = replica.scheduler
        in_flight_on_replicas += len(scheduler.requests)
        for request in scheduler.running:
            assert request.status is RequestStatus.RUNNING
            assert scheduler.kv.num_held_blocks(request.request_id) > 0 or request.num_computed_tokens == 0
    # Arrived requests are on a replica (queued, running, swapped) or counted as completed / rejected.
    assert in_flight_on_replicas == s.requests_in_flight


@pytest.mark.parametrize("case", ["vllm", "sessions-affinity", "rejections"])
def test_arrivals_logged_in_bulk_equal_arrivals_logged_one_by_one(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet logs its arrivals from the workload's columns once the clock stops (the arrived ones:
    rows 0 .. n-1); the log is the one logging each arrival as it happens gives, horizon cut included."""
    overrides = [*POLICIES[case], "simulation.horizon_s=2", "workload.arrival.rate_rps=300"]
    bulk = simulate(overrides)[0].variants["base"].requests.columns()

    def one_by_one(*args: Any, **kwargs: Any) -> ArrivalFeed:
        return ArrivalFeed(*args, **{**kwargs, "log_arrivals": True})

    monkeypatch.setattr(fleet, "ArrivalFeed", one_by_one)
    single = simulate(overrides)[0].variants["base"].requests.columns()
    assert 0 < len(bulk["arrival_s"]) < 600  # the horizon cut the stream
    assert bulk.keys() == single.keys()
    for name in bulk:
        np.testing.assert_array_equal(bulk[name], single[name], err_msg=name)


def test_the_cycle_collector_is_off_only_while_the_clock_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    original = fleet.run_until

    def watched(env: Any, until: float | None = None) -> int:
        seen.append(gc.isenabled())
        if len(seen) == 2:
            raise RuntimeError("a callback failed")
        return original(env, until)

    monkeypatch.setattr(fleet, "run_until", watched)
    assert gc.isenabled()
    simulate([])
    assert seen == [False] and gc.isenabled()
    with pytest.raises(RuntimeError, match="a callback failed"):
        simulate([])
    assert gc.isenabled()  # back on after a failed run too
    gc.disable()
    try:
        simulate(["workload.num_requests=20"])
        assert not gc.isenabled()  # a caller's choice is left as it was
    finally:
        gc.enable()


# ----- reproducibility ----------------------------------------------------------------------------------


def test_same_seed_gives_byte_identical_summary() -> None:
    overrides = [*SESSIONS, "router.policy=power_of_two"]
    first, _ = simulate(overrides)
    second, _ = simulate(overrides)
    assert first.summary_json().encode() == second.summary_json().encode()
    a, b = first.requests_df(), second.requests_df()
    assert a.equals(b)


def test_another_seed_gives_another_run() -> None:
    first, _ = simulate([])
    second, _ = simulate(["seed=4"])
    assert first.summary_json() != second.summary_json()


# ----- variants -------------------------------------------------------------------------------------------


def test_variants_replay_the_identical_request_stream() -> None:
    overrides = [
        *SESSIONS,
        # block_size differs across variants: hashes are recomputed, arrivals and lengths must not move
        "variants={rr: {router.policy: round_robin}, static: {engine.batching: static}, "
        "trt: {engine.preset: trtllm}, small: {engine.kv.num_blocks: 300, fleet.replicas: 3}}",
    ]
    result, _ = simulate(overrides)
    assert list(result.variants) == ["rr", "static", "trt", "small"]
    columns = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "session_id"]
    frames = {name: result.requests_df(name)[columns].reset_index(drop=True) for name in result.variants}
    reference = frames["rr"]
    assert len(reference) == BASE["workload"]["num_requests"]
    for name, frame in frames.items():
        assert frame.equals(reference), f"variant {name} saw another request stream"
    # ... while what they were run on differs.
    assert result.variants["small"].summary.num_gpus == 3
    assert result.variants["trt"].summary.to_dict() != result.variants["rr"].summary.to_dict()


# ----- the figures the paging question needs -----------------------------------------------------------------


def test_running_and_waste_figures() -> None:
    overrides = ["engine.max_model_len=4096", "engine.kv.num_blocks=2048", "engine.prefix_caching=false",
                 "workload.arrival.rate_rps=100",
                 "variants={contiguous: {engine.kv.policy: contiguous}, paged: {engine.kv.policy: paged}}"]
    result, _ = simulate(overrides)
    contiguous = result.variants["contiguous"].summary
    paged = result.variants["paged"].summary
    slots = 2048 * 16 // 4096
    assert 0 < contiguous.running_peak <= slots
    assert paged.running_peak > contiguous.running_peak
    assert 0 < contiguous.running_mean <= contiguous.running_peak
    assert contiguous.kv_waste_mean > 0.5 > 0.05 > paged.kv_waste_mean >= 0
    series = result.series_df("contiguous")
    assert int(series["running"].max()) <= contiguous.running_peak
    assert np.isfinite(contiguous.running_mean)


@pytest.mark.parametrize("case", ["preempt-recompute", "preempt-swap", "static-contiguous"])
def test_router_load_signal_counts_every_held_request(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica.load (one length, read by every load-aware router) equals running + waiting + swapped at
    every routing decision, through preemptions, swaps and decode runs."""
    from simulator.fleet import router as router_module

    route_fn = router_module.RouterState.route_fn
    checked = []

    def checking_route_fn(self: Any, router: Any) -> Any:
        route = route_fn(self, router)  # the live load-list route, for least_requests on live views

        def checking_route(spec: Any, now_s: float) -> int:
            for replica in self._replicas:
                sched = replica.scheduler
                replica.sync()
                assert replica.load == len(sched.running) + len(sched.waiting) + len(sched.swapped)
            # The fleet's load list (what the least-loaded scan reads) mirrors every replica's load.
            assert self._replicas.loads == [replica.load for replica in self._replicas]
            checked.append(spec.request_id)
            return route(spec, now_s)

        return checking_route

    monkeypatch.setattr(router_module.RouterState, "route_fn", checking_route_fn)
    simulate(POLICIES[case])
    assert len(checked) == BASE["workload"]["num_requests"]


def test_a_fleet_without_prefix_caching_gives_the_same_run_without_block_hashes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Specs skip their block hashes when no replica caches prefixes; nothing may depend on them then."""
    from simulator.workload.workload import Workload

    overrides = [*SESSIONS, "router.policy=prefix_aware", "engine.prefix_caching=false"]
    skipped = run(load_mapping(BASE, overrides)).variants["base"]
    iter_specs = Workload.iter_specs
    monkeypatch.setattr(Workload, "iter_specs", lambda self, block_hashes=True, lazy_chains=False:
                        iter_specs(self, block_hashes=True, lazy_chains=lazy_chains))
    hashed = run(load_mapping(BASE, overrides)).variants["base"]
    assert skipped.summary.to_dict() == hashed.summary.to_dict()
    assert np.array_equal(skipped.requests.replica, hashed.requests.replica)
