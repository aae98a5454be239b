"""Exact small cases, written out by hand: 3 requests, 8 blocks of 4 tokens, per policy.

Each expected plan lists (request, new tokens, computed tokens before the step). Working is in comments
so a reader can check it without running the scheduler.
"""

from simulator.core.config import Batching, KVPolicy, Preemption, SchedulerConfig
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler

Row = tuple[str, int, int]


def run(config: SchedulerConfig, specs: dict[str, tuple[int, int]]) -> tuple[Scheduler, list[dict[str, object]]]:
    sched = Scheduler(config)
    names = {}
    for i, (name, (prompt, output)) in enumerate(specs.items()):
        sched.add_request(RequestSpec(i, 0.0, prompt, output))
        names[i] = name
    steps = []
    while sched.has_work:
        plan = sched.schedule()
        rows = [(names[r.request_id], n, p) for r, n, p in
                zip(plan.requests, plan.num_new_tokens, plan.num_computed_tokens, strict=True)]
        sched.update(plan)
        steps.append({
            "rows": rows,
            "preempted": [names[i] for i in plan.preempted_ids],
            "finished": [names[i] for i in plan.finished_ids],
            "swap_out": [(names[op.request_id], op.num_tokens, len(op.block_ids)) for op in plan.swapped_out],
            "swap_in": [(names[op.request_id], op.num_tokens) for op in plan.swapped_in],
        })
        assert len(steps) < 100
    return sched, steps


def cfg(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = dict(num_blocks=8, block_size=4, max_num_seqs=3, max_num_batched_tokens=8,
                                   max_model_len=64, enable_prefix_caching=False)
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


ABC = {"A": (6, 3), "B": (5, 2), "C": (10, 2)}


def rows(steps: list[dict[str, object]]) -> list[object]:
    return [s["rows"] for s in steps]


def test_chunked_paged_mixes_decodes_and_chunks() -> None:
    _, steps = run(cfg(), ABC)
    assert rows(steps) == [
        # budget 8: A's whole prompt (6, 2 blocks), then 2 tokens of B's prompt.
        [("A", 6, 0), ("B", 2, 0)],
        # running first: A decodes, B finishes its prompt (3), C gets the last 4 of the budget.
        [("A", 1, 6), ("B", 3, 2), ("C", 4, 0)],
        # A and B decode; C's remaining 6 prompt tokens fit the 6 left.
        [("A", 1, 7), ("B", 1, 5), ("C", 6, 4)],
        [("C", 1, 10)],
    ]
    assert [s["finished"] for s in steps] == [[], [], ["A", "B"], ["C"]]


def test_chunked_paged_preempts_the_tail_by_recompute_and_blocks_admission() -> None:
    sched, steps = run(cfg(max_num_batched_tokens=16), {"A": (12, 6), "B": (8, 6), "C": (4, 4)})
    assert rows(steps) == [
        [("A", 12, 0), ("B", 4, 0)],              # A: 3 blocks, B: 1 block; budget spent
        [("A", 1, 12), ("B", 4, 4), ("C", 4, 0)],  # A 4th block, B 2nd, C 1 block: 8/8 used
        # A fits in block 4; B needs a 3rd block (the last free one); C needs a 2nd: none left, so
        # the tail of running (C itself) is preempted and scheduling stops.
        [("A", 1, 13), ("B", 1, 8)],
        # C must recompute prompt + its 1 output = 5 tokens = 2 blocks; only 1 free: head-of-line waits.
        [("A", 1, 14), ("B", 1, 9)],
        [("A", 1, 15), ("B", 1, 10)],
        [("A", 1, 16), ("B", 1, 11)],              # A takes the last block for token 17, then finishes
        [("B", 1, 12), ("C", 5, 0)],               # A's 5 blocks back: C recomputes 5 tokens
        [("C", 1, 5)],
        [("C", 1, 6)],
    ]
    assert steps[2]["preempted"] == ["C"]
    assert sched.num_preemptions == 1


def test_chunked_paged_swap_keeps_the_victims_kv() -> None:
    _, steps = run(cfg(max_num_batched_tokens=16, preemption=Preemption.SWAP, num_host_blocks=8),
                   {"A": (12, 6), "B": (8, 6), "C": (4, 4)})
    assert steps[2]["swap_out"] == [("C", 4, 1)]  # its 4 prompt tokens, one block, go to the host
    assert steps[6]["swap_in"] == [("C", 4)]
    # Back with its KV: one decode token instead of a 5-token recompute.
    assert steps[6]["rows"] == [("B", 1, 12), ("C", 1, 4)]
    assert len(steps) == 9


def test_continuous_separates_prefill_and_decode_steps() -> None:
    _, steps = run(cfg(batching=Batching.CONTINUOUS, max_num_batched_tokens=16), ABC)
    assert rows(steps) == [
        [("A", 6, 0), ("B", 5, 0)],   # whole prompts: C's 10 no longer fits the 5 left
        [("C", 10, 0)],               # prefill-first: A and B do not decode in this step
        [("A", 1, 6), ("B", 1, 5), ("C", 1, 10)],
        [("A", 1, 7)],
    ]


def test_static_never_admits_into_a_running_batch() -> None:
    _, steps = run(cfg(batching=Batching.STATIC, max_num_batched_tokens=16), ABC)
    assert rows(steps) == [
        [("A", 6, 0), ("B", 5, 0)],
        [("A", 1, 6), ("B", 1, 5)],   # B finishes here, yet C waits:
        [("A", 1, 7)],                # the batch runs to its last completion
        [("C", 10, 0)],
        [("C", 1, 10)],
    ]


def test_reserve_holds_prompt_plus_output_and_never_preempts() -> None:
    sched, steps = run(cfg(kv_policy=KVPolicy.RESERVE, max_num_batched_tokens=16),
                       {"A": (6, 10), "B": (5, 11), "C": (4, 4)})
    # A and B reserve 16 tokens = 4 blocks each: C (2 blocks) waits until A finishes at step 9.
    assert steps[0]["rows"] == [("A", 6, 0), ("B", 5, 0)]
    assert all(len(s["rows"]) == 2 and "C" not in [r[0] for r in s["rows"]] for s in steps[1:10])
    assert steps[9]["finished"] == ["A"]
    assert steps[10]["rows"] == [("B", 1, 14), ("C", 4, 0)]
    assert len(steps) == 14 and sched.num_preemptions == 0


def test_contiguous_reserves_max_model_len() -> None:
    _, steps = run(cfg(kv_policy=KVPolicy.CONTIGUOUS, max_model_len=16, max_num_batched_tokens=16), ABC)
    assert rows(steps) == [
        [("A", 6, 0), ("B", 5, 0)],   # 4 blocks each: the pool is full
        [("A", 1, 6), ("B", 1, 5)],
        [("A", 1, 7), ("C", 10, 0)],  # B's slot is free again
        [("C", 1, 10)],
    ]


def test_prefix_hit_starts_computed_tokens_at_the_hit() -> None:
    sched = Scheduler(cfg(enable_prefix_caching=True, max_num_batched_tokens=16))
    sched.add_request(RequestSpec(0, 0.0, 9, 1, block_hashes=(7, 8)))
    plan = sched.schedule()
    sched.update(plan)
    assert plan.finished_ids == [0]
    req = sched.add_request(RequestSpec(1, 0.0, 10, 1, block_hashes=(7, 8)))
    plan = sched.schedule()
    # Both blocks (8 tokens) hit: only 2 new tokens, computed from position 8.
    assert (plan.num_new_tokens, plan.num_computed_tokens) == ([2], [8])
    assert req.num_cached_tokens == 8
    sched.update(plan)
    assert req.status is RequestStatus.FINISHED


def test_impossible_request_is_rejected() -> None:
    sched = Scheduler(cfg(max_model_len=16))
    assert sched.add_request(RequestSpec(0, 0.0, 15, 5)).status is RequestStatus.REJECTED
    assert sched.add_request(RequestSpec(1, 0.0, 40, 1)).status is RequestStatus.REJECTED
    assert not sched.has_work
