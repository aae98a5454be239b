"""A fleet of pools: one mixed pool is today's fleet exactly; prefill and decode pools hand requests over
(reserve, prefill, transfer, decode) with no request lost and no block leaked; the fast path agrees with
step by step; mixed GPUs are weighed by speed and priced per pool; bad pool settings are one line naming
the pool and the field."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.fleet.replica import Replica
from simulator.results.run_result import VariantResult
from simulator.scenario import deep_merge, load_mapping
from simulator.simulation import run

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "pools",
    "seed": 3,
    "workload": {
        "num_requests": 160,
        "arrival": {"process": "poisson", "rate_rps": 16},
        "prompt_tokens": {"dist": "lognormal", "median": 1500, "sigma": 0.6, "max": 6000},
        "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "max": 400},
        "system_prompts": {"num_prompts": 2, "tokens": 512},
    },
    "fleet": {"hardware": "H100", "model": "llama-3-8b", "tp": 1, "replicas": 2},
    "engine": {"preset": "vllm"},
    "router": {"policy": "least_requests"},
    "slo": {"ttft_ms": 2000, "tpot_ms": 40},
}

PD = {"prefill": {"role": "prefill", "replicas": 1}, "decode": {"role": "decode", "replicas": 1}}


def scenario(*overrides: str, pools: dict[str, Any] | None = PD, **sections: Any) -> dict[str, Any]:
    raw = deep_merge(BASE, sections)
    if pools is not None:
        raw["fleet"] = {**raw["fleet"], "pools": pools}
    return raw


def simulate(raw: dict[str, Any], *overrides: str,
             inspect: Any = None) -> VariantResult:
    return run(load_mapping(raw, list(overrides)), inspect=inspect).variants["base"]


def error_of(raw: dict[str, Any], *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_mapping(raw, list(overrides))
    return info.value


def check_drained(replicas: Sequence[Replica]) -> None:
    """After a run to the end: every block back in every pool, no request held anywhere."""
    for replica in replicas:
        scheduler = replica.scheduler
        assert not scheduler.requests
        assert scheduler.kv.pool.num_used == 0, f"replica {replica.replica_id} leaked blocks"
        if scheduler.sender is not None:
            assert not scheduler.sender.held
        if scheduler.receiver is not None:
            assert not scheduler.receiver.pending and not scheduler.receiver.receiving


# ----- one mixed pool is today's fleet -------------------------------------------------------------------


def test_one_mixed_pool_is_the_fleet_it_describes() -> None:
    plain = simulate(scenario(pools=None))
    pooled = simulate(scenario(pools={"only": {"replicas": 2}}))
    assert pooled.summary.to_dict() == plain.summary.to_dict()
    for name, values in plain.requests.columns().items():
        np.testing.assert_array_equal(pooled.requests.columns()[name], values, err_msg=name)
    assert plain.fleet is None and pooled.fleet is not None
    assert pooled.fleet.num_gpus == 2 and pooled.fleet.handoffs is None
    assert pooled.fleet.goodput_per_gpu_rps == pytest.approx(plain.summary.goodput_rps / 2)


# ----- the disaggregated path ----------------------------------------------------------------------------


def test_every_request_is_prefilled_transferred_and_decoded() -> None:
    seen: list[Sequence[Replica]] = []
    result = simulate(scenario(), inspect=lambda name, replicas: seen.append(replicas))
    summary = result.summary
    assert summary.requests_completed == summary.requests_arrived == 160
    check_drained(seen[0])
    prefill, decode = seen[0]
    assert prefill.scheduler.sender is not None and decode.scheduler.receiver is not None
    assert prefill.num_prefill_tokens > 0 and decode.num_prefill_tokens == 0  # no preemption: decode never prefills
    columns = result.requests.columns()
    assert set(columns["replica"]) == {decode.replica_id}
    assert result.fleet is not None and result.fleet.handoffs is not None
    handoffs = result.fleet.handoffs
    one_token = int((columns["output_tokens"] == 1).sum())
    assert handoffs.num_reserved == handoffs.num_landed == 160 - one_token
    assert handoffs.sent_gb > 0
    assert [p.role for p in result.fleet.pools] == ["prefill", "decode"]


def test_ttft_includes_the_transfer_where_the_first_token_waits_for_it() -> None:
    slow = {"disaggregation": {"link": {"preset": "ethernet_100g"}, "transfer": "after_prefill"}}
    at_decode = simulate(scenario(**deep_merge(slow, {"disaggregation": {"first_token": "decode"}})))
    at_prefill = simulate(scenario(**deep_merge(slow, {"disaggregation": {"first_token": "prefill"}})))
    ttft_decode = at_decode.requests.columns()["first_token_s"] - at_decode.requests.columns()["arrival_s"]
    ttft_prefill = at_prefill.requests.columns()["first_token_s"] - at_prefill.requests.columns()["arrival_s"]
    multi = at_decode.requests.columns()["output_tokens"] > 1
    # The same schedule: only where the client's first token comes from differs, by each transfer's time.
    np.testing.assert_array_equal(at_decode.requests.columns()["finish_s"], at_prefill.requests.columns()["finish_s"])
    assert (ttft_decode[multi] > ttft_prefill[multi]).all()
    # A 2000-token prompt's KV (128 KiB a token) over 100 Gb/s takes about 21 ms, plus some queueing.
    assert 0.015 < float(np.median(ttft_decode[multi] - ttft_prefill[multi])) < 0.1


def test_streaming_layer_by_layer_hides_the_transfer_behind_the_prefill() -> None:
    after = simulate(scenario(disaggregation={"link": {"preset": "ib_hdr"}, "transfer": "after_prefill"}))
    layerwise = simulate(scenario(disaggregation={"link": {"preset": "ib_hdr"}, "transfer": "layerwise"}))
    assert after.fleet is not None and layerwise.fleet is not None
    assert after.fleet.handoffs is not None and layerwise.fleet.handoffs is not None
    assert layerwise.fleet.handoffs.transfer_p50_ms < 0.5 * after.fleet.handoffs.transfer_p50_ms
    assert layerwise.summary.ttft_p50_ms < after.summary.ttft_p50_ms


def test_a_full_decode_pool_holds_prefills_back_and_loses_nothing() -> None:
    tight = {"prefill": PD["prefill"], "decode": {"role": "decode", "replicas": 1,
                                                  "engine": {"kv": {"num_blocks": 900}}}}
    seen: list[Sequence[Replica]] = []
    result = simulate(scenario(pools=tight), inspect=lambda name, replicas: seen.append(replicas))
    assert result.fleet is not None and result.fleet.handoffs is not None
    handoffs = result.fleet.handoffs
    assert handoffs.num_waited > 10, "the decode pool was never full: the test would prove nothing"
    assert handoffs.reserve_wait_mean_ms > 0
    assert result.summary.requests_completed == result.summary.requests_arrived == 160
    check_drained(seen[0])


@pytest.mark.parametrize("horizon_s", [0.7, 2.3, 6.0])
def test_at_a_horizon_every_arrival_is_completed_rejected_or_in_flight(horizon_s: float) -> None:
    """Cut while requests wait for a reservation, prefill, or have their KV on the wire: the run check
    (on in tests) counts each once, at its decode worker, with the tokens its prefill produced."""
    tight = {"prefill": PD["prefill"], "decode": {"role": "decode", "replicas": 1,
                                                  "engine": {"kv": {"num_blocks": 900}}}}
    result = simulate(scenario(pools=tight), f"simulation.horizon_s={horizon_s}")
    s = result.summary
    assert s.requests_in_flight > 0
    assert s.requests_completed + s.requests_rejected + s.requests_in_flight == s.requests_arrived
    assert result.fleet is not None and result.fleet.handoffs is not None
    assert result.fleet.handoffs.num_waiting_at_end >= 0


@pytest.mark.parametrize("first_token", ["decode", "prefill"])
def test_a_horizon_during_a_transfer_passes_the_run_check_with_its_first_token_where_the_client_gets_it(
        first_token: str) -> None:
    """A slow link (100 ms) and a horizon inside the transfer: the prefill produced the first token; with
    ``first_token: decode`` the client has not seen it yet (no first token logged, one token produced), with
    ``prefill`` it has. The run check (on in tests) accepts both and nothing else."""
    raw = {"schema_version": 1, "name": "disagg-horizon",
           "workload": {"num_requests": 1, "arrival": {"process": "constant", "rate_rps": 1.0},
                        "prompt_tokens": {"dist": "fixed", "value": 1000},
                        "output_tokens": {"dist": "fixed", "value": 10}},
           "fleet": {"pools": {"prefill": {"role": "prefill", "replicas": 1},
                               "decode": {"role": "decode", "replicas": 1}}},
           "disaggregation": {"link": {"preset": "ethernet_25g", "latency_us": 100000},
                              "transfer": "after_prefill", "first_token": first_token},
           "simulation": {"horizon_s": 1.05}}
    columns = run(load_mapping(raw), check=True).variants["base"].requests.columns()
    assert columns["produced_tokens"][0] == 1 and np.isnan(columns["finish_s"][0])
    assert np.isnan(columns["first_token_s"][0]) == (first_token == "decode")


def test_a_request_no_decode_worker_could_hold_is_rejected_not_lost() -> None:
    small = {"prefill": PD["prefill"], "decode": {"role": "decode", "replicas": 1, "engine": {"max_model_len": 2000}}}
    result = simulate(scenario(pools=small))
    s = result.summary
    assert s.requests_rejected > 0
    assert s.requests_completed + s.requests_rejected == s.requests_arrived


FAST_CASES = {
    "sync": ["engine.async_scheduling=false"],
    "async": [],
    "decode-preemption": ["fleet.pools.decode.engine.kv.num_blocks=700", "workload.arrival.rate_rps=30"],
    "after-prefill-slow-link": ["disaggregation.transfer=after_prefill", "disaggregation.link.preset=ethernet_25g"],
    "two-by-two": ["fleet.pools.prefill.replicas=2", "fleet.pools.decode.replicas=2",
                   "workload.arrival.rate_rps=30", "disaggregation.prefill_router=prefix_aware"],
}


@pytest.mark.parametrize("case", sorted(FAST_CASES))
def test_fast_path_matches_step_by_step(case: str) -> None:
    fast_steps: list[int] = []
    results = {}
    for fast in (False, True):
        results[fast] = simulate(scenario(), *FAST_CASES[case], f"simulation.fast_path={str(fast).lower()}",
                                 inspect=lambda name, replicas: fast_steps.append(
                                     sum(r.num_fast_steps for r in replicas)))
    assert fast_steps[0] == 0 and fast_steps[1] > 0
    slow, fast_columns = results[False].requests.columns(), results[True].requests.columns()
    for name, values in slow.items():
        np.testing.assert_allclose(fast_columns[name], values, rtol=1e-9, atol=1e-9, err_msg=name)
    fleet_fast, fleet_slow = results[True].fleet, results[False].fleet
    assert fleet_fast is not None and fleet_slow is not None
    assert _close(fleet_fast.to_dict(), fleet_slow.to_dict())


def test_fast_path_matches_step_by_step_while_offers_wait_for_decode_blocks() -> None:
    """A decode pool so small that offers wait for blocks. The step-by-step path retries them after every
    step, and a retry succeeds once a request whose KV landed has indexed the system prompt the next offer
    hits (it then needs fewer blocks): a decode run must not skip those retries (the offer was reserved a
    run later, and started late)."""
    raw = {"schema_version": 1, "name": "offers-waiting",
           "workload": {"arrival": {"process": "constant", "rate_rps": 53.0},
                        "prompt_tokens": {"dist": "lognormal", "median": 293.0, "sigma": 1.0},
                        "output_tokens": {"dist": "uniform", "low": 1, "high": 21}, "num_requests": 13,
                        "system_prompts": {"num_prompts": 2, "tokens": 64}},
           "fleet": {"pools": {"prefill": {"role": "prefill", "replicas": 1},
                               "decode": {"role": "decode", "replicas": 1, "engine": {"kv": {"num_blocks": 32}}}}}}
    columns = {fast: simulate(raw, f"simulation.fast_path={str(fast).lower()}").requests.columns()
               for fast in (False, True)}
    for name, values in columns[False].items():
        np.testing.assert_allclose(columns[True][name], values, rtol=1e-9, atol=1e-9, err_msg=name)


def _close(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-6 (busy time and KV use are summed per step or per run: the last bits differ)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-6)
    return bool(a == b)


# ----- mixed GPUs ----------------------------------------------------------------------------------------

MIXED_GPUS = {"fast": {"replicas": 1, "hardware": "H100"}, "slow": {"replicas": 1, "hardware": "A100"}}


def test_a_speed_weighted_router_sends_more_to_the_faster_gpu_and_each_pool_is_priced() -> None:
    result = simulate(scenario(pools=MIXED_GPUS), "router.policy=weighted_least_requests",
                      "workload.arrival.rate_rps=12")
    replica = result.requests.columns()["replica"]
    assert (replica == 0).sum() > 1.2 * (replica == 1).sum()
    assert result.fleet is not None
    fast, slow = result.fleet.pools
    assert fast.hardware == "H100" and slow.hardware == "A100"
    assert fast.usd_per_gpu_hour > slow.usd_per_gpu_hour
    assert result.fleet.usd_per_hour == pytest.approx(fast.usd_per_gpu_hour + slow.usd_per_gpu_hour)
    assert result.summary.usd_per_gpu_hour == pytest.approx(result.fleet.usd_per_hour / 2)
    plain = simulate(scenario(pools=MIXED_GPUS), "workload.arrival.rate_rps=12")
    plain_replica = plain.requests.columns()["replica"]
    assert abs(int((plain_replica == 0).sum()) - int((plain_replica == 1).sum())) < (replica == 0).sum() - (
        replica == 1).sum()


def test_an_h100_prefill_pool_feeds_an_a100_decode_pool() -> None:
    pools = {"prefill": {"role": "prefill", "replicas": 1, "hardware": "H100"},
             "decode": {"role": "decode", "replicas": 2, "hardware": "A100"}}
    result = simulate(scenario(pools=pools))
    assert result.summary.requests_completed == 160
    assert result.fleet is not None
    assert [p.hardware for p in result.fleet.pools] == ["H100", "A100"] and result.fleet.num_gpus == 3
    assert "prefill: h100" in result.profile.name and "decode: a100" in result.profile.name


# ----- bad input: one line naming the pool and the field ---------------------------------------------------


@pytest.mark.parametrize(("pools", "sections", "field", "words"), [
    ({**PD, "decode": {"role": "decode", "replicas": 1, "model": "llama-3-70b", "tp": 4}}, {},
     "fleet.pools.decode.model", "serves llama-3-70b but prefill pool prefill serves llama-3-8b"),
    ({**PD, "decode": {"role": "decode", "replicas": 1, "engine": {"kv": {"block_size": 32}}}}, {},
     "fleet.pools.decode.engine.kv.block_size", "blocks of 32 tokens"),
    ({**PD, "decode": {"role": "decode", "replicas": 1, "engine": {"kv": {"dtype": "fp8"}}}}, {},
     "fleet.pools.decode.engine.kv.dtype", "the KV moves as it is"),
    ({**PD, "decode": {"role": "decode", "replicas": 0}}, {}, "fleet.pools.decode.replicas",
     "at least one replica"),
    (PD, {"disaggregation": {"link": {"bandwidth_gb_s": 0}}}, "disaggregation.link.bandwidth_gb_s",
     "never delivers a block"),
    (PD, {"disaggregation": {"link": {"preset": "nvlink"}}}, "disaggregation.link.preset", "did you mean 'nvlink4'"),
    ({"prefill": PD["prefill"]}, {}, "fleet.pools", "needs a decode pool too"),
    ({**PD, "other": {"replicas": 1}}, {}, "fleet.pools.other.role", "mixed in a fleet of prefill and decode"),
    ({**PD, "decode": {"role": "decode", "replicas": 1, "engine": {"batching": "static"}}}, {},
     "fleet.pools.decode.engine.batching", "static batching"),
    ({**PD, "decode": {"role": "decode", "replicas": 1, "hardware": "H999"}}, {}, "fleet.pools.decode.hardware",
     "pool decode"),
])
def test_bad_pools_are_one_line_naming_the_pool_and_the_field(pools: dict[str, Any], sections: dict[str, Any],
                                                              field: str, words: str) -> None:
    err = error_of(scenario(pools=pools, **sections))
    assert err.field == field, str(err)
    assert words in str(err)
    assert "\n" not in str(err)


def test_a_link_preset_typo_in_a_file_names_the_file(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump(scenario(disaggregation={"link": {"preset": "infiniband"}})))
    from simulator.scenario import load_scenario

    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert str(path) in str(info.value) and "disaggregation.link.preset" in str(info.value)


def test_a_prefill_worker_drops_the_first_token_of_a_request_preempted_while_it_was_in_flight() -> None:
    """Async scheduling on a prefill worker short of blocks: a request preempted while its first token was in
    flight lost the KV the decode worker reads with the preemption, so that token is dropped and its prompt
    computed again (before, the stale token finished it without its blocks held for the transfer, and the
    run stopped with a KeyError as the transfer released them). Every request completes, with one output
    token, and the fast path agrees with step by step (a fuzzer's scenario)."""
    raw = {"schema_version": 1, "name": "prefill-preempted-in-flight", "seed": 762872714,
           "workload": {"arrival": {"process": "curve", "points": [[0.0, 50.48579867676095]]},
                        "prompt_tokens": {"dist": "lognormal", "median": 4470.08, "sigma": 0.8, "max": 6610},
                        "output_tokens": {"dist": "fixed", "value": 1}, "num_requests": 39,
                        "sessions": {"turns": {"dist": "lognormal", "median": 5.74, "sigma": 0.334},
                                     "think_time_s": 4.46, "response_time_estimate_s": 2.91}},
           "fleet": {"replicas": 4, "hardware": "A100", "model": "llama-3-8b", "tp": 1,
                     "pools": {"prefill": {"role": "prefill", "replicas": 1},
                               "decode": {"role": "decode", "replicas": 3, "tp": 2, "hardware": "H100"}}},
           "engine": {"long_prefill_token_threshold": 256, "async_scheduling": True, "kv": {"num_blocks": 2853}},
           "router": {"policy": "least_kv", "refresh_s": 0.1},
           "disaggregation": {"link": {"preset": "in_process", "bandwidth_gb_s": 5.47, "latency_us": 823.7},
                              "first_token": "decode"}}
    results = {fast: run(load_mapping(raw, [f"simulation.fast_path={str(fast).lower()}"]), check=True).variants["base"]
               for fast in (False, True)}
    summary = results[True].summary
    assert summary.preemptions > 0, "nothing preempted: the test would prove nothing"
    assert summary.requests_completed == summary.requests_arrived == 39
    assert summary.output_tokens == 39
    assert summary.to_dict() == results[False].summary.to_dict()


def test_a_step_that_only_preempts_is_run_and_the_next_decision_schedules_the_others() -> None:
    """A decode worker with a one-token budget under the priority policy: the running request short of a block
    is the latest, so it preempts itself, which ends vLLM's pass over the running requests and skips the
    waiting ones: the plan schedules nothing but did preempt. The engine runs that empty step and decides
    again (scheduling the request left running); the replica used to go idle on it, waiting for an arrival
    that never came, and the run ended with 7 requests in flight (a fuzzer's scenario). Both paths agree."""
    raw = {"schema_version": 1, "name": "preempt-only-step", "seed": 530664994,
           "workload": {"arrival": {"process": "constant", "rate_rps": 97.96},
                        "prompt_tokens": {"dist": "uniform", "low": 392, "high": 1520},
                        "output_tokens": {"dist": "uniform", "low": 63, "high": 542}, "num_requests": 23},
           "fleet": {"replicas": 5, "hardware": "H200", "model": "qwen3-30b-a3b", "tp": 1,
                     "profile": "h200-qwen3-30b-a3b-tp1-analytic",
                     "pools": {"prefill": {"role": "prefill", "replicas": 2},
                               "decode": {"role": "decode", "replicas": 3,
                                          "engine": {"preset": "vllm", "max_num_seqs": 2,
                                                     "max_num_batched_tokens": 1, "queue_policy": "priority",
                                                     "kv": {"num_blocks": 1842}}}}},
           "engine": {"preset": "vllm", "async_scheduling": False, "kv": {"block_size": 1, "preemption": "recompute"}},
           "router": {"policy": "random", "refresh_s": 0.01}, "simulation": {"sample_interval_s": 5.0},
           "disaggregation": {"link": {"preset": "ib_ndr", "bandwidth_gb_s": 353.3}, "transfer": "after_prefill",
                              "prefill_router": "weighted_least_requests",
                              "decode_router": "weighted_least_requests"}}
    results = {fast: run(load_mapping(raw, [f"simulation.fast_path={str(fast).lower()}"]), check=True).variants["base"]
               for fast in (False, True)}
    summary = results[True].summary
    assert summary.preemptions > 0
    assert summary.requests_in_flight == 0
    assert summary.requests_completed + summary.requests_rejected == summary.requests_arrived == 23
    assert summary.to_dict() == results[False].summary.to_dict()
