"""Mixture-of-experts routing (``simulator.cost.moe``) and the MoE term of the cost model: distinct experts
by tokens, the busiest EP group, dispatch fan-out, every path of the cost model giving the same bits, and a
bad ``moe`` block reported in one line naming the file and the field."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.step import StepShape
from simulator.cost import moe as routing
from simulator.cost.cost_model import CostModel, StepEnds, all_to_all_terms
from simulator.cost.dtypes import WeightDtype
from simulator.cost.moe import Routing
from simulator.cost.profile import CommModel, MoeCoefficients, Profile, load_hardware, load_profile, parse_profile
from simulator.cost.reprice import at_dtypes
from simulator.errors import ConfigError

BASE = load_profile("h200-llama-3-8b-tp1-analytic")

experts_and_k = st.integers(1, 256).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, min(e, 16))))


# ----- expected distinct experts ---------------------------------------------------------------------------


@pytest.mark.parametrize("experts,k", [(8, 2), (128, 8), (256, 8), (4, 4)])
@pytest.mark.parametrize("skew", [0.0, 0.8, 1.5])
def test_one_token_touches_its_k_experts(experts: int, k: int, skew: float) -> None:
    probs = routing.inclusion_probabilities(experts, k, Routing.ZIPF, skew)
    assert math.fsum(probs) == pytest.approx(k, rel=1e-12)
    assert routing.expected_distinct_experts(1, probs) == pytest.approx(k, rel=1e-12)
    assert routing.expected_distinct_experts(0, probs) == 0.0


def test_uniform_is_the_closed_form() -> None:
    probs = routing.inclusion_probabilities(128, 8)
    for n in (1, 7, 64, 1000):
        assert routing.expected_distinct_experts(n, probs) == 128 * (1 - (1 - 8 / 128) ** n)


@settings(max_examples=200, deadline=None)
@given(ek=experts_and_k, n=st.integers(1, 20000), skew=st.floats(0.0, 2.0))
def test_distinct_experts_grow_to_all_and_skew_touches_fewer(ek: tuple[int, int], n: int, skew: float) -> None:
    experts, k = ek
    uniform = routing.inclusion_probabilities(experts, k)
    skewed = routing.inclusion_probabilities(experts, k, Routing.ZIPF, skew)
    assert all(0.0 < p <= 1.0 for p in skewed)
    assert list(skewed) == sorted(skewed, reverse=True)
    d_uniform = routing.expected_distinct_experts(n, uniform)
    d_skewed = routing.expected_distinct_experts(n, skewed)
    assert k - 1e-9 <= d_skewed <= d_uniform + 1e-9 * experts  # concave in π: equal shares touch the most
    assert d_uniform <= experts + 1e-9
    assert routing.expected_distinct_experts(n + 1, uniform) >= d_uniform
    assert routing.expected_distinct_experts(n + 1, skewed) >= d_skewed - 1e-12


def test_large_batches_touch_every_expert() -> None:
    for skew in (0.0, 1.0):
        probs = routing.inclusion_probabilities(256, 8, Routing.ZIPF, skew)
        assert routing.expected_distinct_experts(200_000, probs) == pytest.approx(256, abs=1e-3)
    assert routing.expected_distinct_experts(64, routing.inclusion_probabilities(256, 8)) < 0.9 * 256


def test_zipf_caps_the_favourite_at_every_token() -> None:
    probs = routing.inclusion_probabilities(8, 2, Routing.ZIPF, 1.5)
    assert probs[0] == 1.0 and probs[1] < 1.0
    assert math.fsum(probs) == pytest.approx(2)


def test_gini_of_zipf_grows_with_the_exponent() -> None:
    ginis = [routing.gini(routing.inclusion_probabilities(128, 8, Routing.ZIPF, s)) for s in (0.0, 0.5, 1.0)]
    assert ginis[0] == pytest.approx(0.0, abs=1e-12)
    assert ginis[0] < ginis[1] < ginis[2] < 1.0


# ----- the busiest expert-parallel group -------------------------------------------------------------------


def test_busiest_group_by_hand() -> None:
    # 2 of 8 experts in 2 groups of 4: both in one group with probability 2·C(4,2)/C(8,2) = 12/28.
    table = routing.busiest_group_table(8, 2)
    assert table[2] == pytest.approx(2 * 12 / 28 + 1 * 16 / 28)
    assert table[0] == 0.0 and table[8] == pytest.approx(4.0)
    assert routing.busiest_group_table(8, 1) == tuple(float(d) for d in range(9))


@pytest.mark.parametrize("experts,groups,touched", [(16, 4, 5), (256, 8, 8), (128, 2, 40)])
def test_busiest_group_matches_sampling(experts: int, groups: int, touched: int) -> None:
    rng = random.Random(3)
    per_group = experts // groups
    trials = 20000
    total = 0
    for _ in range(trials):
        chosen = rng.sample(range(experts), touched)
        counts = [0] * groups
        for e in chosen:
            counts[e // per_group] += 1
        total += max(counts)
    table = routing.busiest_group_table(experts, groups)
    assert table[touched] == pytest.approx(total / trials, rel=0.02)
    assert touched / groups <= table[touched] <= min(touched, per_group)


def test_dispatch_fanout() -> None:
    # One expert per token, one expert per GPU: the token leaves its GPU unless its expert is local.
    assert routing.dispatch_fanout(8, 1, 8, 8) == pytest.approx(7 / 8)
    # Many experts per token: nearly every other GPU, never more, and fewer than one copy per expert.
    fanout = routing.dispatch_fanout(256, 8, 8, 8)
    assert 7 * 0.6 < fanout < 7
    assert fanout < 8 * 7 / 8
    assert routing.dispatch_fanout(256, 8, 1, 8) == 0.0


# ----- the cost model ----------------------------------------------------------------------------------------

MOE_BLOCK: dict[str, Any] = {
    "num_experts": 8, "experts_per_token": 2, "num_moe_layers": 32, "expert_bytes": 2 * 3 * 4096 * 14336 * 32,
    "expert_weight_s": 2 * 3 * 4096 * 14336 * 32 / 3.84e12, "expert_per_token_s": 2e-5, "hidden_size": 4096,
}


def moe_profile(tp: int = 1, ep: int = 1, *, overlap: bool = False, buckets: tuple[int, ...] = (),
                **block: Any) -> Profile:
    comm = (CommModel(alpha_s=8e-6, bus_bandwidth_Bps=4.5e11, num_layers=32, hidden_size=4096) if tp > 1 else None)
    extra = {"all_to_all_alpha_s": 8e-6, "all_to_all_bandwidth_Bps": 3.4e11} if ep > 1 else {}
    moe = MoeCoefficients.model_validate({**MOE_BLOCK, "ep": ep, **extra, **block})
    return BASE.model_copy(update={"moe": moe, "tp": tp, "comm": comm, "overlap_host": overlap,
                                   "cuda_graph_batch_sizes": buckets})


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 600), ctx=st.integers(0, 10**6), steps=st.integers(1, 40),
       layout=st.sampled_from([(1, 1), (2, 1), (2, 2), (8, 8)]), overlap=st.booleans(), skew=st.booleans(),
       buckets=st.sampled_from([(), (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)]))
def test_every_path_gives_the_same_bits(batch: int, ctx: int, steps: int, layout: tuple[int, int], overlap: bool,
                                        skew: bool, buckets: tuple[int, ...]) -> None:
    tp, ep = layout
    block = {"routing": "zipf", "zipf_exponent": 1.0} if skew else {}
    model = CostModel(moe_profile(tp, ep, overlap=overlap, buckets=buckets, **block))
    one_by_one = [model.step_time(StepShape(batch, batch, batch, ctx + j * batch, 0, 0.0)) for j in range(steps)]
    fields = [model.time_of(batch, batch, batch, ctx + j * batch, 0, 0.0, 0) for j in range(steps)]
    assert one_by_one == fields
    fresh = CostModel(model.profile)  # nothing cached yet: the vectorised path works the term out itself
    assert one_by_one == fresh.decode_times(batch, ctx, steps).tolist()
    ends = StepEnds()
    ends.reset(CostModel(model.profile), batch, ctx, steps, 5.0)
    clock = 5.0
    for j, t in enumerate(one_by_one, start=1):
        clock += t
        assert ends.end(j) == clock
    if not overlap:
        assert CostModel(model.profile).decode_total_time(batch, ctx, steps) == pytest.approx(sum(one_by_one),
                                                                                              rel=1e-12)


def test_batch_one_decode_reads_the_active_experts() -> None:
    profile = moe_profile()
    moe = profile.moe
    assert moe is not None
    model = CostModel(profile)
    dense = CostModel(profile.model_copy(update={"moe": None}))
    shape = StepShape(1, 1, 1, 1000, 0, 0.0)
    expert_s = model.device_time(shape) - dense.device_time(shape)
    # The bandwidth term: k experts' bytes at the achieved bandwidth, not all E.
    assert expert_s == pytest.approx(moe.experts_per_token * moe.expert_weight_s, rel=1e-6)
    assert expert_s < moe.num_experts * moe.expert_weight_s / 3
    assert model._experts is not None and model._experts.read_by_busiest(1) == pytest.approx(2.0)


def test_large_batches_approach_all_experts() -> None:
    model = CostModel(moe_profile())
    reads = model._experts
    assert reads is not None
    d = [reads.distinct(n) for n in (1, 2, 4, 8, 16, 64)]
    assert d == sorted(d) and d[0] == pytest.approx(2) and d[-1] == pytest.approx(8, abs=1e-6)
    # Decode step time per sequence falls as the batch shares the expert reads.
    per_seq = [model.step_time(StepShape(b, b, b, 1000 * b, 0, 0.0)) / b for b in (1, 4, 16, 64)]
    assert per_seq == sorted(per_seq, reverse=True)


def test_expert_parallel_busiest_group_at_batch_one() -> None:
    ep8 = CostModel(moe_profile(8, 8, experts_per_token=2))
    reads = ep8._experts
    assert reads is not None
    # Two experts on two of eight GPUs (or both on one): the busiest GPU reads one whole expert.
    assert reads.read_by_busiest(1) == pytest.approx(1.0)
    assert reads.read_by_busiest(10**5) == pytest.approx(1.0)  # one expert per GPU, all of it


def test_all_to_all_grows_with_tokens_and_replaces_the_moe_allreduce() -> None:
    tp_only, ep = moe_profile(2, 1), moe_profile(2, 2)
    assert ep.moe is not None
    fixed, per_token = all_to_all_terms(ep.moe, 2)
    assert fixed == pytest.approx(2 * 32 * 8e-6) and per_token > 0
    fanout = routing.dispatch_fanout(8, 2, 2, 2)
    assert per_token == pytest.approx(64 * fanout * 4096 * 2 / 2 / 3.4e11)
    ep_model, tp_model = CostModel(ep), CostModel(tp_only)
    # All-reduces: 64 per step at ep 1 (attention and MoE), 32 at ep 2 (the MoE's became all-to-alls).
    assert tp_model._comm_fixed == pytest.approx(64 * 8e-6)
    assert ep_model._comm_fixed == pytest.approx(32 * 8e-6 + 64 * 8e-6)
    times = [ep_model.device_time(StepShape(1, n, 0, 0, n, 0.0)) for n in (256, 512, 1024, 2048)]
    assert times == sorted(times)


def test_reprice_scales_the_experts() -> None:
    profile = moe_profile()
    hw = load_hardware()["H200"]
    fp8 = at_dtypes(profile, hw, weight_dtype=WeightDtype.FP8)
    assert profile.moe is not None and fp8.moe is not None and hw.dense_fp8_flops is not None
    assert fp8.moe.expert_bytes == profile.moe.expert_bytes // 2
    assert fp8.moe.expert_weight_s == pytest.approx(profile.moe.expert_weight_s / 2)
    rate_ratio = hw.dense_fp8_flops / hw.dense_bf16_flops
    assert fp8.moe.expert_per_token_s == pytest.approx(profile.moe.expert_per_token_s / rate_ratio)


# ----- bad input ---------------------------------------------------------------------------------------------


def moe_data(tp: int = 1, **block: Any) -> dict[str, Any]:
    data = moe_profile().model_dump(mode="json")
    data["tp"] = tp
    data["moe"].update(block)
    return data


@pytest.mark.parametrize("block,tp,field,words", [
    ({"experts_per_token": 9}, 1, "moe.experts_per_token", "experts_per_token 9 exceeds num_experts 8"),
    ({"ep": 3, "all_to_all_bandwidth_Bps": 1e11}, 3, "moe.ep", "ep 3 does not divide num_experts 8"),
    ({"expert_bytes": -1}, 1, "moe.expert_bytes", "greater than or equal to 0"),
    ({"expert_weight_s": -0.1}, 1, "moe.expert_weight_s", "greater than or equal to 0"),
    ({"num_experts": 0}, 1, "moe.num_experts", "greater than or equal to 1"),
    ({"experts_per_tok": 2}, 1, "moe.experts_per_tok", "did you mean 'experts_per_token'"),
    ({"zipf_exponent": 1.0}, 1, "moe", "zipf_exponent applies to routing zipf only"),
    ({"ep": 2}, 2, "moe", "needs all_to_all_bandwidth_Bps"),
    ({"ep": 2, "all_to_all_bandwidth_Bps": 1e11}, 1, None, "moe.ep 2 does not divide tp 1"),
])
def test_bad_moe_block_is_one_line_naming_file_and_field(block: dict[str, Any], tp: int, field: str | None,
                                                         words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_profile(moe_data(tp, **block), file="profiles/bad.yaml")
    err = info.value
    assert err.file == "profiles/bad.yaml" and err.field == field
    assert words in err.message
    assert "\n" not in str(err) and str(err).startswith("profiles/bad.yaml")


def test_moe_with_a_measured_curve_is_refused() -> None:
    data = moe_data()
    data["device_s"]["token_curve"] = {"x": [1.0, 10.0], "y": [0.01, 0.02]}
    with pytest.raises(ConfigError, match="measured curve"):
        parse_profile(data, file="x.yaml")


def test_moe_profile_round_trips_through_yaml(tmp_path: Any) -> None:
    profile = moe_profile(8, 8, routing="zipf", zipf_exponent=0.7)
    path = profile.save(tmp_path / "m.yaml")
    again = load_profile(path)
    assert again == profile
    a, b = CostModel(profile), CostModel(again)
    shape = StepShape(3, 300, 2, 4000, 298, 298 * 150.0)
    assert a.step_time(shape) == b.step_time(shape)
    assert np.isfinite(a.step_time(shape))


# ----- a scenario's routing ----------------------------------------------------------------------------------

SCENARIO: dict[str, Any] = {
    "schema_version": 1, "name": "moe-routing",
    "workload": {"num_requests": 20, "arrival": {"process": "poisson", "rate_rps": 5},
                 "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 10}},
    "fleet": {"hardware": "H200", "model": "qwen3-30b-a3b", "tp": 1},
}


def test_scenario_sets_the_routing_of_an_moe_profile() -> None:
    from simulator.scenario import load_mapping, resolve_replica

    loaded = load_mapping(SCENARIO, ["fleet.expert_routing=zipf", "fleet.zipf_exponent=0.6"])
    moe = resolve_replica(loaded.scenario).profile.moe
    assert moe is not None and moe.routing is Routing.ZIPF and moe.zipf_exponent == 0.6
    plain = resolve_replica(load_mapping(SCENARIO).scenario).profile.moe
    assert plain is not None and plain.routing is Routing.UNIFORM


@pytest.mark.parametrize("overrides,field,words", [
    (["fleet.model=llama-3-8b", "fleet.expert_routing=uniform"], "fleet.expert_routing", "not a mixture of experts"),
    (["fleet.zipf_exponent=0.5"], "fleet", "zipf_exponent needs expert_routing zipf"),
    (["fleet.expert_routing=zipf"], "fleet.zipf_exponent", "needs fleet.zipf_exponent"),
    (["fleet.expert_routing=zipfian"], "fleet.expert_routing", "'uniform' or 'zipf'"),
])
def test_bad_scenario_routing_is_one_line(overrides: list[str], field: str, words: str) -> None:
    from simulator.scenario import load_mapping

    with pytest.raises(ConfigError) as info:
        load_mapping(SCENARIO, overrides)
    assert info.value.field == field and words in info.value.message
    assert "\n" not in str(info.value)


def test_all_to_all_is_priced_without_an_allreduce_model() -> None:
    profile = moe_profile(2, 2).model_copy(update={"comm": None})
    assert profile.moe is not None
    assert CostModel(profile)._comm_per_token == all_to_all_terms(profile.moe, 2)[1] > 0
