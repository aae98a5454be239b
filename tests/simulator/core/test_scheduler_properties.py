"""Scheduler properties over random request streams, every policy combination."""

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.config import Batching, KVPolicy, Preemption, QueuePolicy, SchedulerConfig
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler

configs = st.builds(
    SchedulerConfig,
    num_blocks=st.integers(6, 40),
    block_size=st.sampled_from([1, 2, 4, 8]),
    batching=st.sampled_from(list(Batching)),
    kv_policy=st.sampled_from(list(KVPolicy)),
    preemption=st.sampled_from(list(Preemption)),
    queue_policy=st.sampled_from(list(QueuePolicy)),
    max_num_seqs=st.integers(1, 8),
    max_num_batched_tokens=st.integers(4, 48),
    long_prefill_token_threshold=st.sampled_from([0, 3]),
    max_model_len=st.integers(16, 96),
    enable_prefix_caching=st.booleans(),
    enable_chunked_prefill=st.booleans(),
    num_host_blocks=st.sampled_from([0, 8, 64]),
    waiting_served_ratio=st.sampled_from([0.0, 0.5]),
    max_waiting_steps=st.sampled_from([0, 3]),
)

requests = st.lists(
    st.tuples(st.integers(1, 40), st.integers(1, 20), st.integers(0, 3), st.integers(0, 2), st.integers(0, 4)),
    min_size=1, max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(config=configs, reqs=requests)
def test_random_streams_keep_every_promise(config: SchedulerConfig, reqs: list[tuple[int, ...]]) -> None:
    sched = Scheduler(config)
    bs = config.block_size
    added = {}
    pending = list(enumerate(reqs))
    produced: dict[int, int] = {}
    step = 0
    while pending or sched.has_work:
        # Arrivals trickle in between steps: two per step.
        for _ in range(2):
            if pending:
                rid, (prompt, output, family, priority, _) = pending.pop(0)
                hashes = tuple(family * 100 + i for i in range((prompt + output) // bs))
                added[rid] = sched.add_request(
                    RequestSpec(rid, float(rid), prompt, output, block_hashes=hashes, priority=priority))
        running_before = list(sched.running)
        plan = sched.schedule()
        ids = [r.request_id for r in plan.requests]
        assert len(ids) == len(set(ids)), "a request scheduled twice in one step"
        assert len(ids) <= config.max_num_seqs
        whole_prompt_alone = len(ids) == 1 and config.batching is not Batching.CHUNKED
        no_chunk_alone = len(ids) == 1 and not config.enable_chunked_prefill
        assert sum(plan.num_new_tokens) <= config.max_num_batched_tokens or whole_prompt_alone or no_chunk_alone
        assert all(n >= 1 for n in plan.num_new_tokens)
        if config.kv_policy is not KVPolicy.PAGED:
            assert not plan.preempted_ids, "reserve/contiguous must never preempt"
        if config.batching is Batching.STATIC and running_before:
            assert set(ids) <= {r.request_id for r in running_before}, "static admitted into a running batch"
        if plan.preempted_ids and config.queue_policy is QueuePolicy.FCFS:
            # FCFS victims are taken from the tail of running, most recently admitted first.
            order = [r.request_id for r in running_before]
            victims = [v for v in plan.preempted_ids if v in order]
            assert victims == list(reversed(order))[: len(victims)]
        if plan.preempted_ids:
            assert not plan.admitted_ids or config.batching is not Batching.CHUNKED
        for r, n, p in zip(plan.requests, plan.num_new_tokens, plan.num_computed_tokens, strict=True):
            assert p + n <= r.num_tokens
        finished = sched.update(plan)
        for r in finished:
            produced[r.request_id] = r.num_output_tokens
        pool = sched.kv.pool
        assert pool.num_free + sum(1 for r in pool.ref_cnt if r > 0) == pool.num_blocks
        held = sum(len(sched.kv.req_blocks.get(r.request_id, [])) for r in sched.running)
        assert sum(pool.ref_cnt) == held
        assert sched.num_waiting == len(sched.waiting) + len(sched.swapped)  # the router's load signal
        step += 1
        assert step < 5000, "no progress: a request can never finish"
    rejected = {rid for rid, r in added.items() if r.status is RequestStatus.REJECTED}
    assert set(produced) | rejected == set(added), "a request was lost"
    for rid, count in produced.items():
        assert count == reqs[rid][1], "every finished request produced exactly its output tokens"
    assert sched.kv.pool.num_free == config.num_blocks, "blocks leaked"
    assert sched.num_host_blocks_used == 0


def test_priority_preempts_the_least_urgent() -> None:
    config = SchedulerConfig(num_blocks=6, block_size=4, queue_policy=QueuePolicy.PRIORITY,
                             max_num_batched_tokens=64, enable_prefix_caching=False)
    sched = Scheduler(config)
    sched.add_request(RequestSpec(0, 0.0, 8, 8, priority=5))   # least urgent, admitted first
    sched.add_request(RequestSpec(1, 1.0, 8, 8, priority=0))
    sched.add_request(RequestSpec(2, 2.0, 4, 8, priority=1))
    victims = []
    while sched.has_work:
        plan = sched.schedule()
        victims += plan.preempted_ids
        sched.update(plan)
    assert victims and victims[0] == 0


def test_paging_admits_more_and_wastes_only_the_tail() -> None:
    """The fragmentation the naive allocator pays, measured on one stream under both policies."""
    specs = [RequestSpec(i, 0.0, 20 + (i * 37) % 200, 10 + (i * 53) % 120) for i in range(200)]
    results = {}
    for policy in (KVPolicy.CONTIGUOUS, KVPolicy.PAGED):
        config = SchedulerConfig(num_blocks=512, block_size=16, kv_policy=policy, max_model_len=2048,
                                 max_num_seqs=256, max_num_batched_tokens=4096, enable_prefix_caching=False)
        sched = Scheduler(config)
        for spec in specs:
            sched.add_request(spec)
        peak, waste, beyond_tail = 0, [], []
        while sched.has_work:
            plan = sched.schedule()
            sched.update(plan)
            stats = sched.kv_stats()
            peak = max(peak, len(sched.running))
            if stats.num_used_blocks:
                waste.append(stats.waste_frac)
                beyond_tail.append(stats.waste_beyond_tail_frac)
        results[policy] = (peak, sum(waste) / len(waste), max(beyond_tail))
    contiguous, paged = results[KVPolicy.CONTIGUOUS], results[KVPolicy.PAGED]
    assert paged[0] > contiguous[0], results
    assert paged[2] < 0.05, results          # nothing wasted beyond each request's last partial block
    assert contiguous[1] > 0.5, results      # the naive slot leaves most of its memory empty
