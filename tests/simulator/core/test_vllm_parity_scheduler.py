"""vLLM v1's scheduler tests, re-expressed against ``simulator.core.Scheduler`` with vLLM's expected values.

Each ``*_mirrors_vllm`` case names the vLLM test it replays: ``tests/v1/core/test_scheduler.py`` at
vllm-project/vllm 003df29 and ``tests/v1/core/test_async_scheduler.py`` at 014b235 (the commit the core's
async mode cites). The scenario and the numbers are vLLM's; the code is ours. Conventions:

- vLLM's ``create_scheduler`` defaults are kept (16 sequences, 8192 tokens, block size 16, 10000 blocks,
  ``max_model_len`` = the token budget, prefix caching on), except that vLLM's pool counts its null block, so
  vLLM's ``num_blocks=N`` is our ``num_blocks=N - 1``.
- vLLM's ``create_requests`` gives request ``i`` the prompt ``[i] * num_tokens`` (or ``[0] * num_tokens``
  with ``same_prompt``) and 16 output tokens; here request ``i`` names its prompt blocks by ``i`` (see
  ``_spec``), blocks holding output tokens by the request itself.
- vLLM's test loop is ``schedule()`` then ``update_from_output(...)``; ours is ``schedule()`` then
  ``update(plan, stopped_ids)``, the stopped ids standing for an EOS the model sampled.

What became of every test in those two files (and in ``tests/v1/core/sched/test_scheduler.py``):

============================================================  ==========================================
vLLM test                                                     here
============================================================  ==========================================
test_scheduler.py @ 003df29
test_add_requests                                             mirrored
test_finish_request, test_get_num_unfinished_requests         mirrored (one test; an external finish is
                                                              ``abort``)
test_schedule[APC off / APC on + prompt logprobs]             mirrored (prompt logprobs: n/a, they only
                                                              forbid a hit and these prompts have none)
test_async_scheduling_pp_allows_rescheduling_with_output_     mirrored (the core lets any number of steps
placeholders                                                  be in flight; the driver decides how many)
test_schedule_concurrent_partial_requests[APC on/off]         mirrored
test_stop_via_update_from_output                              partly mirrored: the EOS stop of case 1
                                                              (without the draft token); cases 2-4 need
                                                              speculative tokens, stop strings or
                                                              ignore_eos, decided by the engine: n/a
test_schedule_concurrent_batches                              deliberately different: vLLM's synchronous
                                                              Scheduler under pipeline parallelism; our
                                                              synchronous mode counts tokens computed in
                                                              ``update``, so steps overlap only in async
                                                              mode, where (as vLLM's AsyncScheduler) the
                                                              in-flight request's decode is scheduled too
test_schedule_order[chunked on/off]                           mirrored
test_preempt_during_execution                                 mirrored, with the overlap made by async
                                                              scheduling instead of a PP batch queue
test_preemption_re_records_prefix_cache_query                 mirrored for the hit-rate counters (vLLM
                                                              records the resumed lookup as "preempted",
                                                              outside its hit rate; fleetsim keeps no
                                                              preempted counters)
test_prefix_cache_stats_not_recorded_when_caching_disabled    deliberately different: fleetsim counts
                                                              admitted prompt tokens with caching off
                                                              too (the series' denominator)
test_prefix_cache_stats_counted_once_for_retried_then_        mirrored (a KV shortage refuses the first
scheduled_request                                             attempt instead of vLLM's spy)
test_scheduler_stats_waiting_queues                           partly mirrored (running and waiting
                                                              counts); skipped_waiting: n/a (connector)
test_memory_leak                                              mirrored
test_priority_scheduling_basic_ordering, _arrival_time_       mirrored (one test per vLLM test)
tiebreaker, _mixed_priority_and_arrival, _preemption,
_no_preemption_when_space_available, _preemption_victim_
selection, _equal_priority_preemption, _waiting_queue_order,
_fcfs_fallback, _with_limited_slots, _heap_property
test_priority_scheduling_preemption_and_resumption_when_      mirrored without the KV connector (none
out_of_kv[ec, v2 runner]                                      of its assertions involves it); the EC
                                                              connector and model-runner variants: n/a
test_scheduler_reset_prefix_cache                             n/a: an operator action (reset endpoint),
                                                              not a scheduling policy
test_make_scheduled_encoder_input_stats_output_embeddings,    n/a: multimodal / encoder inputs
test_scheduled_encoder_input_stats_disabled_without_
iteration_logging, _without_log_stats,
test_schedule_multimodal_requests, test_schedule_partial_
requests, test_no_mm_input_chunking, test_eagle3_mm_encoder_
cache_with_shift, test_free_encoder_inputs_respects_
unconfirmed_placeholders, _defers_for_eagle_lookahead,
_unchanged_without_spec_decode, test_encoder_cache_retained_
across_preemption_and_resume, test_encoder_cache_recomputed_
when_evicted_during_preemption
test_chunked_prefill_disabled_for_encoder_decoder,            n/a: encoder-decoder models
test_variable_length_cross_attn_block_allocation,
test_cross_attn_blocks_not_over_allocated, _not_under_
allocated, test_cross_attn_zero_blocks_without_encoder_
inputs
test_scheduler_publishes_eagle_blocks_after_worker_           n/a: EAGLE speculative decoding
acknowledgement, test_scheduler_does_not_publish_eagle_
blocks_without_worker_acknowledgement, test_connector_
finish_includes_partial_eagle_block
test_schedule_spec_decoding_stats, test_spec_decoding_stats_  n/a: speculative decoding
empty_output, test_no_spec_tokens_scheduled_for_prefill_
chunks, test_spec_decode_padding_first_decode_step,
_skipped_for_diffusion, _skipped_with_prefill_in_batch
test_check_stop_min_tokens                                    n/a: a sampling rule the engine applies
                                                              before it reports a stop
test_scheduler_stats_route_to_existing_output_client,         n/a: front-end plumbing and tokenizer
test_cached_request_data_resumed_all_token_ids_mrv1_only,     settings, not scheduling
test_schedule_skip_tokenizer_init
test_schedule_skip_tokenizer_init_structured_output_request,  n/a: structured output
test_grammar_compile_error_finishes_only_request,
test_abort_request_when_structured_output_fsm_cannot_advance,
test_remote_kv_promotion_keeps_fcfs_with_grammar_prefix
test_schedule_prefills_gating, test_throttle_prefills_        n/a: data-parallel prefill balancing
excludes_fully_transferred_remote_kv, _defers_remote_kv_      (``throttle_prefills``)
resume_with_local_prefill, test_throttle_defers_inflight_
prefill_chunk, test_throttle_capacity_bound_guard_admits
test_kv_connector_basic, test_external_prefix_cache_metrics,  n/a: KV connectors (P/D transfer,
test_kv_connector_unable_to_allocate, test_kv_connector_      offloading, external prefix hits)
handles_preemption, test_prefix_cache_query_not_inflated_by_
connector_defer, test_reset_connector_cache_no_connector_is_
no_op_success, test_prepend_skipped_requests_order, test_
fcfs_mixed_skipped_waiting_types_keep_order, test_abort_
request_waiting_for_remote_kvs, test_abort_request_finished_
recving, test_delayed_kv_connector_free_keeps_scheduler_
active, test_scheduler_kv_connector_stats, test_async_load_
reservation_prevents_wedge_e2e
test_scheduler_no_ec_connector_by_default, test_ec_connector_ n/a: encoder-cache connectors (E/P/D)
text_only_request, _cache_hit_external_load, _cache_miss_
computes_locally, _with_partial_cache_hit_multi_round,
_schedule_multiple_requests, _unable_to_allocate, test_
priority_scheduling_ec_connector_preemption_and_resumption,
test_ec_connector_allocate_encoder_tokens_with_external_
load, _ensure_cache_available_defers_request, _pending_
prefetch_only_checks_future_mm_features
test_hybrid_per_group_hit_divergence_with_connector,          n/a: hybrid (attention + Mamba) models
test_hybrid_per_group_hit_divergence_fa_deeper_no_external
sched/test_scheduler.py @ 2747ee8 (four SLA-tier tests:       n/a: SLA tiers are not an upstream vLLM
test_priority_queue_orders_by_sla_then_priority, _default_    scheduling option
behavior_when_sla_disabled, test_preemption_prefers_
background_with_same_priority, test_interactive_budget_
skip_condition)
test_async_scheduler.py @ 014b235
test_stop_by_max_tokens[1, 2, 3, 5]                           mirrored
test_abort                                                    mirrored
test_preempt                                                  mirrored by the test_abort mirror: vLLM's
                                                              body is the same abort scenario (preemption
                                                              with a token in flight is covered by the
                                                              test_preempt_during_execution mirror)
test_async_spec_placeholders_cleared_for_unscheduled_reqs     n/a: speculative decoding
test_prefix_caching_for_prefill_dedup                         mirrored
test_prefix_caching_for_multi_turn                            mirrored
test_abort_request_when_structured_output_fsm_cannot_advance  n/a: structured output
(vLLM's scheduler.py @ 003df29: a preempted request waits     xfail (strict):
until its stale output is delivered)                          test_preempted_request_waits_for_its_stale_
                                                              output
============================================================  ==========================================
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from simulator.core.config import QueuePolicy, SchedulerConfig
from simulator.core.request import Request, RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler
from simulator.core.step import StepPlan

BS = 16


def _scheduler(**knobs: Any) -> Scheduler:
    """vLLM's ``create_scheduler`` defaults (``max_model_len`` = the token budget unless given)."""
    base: dict[str, Any] = dict(num_blocks=10000 - 1, block_size=BS, max_num_seqs=16, max_num_batched_tokens=8192,
                                enable_prefix_caching=True)
    base.update(knobs)
    base.setdefault("max_model_len", base["max_num_batched_tokens"])
    return Scheduler(SchedulerConfig(**base))


def _priority_scheduler(**knobs: Any) -> Scheduler:
    """vLLM's ``create_scheduler_with_priority``: priority policy, prefix caching off."""
    return _scheduler(queue_policy=QueuePolicy.PRIORITY, enable_prefix_caching=False, **knobs)


def _spec(request_id: int, num_tokens: int = 10, max_tokens: int = 16, *, content: int | None = None,
          arrival_s: float = 0.0, priority: int = 0) -> RequestSpec:
    """A request as vLLM's ``create_requests`` makes it: prompt blocks named by ``content`` (the request's
    id unless given: ``same_prompt`` gives one content to all), blocks holding output tokens private."""
    content = request_id if content is None else content
    num_prompt_blocks = num_tokens // BS
    hashes = [content * 1_000 + k for k in range(num_prompt_blocks)]
    hashes += [(request_id + 1) * 1_000_000 + k for k in range(num_prompt_blocks, (num_tokens + max_tokens) // BS)]
    return RequestSpec(request_id, arrival_s, num_tokens, max_tokens, block_hashes=tuple(hashes), priority=priority)


def _scheduled(plan: StepPlan) -> dict[int, int]:
    """vLLM's ``num_scheduled_tokens``: request id -> new tokens, in plan order."""
    return {r.request_id: n for r, n in zip(plan.requests, plan.num_new_tokens, strict=True)}


# ----- test_scheduler.py ---------------------------------------------------------------------------------


def test_add_requests_mirrors_vllm() -> None:
    sched = _scheduler()
    for i in range(10):
        sched.add_request(_spec(i))
        assert i in sched.requests
        assert len(sched.waiting) == i + 1


def test_finish_request_mirrors_vllm() -> None:
    """test_finish_request and test_get_num_unfinished_requests: a finish from outside (an abort, a client
    that stopped) takes the request out of the queue and the unfinished count."""
    sched = _scheduler()
    for i in range(10):
        sched.add_request(_spec(i))
    for i in range(10):
        sched.abort(i)
        assert i not in sched.requests
        assert len(sched.waiting) == 9 - i
        assert len(sched.requests) == 10 - i - 1


@pytest.mark.parametrize("caching", [False, True])
def test_schedule_mirrors_vllm(caching: bool) -> None:
    sched = _scheduler(enable_prefix_caching=caching)
    requests = [sched.add_request(_spec(i)) for i in range(10)]
    plan = sched.schedule()
    assert plan.admitted_ids == list(range(10))
    assert _scheduled(plan) == {i: 10 for i in range(10)}
    assert len(sched.waiting) == 0
    assert sched.running == requests


def test_async_scheduling_pp_allows_rescheduling_with_output_placeholders_mirrors_vllm() -> None:
    sched = _scheduler(async_scheduling=True)
    request = sched.add_request(_spec(0, num_tokens=8))
    sched.schedule()
    assert request.num_output_placeholders > 0
    plan = sched.schedule()  # before any update: the request goes again, its sampled token in flight
    assert 0 in _scheduled(plan)


@pytest.mark.parametrize("caching", [True, False])
def test_schedule_concurrent_partial_requests_mirrors_vllm(caching: bool) -> None:
    sched = _scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400, enable_prefix_caching=caching)
    for i in range(3):
        sched.add_request(_spec(i, num_tokens=800))
    plan = sched.schedule()
    assert plan.admitted_ids == [0, 1, 2]
    assert _scheduled(plan) == {0: 400, 1: 400, 2: 1024 - 400 - 400}
    assert sched.update(plan) == []
    plan = sched.schedule()
    assert len(sched.running) == 3 and not plan.admitted_ids
    assert _scheduled(plan) == {0: 400, 1: 400, 2: 224}
    sched.update(plan)  # 0 and 1 finish their prompts and sample
    plan = sched.schedule()
    assert _scheduled(plan) == {0: 1, 1: 1, 2: 800 - 224 - 224}


def test_stop_via_update_from_output_mirrors_vllm() -> None:
    """Case 1 (stop on EOS): the request whose sampled token is EOS stops; the other keeps running."""
    sched = _scheduler()
    first, second = sched.add_request(_spec(0, max_tokens=10)), sched.add_request(_spec(1, max_tokens=10))
    plan = sched.schedule()
    finished = sched.update(plan, stopped_ids={0})
    assert finished == [first] and plan.finished_ids == [0]
    assert sched.running == [second]
    assert first.status is RequestStatus.FINISHED and 0 not in sched.requests
    assert first.num_output_tokens == 1 and second.num_output_tokens == 1


def test_schedule_concurrent_batches_is_async_here() -> None:
    """test_schedule_concurrent_batches, deliberately different. vLLM runs its synchronous Scheduler with
    two steps in flight (pipeline parallelism): request 0's 512-token prompt is in flight when request 1
    is scheduled, so the second step holds only request 1 (512 tokens), and request 0 decodes (1 token)
    once its output is in. fleetsim's synchronous mode counts a step's tokens computed in ``update``, so
    only async mode overlaps steps; there, as in vLLM's AsyncScheduler, request 0's next decode goes into
    the second step beside request 1's prompt, its input the token in flight."""
    sched = _scheduler(max_num_batched_tokens=1024, max_num_seqs=2, async_scheduling=True)
    sched.add_request(_spec(0, num_tokens=512))
    first = sched.schedule()
    assert _scheduled(first) == {0: 512}
    sched.add_request(_spec(1, num_tokens=512))
    second = sched.schedule()
    assert second.admitted_ids == [1]
    assert _scheduled(second) == {0: 1, 1: 512}
    sched.update(first)
    assert _scheduled(sched.schedule()) == {0: 1, 1: 1}


@pytest.mark.parametrize("chunked", [True, False])
def test_schedule_order_mirrors_vllm(chunked: bool) -> None:
    """Without chunked prefill a long prompt that does not fit waits, and the short ones behind it wait
    too: no skipping ahead although budget remains."""
    sched = _scheduler(max_num_batched_tokens=1024, max_num_seqs=3, enable_chunked_prefill=chunked)
    for i in range(2):
        sched.add_request(_spec(i, num_tokens=800))
    for i in range(2, 4):
        sched.add_request(_spec(i, num_tokens=10))
    plan = sched.schedule()
    assert len(plan.admitted_ids) == (2 if chunked else 1)


def test_preempt_during_execution_mirrors_vllm() -> None:
    """Two 80-token requests, 5 blocks each, fill the 10 blocks. The next step, scheduled while the first
    runs, needs a sixth block for request 0: request 1, the tail, is preempted with its sampled token
    still in flight, and that token is still delivered to it. (vLLM makes the overlap with a second
    pipeline stage and admits request 1 in the overlapping step; here async scheduling overlaps the steps
    and both prompts share the first one.)"""
    sched = _scheduler(max_num_batched_tokens=160, num_blocks=11 - 1, enable_prefix_caching=False,
                       async_scheduling=True)
    first, second = sched.add_request(_spec(0, num_tokens=80)), sched.add_request(_spec(1, num_tokens=80))
    in_flight = sched.schedule()
    assert _scheduled(in_flight) == {0: 80, 1: 80}
    assert len(first.block_table) == 5 and len(second.block_table) == 5
    plan = sched.schedule()
    assert plan.preempted_ids == [1]
    assert sched.running == [first] and second.status is RequestStatus.PREEMPTED
    sched.update(in_flight)
    assert second.num_output_tokens == 1  # the preempted request keeps the token sampled for it


def test_preemption_re_records_prefix_cache_query_mirrors_vllm() -> None:
    """The hit-rate counters count a request's lookup at its first admission only: a preempted request's
    lookup on resume is not a new query (vLLM files it under ``preempted_requests``, outside the rate)."""
    sched = _scheduler(num_blocks=4)
    sched.add_request(_spec(0, num_tokens=32))
    victim = sched.add_request(_spec(1, num_tokens=31))
    sched.update(sched.schedule())  # both prompts: 4 blocks, the pool is full
    assert sched.kv.num_lookup_tokens == 32 + 31
    plan = sched.schedule()  # request 0's 33rd token needs a third block: the tail is preempted
    assert plan.preempted_ids == [1]
    while sched.has_work:
        sched.update(sched.schedule())
    assert victim.num_preemptions == 1 and victim.status is RequestStatus.FINISHED
    assert sched.kv.num_lookup_tokens == 32 + 31


def test_prefix_cache_stats_with_caching_disabled_differs() -> None:
    """test_prefix_cache_stats_not_recorded_when_caching_disabled, deliberately different: with prefix
    caching off vLLM records no lookup (queries 0); fleetsim still counts the admitted prompt tokens, the
    denominator of its hit-rate series, so its rate reads 0 rather than undefined. Hits are 0 in both."""
    sched = _scheduler(enable_prefix_caching=False)
    for i in range(2):
        sched.add_request(_spec(i))
    sched.schedule()
    assert sched.kv.num_hit_tokens == 0
    assert sched.kv.num_lookup_tokens == 2 * 10


def test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request_mirrors_vllm() -> None:
    """A request with a real prefix hit that the KV manager refuses once and admits on the next step is
    counted once, hits included. (vLLM refuses the first attempt with a spy on ``allocate_slots``; here a
    request ahead of it leaves too few free blocks: its two hit blocks are free, and taking them and a new
    block needs three.)"""
    sched = _scheduler(num_blocks=8, enable_chunked_prefill=False)
    sched.add_request(_spec(0, num_tokens=2 * BS, max_tokens=2, content=0))
    while sched.has_work:
        sched.update(sched.schedule())
    blocker = sched.add_request(_spec(1, num_tokens=90, max_tokens=1))  # 6 blocks: all but the 2 cached ones
    retried = sched.add_request(_spec(2, num_tokens=3 * BS, max_tokens=1, content=0))
    lookups, hits = sched.kv.num_lookup_tokens, sched.kv.num_hit_tokens
    plan = sched.schedule()
    assert plan.admitted_ids == [1] and retried.status is RequestStatus.WAITING
    assert (sched.kv.num_lookup_tokens - lookups, sched.kv.num_hit_tokens - hits) == (90, 0)
    sched.update(plan)
    assert blocker.status is RequestStatus.FINISHED
    plan = sched.schedule()
    assert plan.admitted_ids == [2] and _scheduled(plan) == {2: BS}
    assert (sched.kv.num_lookup_tokens - lookups, sched.kv.num_hit_tokens - hits) == (90 + 3 * BS, 2 * BS)


def test_scheduler_stats_waiting_queues_mirrors_vllm() -> None:
    """The part without a connector: a 100-token budget takes two 50-token prompts, the third waits."""
    sched = _scheduler(max_num_batched_tokens=100)
    for i in range(3):
        sched.add_request(_spec(i, num_tokens=50))
    plan = sched.schedule()
    assert len(plan.admitted_ids) == 2
    assert (sched.num_running, len(sched.waiting)) == (2, 1)


def test_memory_leak_mirrors_vllm() -> None:
    sched = _scheduler()
    for i in range(5):
        sched.add_request(_spec(i, num_tokens=10, max_tokens=10))
        sched.update(sched.schedule())
    while True:
        plan = sched.schedule()
        if not sched.running:
            break
        sched.update(plan)
    assert not sched.requests and not sched.waiting and not sched.running
    assert not sched.kv.req_blocks
    assert sched.kv.num_free_blocks == sched.kv.pool.num_blocks
    assert not any(sched.kv.pool.ref_cnt)


# ----- priority scheduling (test_scheduler.py) ----------------------------------------------------------


def _add_priority(sched: Scheduler, priorities: list[int], arrivals: list[float] | None = None,
                  num_tokens: int = 10, first_id: int = 0) -> list[Request]:
    """vLLM's ``create_requests_with_priority``: arrival ``i`` unless given."""
    arrivals = [float(i) for i in range(len(priorities))] if arrivals is None else arrivals
    return [sched.add_request(_spec(first_id + i, num_tokens, arrival_s=arrivals[i], priority=priorities[i]))
            for i in range(len(priorities))]


def test_priority_scheduling_basic_ordering_mirrors_vllm() -> None:
    sched = _priority_scheduler()
    _add_priority(sched, [2, 0, 1], [1.0, 2.0, 3.0])
    assert sched.schedule().admitted_ids == [1, 2, 0]


def test_priority_scheduling_arrival_time_tiebreaker_mirrors_vllm() -> None:
    sched = _priority_scheduler()
    _add_priority(sched, [1, 1, 1], [3.0, 1.0, 2.0])
    assert sched.schedule().admitted_ids == [1, 2, 0]


def test_priority_scheduling_mixed_priority_and_arrival_mirrors_vllm() -> None:
    sched = _priority_scheduler()
    _add_priority(sched, [2, 1, 1, 0], [1.0, 3.0, 2.0, 4.0])
    assert sched.schedule().admitted_ids == [3, 2, 1, 0]


def test_priority_scheduling_preemption_mirrors_vllm() -> None:
    """5 blocks of 16. lo1 (priority 5, 32 tokens) runs and decodes; hi1 (priority 0, 32 tokens) is admitted
    as lo1 takes its third block: the pool is full. When hi1 needs a third block, the least urgent running
    request, lo1, is preempted, although it runs ahead of hi1."""
    sched = _priority_scheduler(max_num_seqs=3, max_num_batched_tokens=200, num_blocks=6 - 1)
    (lo1,) = _add_priority(sched, [5], [1.0], num_tokens=2 * BS)
    plan = sched.schedule()
    assert plan.admitted_ids == [0]
    sched.update(plan)
    (hi1,) = _add_priority(sched, [0], [2.0], num_tokens=2 * BS, first_id=1)
    plan = sched.schedule()
    assert plan.admitted_ids == [1] and sched.num_running == 2 and sched.kv.num_free_blocks == 0
    sched.update(plan)
    plan = sched.schedule()
    assert plan.preempted_ids == [0] and lo1.status is RequestStatus.PREEMPTED
    assert sched.running == [hi1] and _scheduled(plan) == {1: 1}


def test_priority_scheduling_no_preemption_when_space_available_mirrors_vllm() -> None:
    sched = _priority_scheduler(max_num_seqs=3, max_num_batched_tokens=200)
    _add_priority(sched, [5, 5], [1.0, 2.0], num_tokens=30)
    sched.update(sched.schedule())
    _add_priority(sched, [0], [3.0], num_tokens=30, first_id=2)
    plan = sched.schedule()
    assert plan.admitted_ids == [2] and not plan.preempted_ids
    assert (sched.num_running, len(sched.waiting)) == (3, 0)


@pytest.mark.parametrize(("vllm_test", "priorities", "arrivals", "max_num_seqs", "admitted", "waiting"), [
    ("test_priority_scheduling_preemption_victim_selection", [3, 2, 0], [1.0, 2.0, 3.0], 1, [2], [1, 0]),
    ("test_priority_scheduling_equal_priority_preemption", [2, 2, 2], [3.0, 1.0, 2.0], 1, [1], [2, 0]),
    ("test_priority_scheduling_waiting_queue_order", [3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0], 1, [3], [1, 2, 0]),
    ("test_priority_scheduling_fcfs_fallback", [1, 1, 1, 1], [4.0, 1.0, 3.0, 2.0], 16, [1, 3, 2, 0], []),
    ("test_priority_scheduling_with_limited_slots", [3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0], 2, [3, 1], [2, 0]),
])
def test_priority_queue_order_mirrors_vllm(vllm_test: str, priorities: list[int], arrivals: list[float],
                                           max_num_seqs: int, admitted: list[int], waiting: list[int]) -> None:
    """The vLLM test named by the parameter: admission and waiting-queue order by (priority, arrival)
    when ``max_num_seqs`` holds some requests back."""
    sched = _priority_scheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=1000)
    _add_priority(sched, priorities, arrivals)
    assert sched.schedule().admitted_ids == admitted
    assert [r.request_id for r in sched.waiting] == waiting


def test_priority_scheduling_heap_property_mirrors_vllm() -> None:
    """One request at a time, each finished after its first step: they run in priority order."""
    priorities = [5, 1, 8, 3, 2, 7, 4, 6]
    sched = _priority_scheduler(max_num_seqs=1)
    _add_priority(sched, priorities)
    order = []
    while sched.waiting:
        plan = sched.schedule()
        if plan.admitted_ids:
            (request_id,) = plan.admitted_ids
            order.append(priorities[request_id])
            sched.update(plan, stopped_ids={request_id})
    assert order == sorted(priorities)


def test_priority_scheduling_preemption_and_resumption_when_out_of_kv_mirrors_vllm() -> None:
    """4 blocks of 16. The low-priority request (30 tokens) runs; the high-priority one (32 tokens) is
    admitted beside it and the pool is full. Its 33rd token needs a block: the low one is preempted, and
    once the high one finishes it resumes with its 30 prompt tokens and 2 outputs, all recomputed."""
    sched = _priority_scheduler(max_num_seqs=2, max_num_batched_tokens=200, num_blocks=5 - 1)
    (low,) = _add_priority(sched, [1], [0.0], num_tokens=30)
    plan = sched.schedule()
    assert plan.admitted_ids == [0] and (sched.num_running, len(sched.waiting)) == (1, 0)
    sched.update(plan)
    (high,) = _add_priority(sched, [0], [1.0], num_tokens=32, first_id=1)
    plan = sched.schedule()
    assert sched.kv.num_free_blocks == 0
    assert plan.admitted_ids == [1] and _scheduled(plan) == {0: 1, 1: 32}
    sched.update(plan)
    plan = sched.schedule()
    assert not plan.admitted_ids and _scheduled(plan) == {1: 1}
    assert low.status is RequestStatus.PREEMPTED and (sched.num_running, len(sched.waiting)) == (1, 1)
    sched.update(plan)
    sched.abort(high.request_id)  # vLLM: finish_requests(FINISHED_STOPPED)
    plan = sched.schedule()
    assert (sched.num_running, len(sched.waiting)) == (1, 0)
    assert plan.admitted_ids == [0] and _scheduled(plan) == {0: 30 + 2}
    assert low.num_tokens == 32


# ----- test_async_scheduler.py ---------------------------------------------------------------------------


def _drain(sched: Scheduler, in_flight: deque[StepPlan], before_each: list[int] | None = None) -> int:
    """vLLM's async test loop: take the oldest plan in flight, deliver its output, schedule the next (kept
    when it schedules anything). ``before_each``: request ids aborted one per turn, before the output.
    Returns the tokens of the plans whose output was delivered."""
    total = 0
    while in_flight:
        if before_each:
            sched.abort(before_each.pop(0))
        plan = in_flight.popleft()
        total += sum(plan.num_new_tokens)
        sched.update(plan)
        queued = sched.schedule()
        if queued.requests:
            in_flight.append(queued)
    return total


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_stop_by_max_tokens_mirrors_vllm(max_tokens: int) -> None:
    """No step is scheduled past a request's last token: every token run is a prompt token or feeds an
    output (prompt + max_tokens - 1 per request), although each step is scheduled before the previous
    one's output is known."""
    sched = _scheduler(async_scheduling=True)
    first = sched.add_request(_spec(0, max_tokens=max_tokens))
    in_flight = deque([sched.schedule()])
    second = sched.add_request(_spec(1, max_tokens=max_tokens))
    in_flight.append(sched.schedule())
    total = _drain(sched, in_flight)
    assert not sched.requests
    assert first.num_output_tokens == second.num_output_tokens == max_tokens
    assert total == 2 * (10 + max_tokens - 1)


def test_abort_mirrors_vllm() -> None:
    """test_abort (and test_preempt, whose body is the same): ten requests, two steps in flight, one aborted
    per turn before the oldest step's output comes in: the aborted one gets nothing from it, so request k
    ends with as many outputs as there were turns before its abort."""
    sched = _scheduler(async_scheduling=True)
    requests = [sched.add_request(_spec(i, max_tokens=20)) for i in range(10)]
    in_flight = deque([sched.schedule(), sched.schedule()])
    abort_order = [0, 8, 3, 1, 6, 4, 2, 5, 7, 9]
    _drain(sched, in_flight, before_each=list(abort_order))
    for i, request in enumerate(requests):
        assert request.status is RequestStatus.FINISHED
        assert request.num_output_tokens == abort_order.index(i)


def test_prefix_caching_for_prefill_dedup_mirrors_vllm() -> None:
    """Two requests with the same 100-token prompt in one step: the second hits the first's six full
    blocks, indexed as they were allocated, and computes only the last 4 tokens; so does each later one."""
    num_prompt = 100
    sched = _scheduler(async_scheduling=True, max_num_batched_tokens=1000)
    specs = [_spec(i, num_tokens=num_prompt, max_tokens=3, content=0) for i in range(5)]
    sched.add_request(specs[0])
    sched.add_request(specs[1])
    plan = sched.schedule()
    assert _scheduled(plan) == {0: num_prompt, 1: num_prompt % BS}
    in_flight = deque([plan, sched.schedule()])
    waiting = deque(specs[2:])
    while in_flight:
        added = sched.add_request(waiting.popleft()) if waiting else None
        sched.update(in_flight.popleft())
        plan = sched.schedule()
        if plan.requests:
            in_flight.append(plan)
            if added is not None:
                assert _scheduled(plan)[added.request_id] == num_prompt % BS
    assert not sched.requests


def test_prefix_caching_for_multi_turn_mirrors_vllm() -> None:
    """Five 100-token prompts with 200 outputs each, run to completion; the next turn's prompts are the
    previous prompt plus its answer (300 tokens): each hits the 18 full blocks of prompt and output the
    previous turn cached, indexed as its sampled tokens arrived, and computes the last 12 tokens."""
    num_prompt, num_output = 100, 200
    sched = _scheduler(async_scheduling=True, max_num_batched_tokens=1000)
    turn1 = [_spec(i, num_tokens=num_prompt, max_tokens=num_output) for i in range(5)]
    for spec in turn1:
        sched.add_request(spec)
    _drain(sched, deque([sched.schedule(), sched.schedule()]))
    assert not sched.requests
    num_history = num_prompt + num_output
    for i, spec in enumerate(turn1):  # the history's block hashes, then the new answer's
        extra = tuple((i + 11) * 1_000_000 + k for k in range(num_history // BS, (num_history + num_output) // BS))
        sched.add_request(RequestSpec(10 + i, 0.0, num_history, num_output, block_hashes=spec.block_hashes + extra))
    plan = sched.schedule()
    assert _scheduled(plan) == {10 + i: num_history % BS for i in range(5)}


@pytest.mark.xfail(strict=True, reason=(
    "fleetsim readmits a preempted request while a step that sampled for it is still in flight; the stale "
    "token then arrives while it runs again and is taken for the recomputation's own sample (two outputs "
    "from one position, one step fewer than vLLM runs). vLLM "
    "(scheduler.py at 003df29, the waiting loop's num_stale_output_tokens check) skips such a request "
    "until its stale output is delivered and admits the ones behind it. Only a driver with three or "
    "more steps in flight (pipeline parallelism) can reach it: fleetsim's engine and replicas keep at "
    "most two, and the fix reshapes the admission loop."))
def test_preempted_request_waits_for_its_stale_output() -> None:
    """vLLM's rule behind test_preempt_during_execution with a deeper pipeline: three 32-token requests fill
    6 blocks; the step scheduled while the first runs preempts the tail (c) with its token in flight; an
    abort frees room; the next step, scheduled before that token comes in, must not take c back."""
    sched = _scheduler(num_blocks=6, enable_prefix_caching=False, async_scheduling=True)
    a, b, c = (sched.add_request(_spec(i, num_tokens=2 * BS)) for i in range(3))
    plans = deque([sched.schedule()])
    plans.append(sched.schedule())
    assert plans[1].preempted_ids == [2]
    sched.abort(a.request_id)
    plans.append(sched.schedule())  # a third step in flight: c's stale token has not come in
    assert _scheduled(plans[2]) == {1: 1}
    while plans:
        sched.update(plans.popleft())
        queued = sched.schedule()
        if queued.requests:
            plans.append(queued)
    assert b.status is RequestStatus.FINISHED and c.status is RequestStatus.FINISHED
    assert c.num_output_tokens == 16 and c.num_output_placeholders == 0
