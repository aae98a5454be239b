"""Speculative decoding in the core: proposals scheduled with slots, rejected ones rolled back, KV conserved."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.config import Batching, KVPolicy, Preemption, SchedulerConfig
from simulator.core.mix import splitmix64
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler
from simulator.core.speculation import Speculation, expected_tokens


def spec(k: int, rate: float = 0.5, seed: int = 0) -> Speculation:
    return Speculation(num_speculative_tokens=k, acceptance_rates=(rate,) * k, seed=seed)


def test_a_decode_is_scheduled_with_its_proposals_and_rolled_back_by_the_rejected() -> None:
    sched = Scheduler(SchedulerConfig(num_blocks=16, block_size=4, speculation=spec(3)))
    request = sched.add_request(RequestSpec(0, 0.0, 4, 10))
    prefill = sched.schedule()
    assert prefill.num_new_tokens == [4] and prefill.num_spec_tokens == [0]
    sched.update(prefill, accepted=[0])
    assert request.num_output_tokens == 1 and request.num_computed_tokens == 4
    verify = sched.schedule()
    assert verify.num_new_tokens == [4] and verify.num_spec_tokens == [3]  # 1 + k slots
    assert len(request.block_table) == 2  # 4 + 4 tokens
    sched.update(verify, accepted=[1])
    # One proposal accepted plus the verifier's token; two rejected: computed falls back by 2.
    assert request.num_output_tokens == 3 and request.num_computed_tokens == 6
    assert len(request.block_table) == 2  # the rejected slots stay as the next step's proposal slots
    assert sched.num_draft_tokens == 3 and sched.num_accepted_tokens == 1 and sched.num_spec_rows == 1


def test_proposals_stop_short_of_the_last_output() -> None:
    sched = Scheduler(SchedulerConfig(num_blocks=16, block_size=4, speculation=spec(4)))
    request = sched.add_request(RequestSpec(0, 0.0, 4, 3))
    sched.update(sched.schedule(), accepted=[0])
    plan = sched.schedule()
    assert plan.num_spec_tokens == [1]  # 2 outputs left: one proposal plus the verifier's token
    finished = sched.update(plan, accepted=[1])
    assert finished == [request] and request.num_output_tokens == 3
    assert sched.kv.pool.num_used == 0


def test_update_needs_the_accepted_counts() -> None:
    sched = Scheduler(SchedulerConfig(num_blocks=16, block_size=4, speculation=spec(2)))
    sched.add_request(RequestSpec(0, 0.0, 4, 8))
    sched.update(sched.schedule(), accepted=[0])
    plan = sched.schedule()
    with pytest.raises(ValueError, match="accepted count"):
        sched.update(plan)
    with pytest.raises(ValueError, match="3 accepted of 2"):
        sched.update(plan, accepted=[3])


def test_speculation_takes_the_step_by_step_path() -> None:
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=4, speculation=spec(2)))
    for rid in range(3):
        sched.add_request(RequestSpec(rid, 0.0, 4, 20))
    sched.update(sched.schedule(), accepted=[0, 0, 0])
    assert sched.steady_decode_steps() == 0


def test_speculation_refuses_async_scheduling_and_other_batching() -> None:
    with pytest.raises(ValueError, match="speculation needs chunked batching and synchronous"):
        SchedulerConfig(num_blocks=4, async_scheduling=True, speculation=spec(2))
    with pytest.raises(ValueError, match="speculation needs chunked"):
        SchedulerConfig(num_blocks=4, batching=Batching.CONTINUOUS, speculation=spec(2))


@pytest.mark.parametrize(("k", "rates"), [(0, ()), (2, (0.5,)), (2, (0.5, 1.5)), (1, (-0.1,))])
def test_bad_speculation_is_refused(k: int, rates: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        Speculation(num_speculative_tokens=k, acceptance_rates=rates)


def test_draws_are_keyed_and_follow_the_rates() -> None:
    model = spec(4, 0.7, seed=3)
    draws = [model.num_accepted(rid, outputs, 4) for rid in range(200) for outputs in range(20)]
    assert draws == [model.num_accepted(rid, outputs, 4) for rid in range(200) for outputs in range(20)]
    assert draws != [spec(4, 0.7, seed=4).num_accepted(rid, o, 4) for rid in range(200) for o in range(20)]
    mean = 1 + sum(draws) / len(draws)
    assert mean == pytest.approx(expected_tokens(0.7, 4), rel=0.03)
    assert model.expected_tokens_per_step == pytest.approx(expected_tokens(0.7, 4))
    assert {spec(3, 1.0).num_accepted(r, 0, 3) for r in range(50)} == {3}
    assert {spec(3, 0.0).num_accepted(r, 0, 3) for r in range(50)} == {0}
    # Fewer proposals see the same leading draws: a truncated draft accepts a prefix of the full one.
    assert all(model.num_accepted(r, 5, 2) == min(2, model.num_accepted(r, 5, 4)) for r in range(200))


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), request_id=st.integers(0, 2**62), outputs=st.integers(0, 2**40),
       k=st.integers(1, 8), rate=st.floats(0.0, 1.0))
def test_the_draws_on_halves_are_the_draws_on_big_ints(seed: int, request_id: int, outputs: int, k: int,
                                                       rate: float) -> None:
    """Compiled, the draws run on 32-bit halves; interpreted, on Python ints: the same count for any key, and
    the formula ``num_accepted`` documents (leading draws below their rates)."""
    model = spec(k, rate, seed=seed)
    on_halves = model.accepted_on_halves(request_id, outputs, k)
    assert on_halves == model.accepted_on_big_ints(request_id, outputs, k) == model.num_accepted(request_id, outputs, k)
    base = splitmix64(splitmix64(seed * 0x9E3779B97F4A7C15 + request_id) + outputs)
    below = [(splitmix64(base + i) >> 11) / 2**53 < rate for i in range(k)]
    assert on_halves == [*below, False].index(False)


configs = st.builds(
    SchedulerConfig,
    num_blocks=st.integers(8, 40),
    block_size=st.sampled_from([1, 2, 4, 8]),
    kv_policy=st.sampled_from(list(KVPolicy)),
    preemption=st.sampled_from(list(Preemption)),
    max_num_seqs=st.integers(1, 8),
    max_num_batched_tokens=st.integers(4, 48),
    long_prefill_token_threshold=st.sampled_from([0, 3]),
    max_model_len=st.integers(24, 96),
    enable_prefix_caching=st.booleans(),
    num_host_blocks=st.sampled_from([0, 8, 64]),
    speculation=st.builds(spec, st.integers(1, 5), st.floats(0.0, 1.0)),
)

requests = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 20), st.integers(0, 3)), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(config=configs, reqs=requests, data=st.data())
def test_kv_is_conserved_and_every_request_gets_exactly_its_outputs(
        config: SchedulerConfig, reqs: list[tuple[int, int, int]], data: st.DataObject) -> None:
    sched = Scheduler(config)
    bs = config.block_size
    assert config.speculation is not None
    k = config.speculation.num_speculative_tokens
    pending = list(enumerate(reqs))
    added = {}
    for _ in range(2000):
        if not (pending or sched.has_work):
            break
        if pending:
            rid, (prompt, output, family) = pending.pop(0)
            hashes = tuple(family * 100 + i for i in range((prompt + output) // bs))
            added[rid] = sched.add_request(RequestSpec(rid, float(rid), prompt, output, block_hashes=hashes))
        plan = sched.schedule()
        assert plan.num_spec_tokens is not None
        assert sum(plan.num_new_tokens) <= config.max_num_batched_tokens
        accepted = []
        for r, n, p, s in zip(plan.requests, plan.num_new_tokens, plan.num_computed_tokens, plan.num_spec_tokens,
                              strict=True):
            assert 0 <= s <= k and p + n == r.num_tokens + s if s else p + n <= r.num_tokens
            assert r.num_output_tokens + 1 + s <= r.max_output_tokens or s == 0
            assert len(r.block_table) * bs >= p + n, "no slot for a proposal"
            accepted.append(data.draw(st.integers(0, s)) if s else 0)
        outputs_before = {r.request_id: r.num_output_tokens for r in plan.requests}
        sched.update(plan, accepted=accepted)
        for r, s, a in zip(plan.requests, plan.num_spec_tokens, accepted, strict=True):
            if s:
                assert r.num_output_tokens == min(outputs_before[r.request_id] + 1 + a, r.max_output_tokens)
                if r.status is RequestStatus.RUNNING:
                    assert r.num_computed_tokens == r.num_tokens - 1
        pool = sched.kv.pool
        assert pool.num_free + sum(1 for c in pool.ref_cnt if c > 0) == pool.num_blocks
        held = sum(len(r.block_table) for r in sched.running)
        assert sum(pool.ref_cnt) == held, "blocks held by nobody or by two requests"
        for r in sched.running:
            assert len(r.block_table) * bs >= r.num_computed_tokens
            assert r.num_indexed_blocks * bs <= r.num_tokens, "a block with a proposal in the prefix cache"
    else:
        pytest.fail("the run did not drain")
    for r in added.values():
        if r.status is not RequestStatus.REJECTED:
            assert r.status is RequestStatus.FINISHED
            assert r.num_output_tokens == r.max_output_tokens
    assert sched.kv.pool.num_used == 0
    assert sched.num_accepted_tokens <= sched.num_draft_tokens
