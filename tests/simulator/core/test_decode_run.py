"""DecodeRun (the fast path) against plain steps: the same scheduler state, block for block."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.config import Batching, KVPolicy, SchedulerConfig
from simulator.core.decode_run import DecodeRun
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler
from simulator.core.step import StepPlan


def _state(sched: Scheduler) -> tuple[object, ...]:
    pool = sched.kv.pool
    return (
        sched.num_steps,
        [(r.request_id, r.num_computed_tokens, r.num_output_tokens, r.status) for r in sched.running],
        {rid: list(blocks) for rid, blocks in sched.kv.req_blocks.items()},
        pool.free_queue,
        dict(pool.cached),
        pool.num_evictions,
    )


def _drive(config: SchedulerConfig, specs: list[RequestSpec], fast: bool,
           probes: tuple[int, ...] = (50,)) -> dict[int, tuple[object, ...]]:
    """State after every step (step-by-step) or after every step or run (fast), keyed by steps done. A run
    is applied up to each of ``probes`` (percent of its steps) before it finishes, as routers and samples
    look mid-run: one step at a time, several at once, or not at all."""
    sched = Scheduler(config)
    states = {0: _state(sched)}
    for spec in specs:
        sched.add_request(spec)
    guard = 0
    run: DecodeRun | None = None
    while sched.has_work:
        guard += 1
        assert guard < 5000
        k = sched.steady_decode_steps() if fast else 0
        if k >= 2:
            if run is None:
                run = DecodeRun(sched, k)
            else:
                run.restart(k)  # one object for every run after the first, as a replica does
            for percent in probes:
                run.advance_to(k * percent // 100)
            run.finish()
        else:
            plan = sched.schedule()
            sched.update(plan)
        states[sched.num_steps] = _state(sched)
    return states


@settings(max_examples=150, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    num_blocks=st.integers(24, 200),
    batching=st.sampled_from(list(Batching)),
    kv_policy=st.sampled_from(list(KVPolicy)),
    caching=st.booleans(),
    max_num_seqs=st.integers(1, 12),
    reqs=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 60), st.integers(0, 2)), min_size=1, max_size=20),
    probes=st.lists(st.integers(0, 100), max_size=6).map(lambda p: tuple(sorted(p))),
)
def test_decode_runs_reach_the_same_state_as_single_steps(
    block_size: int, num_blocks: int, batching: Batching, kv_policy: KVPolicy, caching: bool,
    max_num_seqs: int, reqs: list[tuple[int, int, int]], probes: tuple[int, ...],
) -> None:
    config = SchedulerConfig(num_blocks=num_blocks, block_size=block_size, batching=batching, kv_policy=kv_policy,
                             enable_prefix_caching=caching, max_num_seqs=max_num_seqs, max_model_len=128,
                             max_num_batched_tokens=64)
    # Hashes cover prompt and output, so output blocks are cached during runs too.
    specs = [
        RequestSpec(i, 0.0, p, o, block_hashes=tuple(f * 1000 + j for j in range((p + o) // block_size)))
        for i, (p, o, f) in enumerate(reqs)
    ]
    slow = _drive(config, specs, fast=False)
    fast = _drive(config, specs, fast=True, probes=probes)
    assert max(fast) == max(slow)
    for steps, state in fast.items():
        assert state == slow[steps], f"state differs after {steps} steps"


def test_a_run_needs_a_steady_batch() -> None:
    config = SchedulerConfig(num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
    sched = Scheduler(config)
    sched.add_request(RequestSpec(0, 0.0, 10, 20))
    assert sched.steady_decode_steps() == 0  # the prompt is not computed yet
    sched.update(sched.schedule())
    assert sched.steady_decode_steps() == 19  # 19 outputs left; the run's last step finishes it
    sched.add_request(RequestSpec(1, 0.0, 10, 5))
    assert sched.steady_decode_steps() == 0  # a waiting request the next step would admit
    sched.update(sched.schedule())
    sched.add_request(RequestSpec(2, 0.0, 10, 5))
    assert sched.steady_decode_steps() == 4  # batch full (max_num_seqs): the arrival cannot enter


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("probes", [(), tuple(range(0, 101, 3)), (5, 40, 41, 97)])
def test_long_runs_without_the_prefix_cache_hand_out_the_blocks_single_steps_do(
    block_size: int, probes: tuple[int, ...],
) -> None:
    """Runs of many steps over a batch at mixed block offsets, applied in one go, a step or two at a time,
    or in uneven windows: the blocks each request gets, and the order the pool hands them out, are those
    of plain steps (every window size and every position of a run's last step against a block boundary)."""
    rng = np.random.default_rng(block_size)
    config = SchedulerConfig(num_blocks=4000, block_size=block_size, enable_prefix_caching=False, max_num_seqs=12,
                             max_model_len=2048, max_num_batched_tokens=2048)
    for trial in range(4):
        specs = [RequestSpec(i, 0.0, int(rng.integers(1, 200)), int(rng.integers(2, 300))) for i in range(10)]
        slow = _drive(config, specs, fast=False)
        fast = _drive(config, specs, fast=True, probes=probes)
        assert max(fast) == max(slow)
        for steps, state in fast.items():
            assert state == slow[steps], f"trial {trial}: state differs after {steps} steps"


def _drive_async(config: SchedulerConfig, specs: list[RequestSpec], fast: bool,
                 probes: tuple[int, ...], prompts: bool = False) -> dict[int, tuple[object, ...]]:
    """Async scheduling as a replica drives it, step boundary by step boundary: the step in flight is
    updated, the queued step starts, and the one after it is scheduled. State after each boundary, keyed by
    steps scheduled; on the fast path a decode run replaces the boundaries inside it, finishes the requests
    its last step sampled the last token of, and hands back the step its last decision scheduled, queued:
    it starts now (or another run does, behind it). ``prompts``: a run may begin with a queued step holding
    prompts (every row sampling), whose update the run applies as a decode's."""
    sched = Scheduler(config)
    for spec in specs:
        sched.add_request(spec)
    states: dict[int, tuple[object, ...]] = {0: (_state(sched), [])}
    in_flight: StepPlan | None = None
    queued: StepPlan | None = None
    run: DecodeRun | None = None
    guard = 0
    while in_flight is not None or queued is not None or sched.has_work:
        guard += 1
        assert guard < 5000
        if in_flight is not None:
            sched.update(in_flight)
            in_flight = None
        while fast and queued is not None:
            k = sched.steady_async_steps(queued, prompts)
            if not k:
                break
            if run is None:
                run = DecodeRun(sched, k - 1)
            else:
                run.restart(k - 1)
            for percent in probes:
                run.advance_to((k - 1) * percent // 100)
            finished = run.finish()
            assert all(r.status is RequestStatus.FINISHED for r in finished)
            queued = run.in_flight_plan()
            queued = None if queued.is_empty else queued
        plan = queued if queued is not None else (sched.schedule() if sched.has_work else None)
        in_flight = plan if plan is not None and not plan.is_empty else None
        queued = None
        if sched.has_work:
            following = sched.schedule()
            queued = None if following.is_empty else following
        states[sched.num_steps] = (_state(sched), [r.num_output_placeholders for r in sched.running])
    return states


@settings(max_examples=150, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    num_blocks=st.integers(24, 200),
    kv_policy=st.sampled_from(list(KVPolicy)),
    caching=st.booleans(),
    max_num_seqs=st.integers(1, 12),
    reqs=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 60), st.integers(0, 2)), min_size=1, max_size=20),
    probes=st.lists(st.integers(0, 100), max_size=6).map(lambda p: tuple(sorted(p))),
    prompts=st.booleans(),
)
def test_async_decode_runs_reach_the_same_state_as_single_steps(
    block_size: int, num_blocks: int, kv_policy: KVPolicy, caching: bool, max_num_seqs: int,
    reqs: list[tuple[int, int, int]], probes: tuple[int, ...], prompts: bool,
) -> None:
    """Async scheduling: a decode run's decisions allocate the blocks, index the hashes and evict what
    step-by-step async scheduling would, and hand back the same step in flight; also a run beginning with a
    queued step of prompts (``prompts``), whose update it applies."""
    config = SchedulerConfig(num_blocks=num_blocks, block_size=block_size, kv_policy=kv_policy,
                             enable_prefix_caching=caching, max_num_seqs=max_num_seqs, max_model_len=128,
                             max_num_batched_tokens=64, async_scheduling=True)
    specs = [
        RequestSpec(i, 0.0, p, o, block_hashes=tuple(f * 1000 + j for j in range((p + o) // block_size)))
        for i, (p, o, f) in enumerate(reqs)
    ]
    slow = _drive_async(config, specs, fast=False, probes=())
    fast = _drive_async(config, specs, fast=True, probes=probes, prompts=prompts)
    assert max(fast) == max(slow)
    for steps, state in fast.items():
        assert state == slow[steps], f"state differs after {steps} steps"


def test_an_async_run_starts_behind_a_queued_decode_of_the_whole_batch() -> None:
    config = SchedulerConfig(num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=64,
                             async_scheduling=True)
    sched = Scheduler(config)
    sched.add_request(RequestSpec(0, 0.0, 10, 20))
    prefill = sched.schedule()
    decode = sched.schedule()  # scheduled while the prefill runs: its first token is a placeholder
    assert sched.steady_async_steps(decode) == 0  # the prefill's token is still in flight
    sched.update(prefill)
    assert sched.steady_async_steps(prefill) == 0  # not a decode of the batch
    # 19 tokens to go, the queued decode's included: a run through the step sampling the last one (its last
    # decision leaves the request out), then the step after it (empty here) handed back.
    assert sched.steady_async_steps(decode) == 20
    sched.add_request(RequestSpec(1, 0.0, 10, 5))
    assert sched.steady_async_steps(decode) == 0  # the next decision would admit it


def test_an_async_run_may_begin_with_a_queued_step_of_prompts_that_all_sample() -> None:
    config = SchedulerConfig(num_blocks=64, block_size=4, max_num_seqs=3, max_num_batched_tokens=12,
                             async_scheduling=True)
    sched = Scheduler(config)
    sched.add_request(RequestSpec(0, 0.0, 10, 20))
    first = sched.schedule()  # the whole prompt: it samples its first token
    assert sched.steady_async_steps(first) == 0  # not a decode of the batch
    assert sched.steady_async_steps(first, prompts=True) == 21  # 20 tokens: the run's last decision leaves it out
    sched.add_request(RequestSpec(1, 0.0, 10, 30))
    following = sched.schedule()  # the decode and 11 of the 10-token prompt's budget: whole, it samples
    assert following.admitted_ids == [1] and following.sampled == [True, True]
    assert sched.steady_async_steps(following, prompts=True) == 0  # request 0's token is still in flight
    sched.update(first)
    assert sched.steady_async_steps(following, prompts=True) == 20
    sched.add_request(RequestSpec(2, 0.0, 20, 5))
    sched.update(following)
    chunk = sched.schedule()  # two decodes and a 10-token chunk of a 20-token prompt: it does not sample
    assert chunk.sampled == [True, True, False]
    assert sched.steady_async_steps(chunk, prompts=True) == 0


def test_an_async_run_finishes_the_requests_its_last_step_samples_the_last_token_of() -> None:
    config = SchedulerConfig(num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=64,
                             async_scheduling=True)
    sched = Scheduler(config)
    sched.add_request(RequestSpec(0, 0.0, 10, 20))
    sched.add_request(RequestSpec(1, 0.0, 10, 30))
    prefill = sched.schedule()
    decode = sched.schedule()
    sched.update(prefill)
    assert sched.steady_async_steps(decode) == 20
    first, second = sched.running
    run = DecodeRun(sched, 19)
    assert run.finish() == [first]  # its last token delivered at the run's end, as ``update`` would
    assert first.status is RequestStatus.FINISHED and first.num_output_tokens == 20
    assert first.num_output_placeholders == 0 and first.num_computed_tokens == 29  # 10 + 20 - 1 computed
    assert sched.running == [second] and sched.kv.num_held_blocks(0) == 0
    assert second.num_output_tokens == 20 and second.num_computed_tokens == 30  # the next step's token too
    handed_back = run.in_flight_plan()
    assert handed_back.requests == [second] and handed_back.num_computed_tokens == [29]
