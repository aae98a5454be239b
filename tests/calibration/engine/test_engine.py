"""The engine's step loop: paged engine = dense oracle token for token, block-pool invariants after every
step, and engine/scheduler parity (the same requests give the same step plans with and without a model).

Workloads are seeded random (fast and reproducible) and cover chunked prefill, prefix hits on shared
prompts (given token ids, and spec block hashes as simulator workloads carry them), mixed steps,
preemption on deliberately tiny pools (recompute and swap), and every batching and KV policy of the core.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

pytest.importorskip("torch")
import torch

from calibration.engine.attention.dense import dense_last_logits
from calibration.engine.configs import get_model
from calibration.engine.engine import Engine, StepRecord, block_tokens, chain_block_hashes
from simulator.core.config import Batching, KVPolicy, Preemption, SchedulerConfig
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.scheduler import Scheduler
from simulator.core.step import StepPlan

TINY = get_model("tiny")
BLOCK_SIZE = 4
SEED = 1


# ----- workloads -----------------------------------------------------------------------------------------


@dataclass
class Workload:
    """Requests to add before given step indices; each with prompt ids (mode "ids") or spec hashes."""

    arrivals: dict[int, list[tuple[RequestSpec, list[int] | None]]] = field(default_factory=dict)

    def all(self) -> Iterator[tuple[RequestSpec, list[int] | None]]:
        for step in sorted(self.arrivals):
            yield from self.arrivals[step]


def random_workload(seed: int, *, num_requests: int, max_prompt: int, max_output: int, hashes: bool) -> Workload:
    """Prompts built from a few shared prefixes (whole blocks) plus private tails; some arrive mid-run.

    ``hashes``: the specs carry chained block hashes (a simulator workload) and no ids; otherwise the
    engine gets token ids (shared prefixes as real content) and hashes them itself.
    """
    rng = random.Random(seed)
    prefixes = [[rng.randrange(TINY.vocab_size) for _ in range(BLOCK_SIZE * rng.randint(1, 3))] for _ in range(2)]
    prefix_hashes = [tuple(rng.getrandbits(62) for _ in range(rng.randint(1, 3))) for _ in range(2)]
    work = Workload()
    for rid in range(num_requests):
        prompt_len = rng.randint(2, max_prompt)
        output_len = rng.randint(1, max_output)
        arrival_step = 0 if rid < num_requests // 2 else rng.randint(1, 12)
        shared = rng.random() < 0.6
        if hashes:
            block_hashes: tuple[int, ...] = ()
            if shared:
                block_hashes = rng.choice(prefix_hashes)
            num_full = prompt_len // BLOCK_SIZE
            block_hashes = block_hashes[:num_full]
            block_hashes += tuple(rng.getrandbits(62) for _ in range(num_full - len(block_hashes)))
            spec = RequestSpec(rid, float(rid), prompt_len, output_len, block_hashes=block_hashes)
            item: tuple[RequestSpec, list[int] | None] = (spec, None)
        else:
            ids = (rng.choice(prefixes) if shared else [])[:prompt_len]
            ids += [rng.randrange(TINY.vocab_size) for _ in range(prompt_len - len(ids))]
            item = (RequestSpec(rid, float(rid), prompt_len, output_len), ids)
        work.arrivals.setdefault(arrival_step, []).append(item)
    return work


CONFIGS = [
    pytest.param(batching, kv, preemption, id=f"{batching}-{kv}-{preemption}")
    for batching in Batching
    for kv in KVPolicy
    for preemption in Preemption
    if not (kv is KVPolicy.RESERVE and preemption is Preemption.SWAP)  # reserve never preempts
]


ASYNC_CONFIGS = [pytest.param(kv, id=f"async-chunked-{kv}-recompute") for kv in KVPolicy]
"""Async scheduling is vLLM v1's: chunked batching and recompute preemption only."""


def make_config(batching: Batching, kv: KVPolicy, preemption: Preemption, *, num_blocks: int,
                async_scheduling: bool = False) -> SchedulerConfig:
    return SchedulerConfig(
        async_scheduling=async_scheduling,
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        batching=batching,
        kv_policy=kv,
        preemption=preemption,
        num_host_blocks=8,
        max_num_seqs=6,
        max_num_batched_tokens=16,  # small budget: prompts are chunked under the chunked policy
        max_model_len=32 if kv is KVPolicy.CONTIGUOUS else 64,
    )


# ----- checks --------------------------------------------------------------------------------------------


def check_block_pool(scheduler: Scheduler) -> None:
    """free + used = total; ref counts = block-table references; the free queue = the ref-0 blocks."""
    pool = scheduler.kv.pool
    free_ids = pool.free_queue
    assert len(free_ids) == len(set(free_ids)), "a block is twice in the free queue"
    used = [b for b in range(pool.num_blocks) if pool.ref_count(b) > 0]
    assert len(free_ids) + len(used) == pool.num_blocks
    refs = Counter(b for blocks in scheduler.kv.req_blocks.values() for b in blocks)
    assert {b: r for b, r in enumerate(pool.ref_cnt) if r} == dict(refs)
    assert set(free_ids) == {b for b in range(pool.num_blocks) if pool.ref_count(b) == 0}
    assert all(pool.block_hash(b) == h for h, b in pool.cached.items())
    for request in scheduler.running:  # every running request's table covers its computed tokens
        assert scheduler.kv.num_held_blocks(request.request_id) * BLOCK_SIZE >= request.num_computed_tokens


def check_against_dense(
    engine: Engine,
    sequences: dict[int, list[int]],
    prompt_lens: dict[int, int],
    scripted_lens: dict[int, int] | None = None,
) -> int:
    """Every generated token is the dense oracle's greedy choice given the same history (teacher-forced, so
    a near-tie cannot cascade); tokens fixed by spec hashes are skipped. Returns the tokens checked."""
    checked = 0
    for rid, seq in sequences.items():
        start = max(prompt_lens[rid], (scripted_lens or {}).get(rid, 0))
        positions = list(range(start, len(seq)))
        if not positions:
            continue
        logits = dense_last_logits(engine.runner.model, [seq[:i] for i in positions])  # (n, vocab)
        for row, i in zip(logits, positions, strict=True):
            token = seq[i]
            assert token == int(row.argmax()) or row[token] >= row.max() - 1e-4, (rid, i, token)
            checked += 1
    return checked


@dataclass
class EngineRun:
    sequences: dict[int, list[int]] = field(default_factory=dict)
    """Prompt + generated ids per request."""
    prompt_lens: dict[int, int] = field(default_factory=dict)
    scripted_lens: dict[int, int] = field(default_factory=dict)
    """Leading tokens fixed by the workload's spec hashes (not sampled, so not checked by the oracle)."""
    specs: dict[int, RequestSpec] = field(default_factory=dict)
    """The specs the scheduler received (with the engine's block hashes)."""


def run_engine(engine: Engine, work: Workload) -> EngineRun:
    """Run to completion, adding arrivals at their steps and checking the pool after every step."""
    out = EngineRun()
    step = 0
    while step <= max(work.arrivals) or engine.has_work:
        for spec, ids in work.arrivals.get(step, []):
            request = engine.add_request(spec, ids)
            assert request.status is not RequestStatus.REJECTED
            rid = spec.request_id
            out.sequences[rid] = list(engine.token_ids[rid])
            out.prompt_lens[rid] = spec.prompt_tokens
            out.scripted_lens[rid] = len(spec.block_hashes) * BLOCK_SIZE
            out.specs[rid] = request.spec
        if engine.has_work:
            engine.step()
            check_block_pool(engine.scheduler)
        step += 1
        assert step < 2000, "engine made no progress"
    for rid, seq in out.sequences.items():
        seq += engine.outputs[rid]
    return out


def plan_decisions(plan: StepPlan) -> tuple[object, ...]:
    return (
        plan.step_id,
        tuple(r.request_id for r in plan.requests),
        tuple(plan.num_new_tokens),
        tuple(plan.num_computed_tokens),
        tuple(plan.preempted_ids),
        tuple(op.request_id for op in plan.swapped_out),
        tuple(op.request_id for op in plan.swapped_in),
        tuple(plan.admitted_ids),
        tuple(plan.finished_ids),
    )


def record_decisions(r: StepRecord) -> tuple[object, ...]:
    return (
        r.step_id, r.request_ids, r.num_new_tokens, r.num_computed_tokens, r.preempted_ids,
        r.swapped_out_ids, r.swapped_in_ids, r.admitted_ids, r.finished_ids,
    )


def scheduler_only(
    config: SchedulerConfig, work: Workload, engine_specs: dict[int, RequestSpec]
) -> list[tuple[object, ...]]:
    """The simulator's view: the same specs (with the block hashes the engine ran) through a bare Scheduler."""
    scheduler = Scheduler(config)
    plans = []
    step = 0
    queued: StepPlan | None = None  # async: the plan scheduled while the previous one ran
    while step <= max(work.arrivals) or scheduler.has_work or queued is not None:
        for spec, _ids in work.arrivals.get(step, []):
            scheduler.add_request(engine_specs[spec.request_id])
        if scheduler.has_work or queued is not None:
            plan = queued if queued is not None else scheduler.schedule()
            queued = None
            if config.async_scheduling and scheduler.has_work:
                following = scheduler.schedule()  # before this step's update, as vLLM schedules step n + 1
                queued = None if following.is_empty else following
            scheduler.update(plan)
            plans.append(plan_decisions(plan))
        step += 1
    return plans


def workload_seed(batching: Batching, kv: KVPolicy, preemption: Preemption, hashes: bool) -> int:
    """A different workload per configuration, stable across processes (unlike ``hash`` of a str)."""
    return zlib.crc32(f"{batching}-{kv}-{preemption}-{hashes}".encode())


# ----- tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("batching", "kv", "preemption"), CONFIGS)
@pytest.mark.parametrize("hashes", [False, True], ids=["ids", "hashes"])
def test_engine_matches_dense_oracle_and_scheduler(
    batching: Batching, kv: KVPolicy, preemption: Preemption, hashes: bool
) -> None:
    """Tiny pool: preemption happens under paged; the oracle and the bare scheduler agree with the engine."""
    num_blocks = 10 if kv is KVPolicy.PAGED else 24
    config = make_config(batching, kv, preemption, num_blocks=num_blocks)
    work = random_workload(workload_seed(batching, kv, preemption, hashes), num_requests=8, max_prompt=20,
                           max_output=8, hashes=hashes)
    engine = Engine(TINY, config, seed=SEED)
    run = run_engine(engine, work)
    assert {rid: len(s) - run.prompt_lens[rid] for rid, s in run.sequences.items()} == {
        spec.request_id: spec.output_tokens for spec, _ in work.all()
    }, "each request generates exactly its output length"
    assert check_against_dense(engine, run.sequences, run.prompt_lens, run.scripted_lens) > 0
    assert [record_decisions(r) for r in engine.records] == scheduler_only(config, work, run.specs)


@pytest.mark.parametrize("kv", ASYNC_CONFIGS)
@pytest.mark.parametrize("hashes", [False, True], ids=["ids", "hashes"])
def test_async_engine_matches_dense_oracle_and_scheduler(kv: KVPolicy, hashes: bool) -> None:
    """Async scheduling (step n + 1 scheduled before step n's output is processed) on a pool small enough to
    preempt: every request still gets exactly its tokens, each the oracle's, and a bare scheduler driven in
    the same order makes the same decisions."""
    num_blocks = 8 if kv is KVPolicy.PAGED else 24
    config = make_config(Batching.CHUNKED, kv, Preemption.RECOMPUTE, num_blocks=num_blocks, async_scheduling=True)
    work = random_workload(workload_seed(Batching.CHUNKED, kv, Preemption.RECOMPUTE, hashes) + 1, num_requests=10,
                           max_prompt=20, max_output=8, hashes=hashes)
    engine = Engine(TINY, config, seed=SEED)
    run = run_engine(engine, work)
    assert {rid: len(s) - run.prompt_lens[rid] for rid, s in run.sequences.items()} == {
        spec.request_id: spec.output_tokens for spec, _ in work.all()
    }, "each request generates exactly its output length"
    assert check_against_dense(engine, run.sequences, run.prompt_lens, run.scripted_lens) > 0
    assert [record_decisions(r) for r in engine.records] == scheduler_only(config, work, run.specs)
    if kv is KVPolicy.PAGED:
        assert any(r.preempted_ids for r in engine.records), "the pool never preempted: the test proves less"


def test_async_scheduling_lags_finishes_and_admissions_by_one_step() -> None:
    """What async scheduling changes: a request finishing at step n frees its seat only for step n + 2 (step
    n + 1 was scheduled before step n's output), and a request arriving during step n is admitted at step
    n + 2. Token counts and outputs are the same as synchronous scheduling's."""
    def steps(async_scheduling: bool) -> tuple[list[tuple[int, ...]], dict[int, list[int]]]:
        config = SchedulerConfig(num_blocks=32, block_size=BLOCK_SIZE, max_num_seqs=2,
                                 async_scheduling=async_scheduling)
        engine = Engine(TINY, config, seed=SEED)
        engine.add_request(RequestSpec(0, 0.0, 5, 2))
        engine.add_request(RequestSpec(1, 0.0, 5, 6))
        engine.add_request(RequestSpec(2, 0.0, 5, 2))  # waits for a seat
        engine.run()
        return [r.request_ids for r in engine.records], engine.outputs

    sync_steps, sync_outputs = steps(False)
    async_steps, async_outputs = steps(True)
    assert sync_outputs == async_outputs
    # Request 0 samples its 2nd (last) token in step 1. Sync: request 2 takes its seat in step 2.
    assert sync_steps[:3] == [(0, 1), (0, 1), (1, 2)]
    # Async: step 2 was scheduled during step 1 (request 0 skipped, its last token in flight); request 2
    # is admitted at step 3, once step 1's output has freed the seat.
    assert async_steps[:4] == [(0, 1), (0, 1), (1,), (1, 2)]


def test_async_eos_stop_discards_the_step_in_flight() -> None:
    """A request that stops on EOS under async scheduling was already scheduled for the next step (the
    scheduler could not know): that row is dropped, its blocks are freed, and no token is added."""
    config = SchedulerConfig(num_blocks=32, block_size=BLOCK_SIZE, async_scheduling=True)
    probe = Engine(TINY, config, seed=SEED)
    probe.add_request(RequestSpec(0, 0.0, 6, 6), [1, 2, 3, 4, 5, 6])
    probe.run()
    eos = probe.outputs[0][2]
    engine = Engine(TINY, config, seed=SEED, eos_token_id=eos)
    engine.add_request(RequestSpec(0, 0.0, 6, 6), [1, 2, 3, 4, 5, 6], ignore_eos=False)
    engine.add_request(RequestSpec(1, 0.0, 6, 6), [1, 2, 3, 4, 5, 6])
    engine.run()
    assert engine.outputs[0] == probe.outputs[0][:3]
    assert engine.outputs[1] == probe.outputs[0]
    assert engine.scheduler.kv.pool.num_used == 0
    stop_step = next(r.step_id for r in engine.records if 0 in r.finished_ids)
    assert 0 in engine.records[stop_step + 1].request_ids, "the row scheduled before the stop was known"
    assert all(e.request_id != 0 for e in engine.records[stop_step + 1].events)


def test_workloads_exercise_every_path() -> None:
    """The randomised workloads above really hit what they claim: chunks, mixed steps, prefix hits,
    preemption by recompute and by swap."""
    seen: Counter[str] = Counter()
    for preemption in Preemption:
        for hashes in (False, True):
            config = make_config(Batching.CHUNKED, KVPolicy.PAGED, preemption, num_blocks=10)
            seed = workload_seed(Batching.CHUNKED, KVPolicy.PAGED, preemption, hashes)
            work = random_workload(seed, num_requests=8, max_prompt=20, max_output=8, hashes=hashes)
            engine = Engine(TINY, config, seed=SEED)
            run_engine(engine, work)
            for r in engine.records:
                pairs = zip(r.num_new_tokens, r.num_computed_tokens, strict=True)
                seen["chunk"] += any(n > 1 and c > 0 for n, c in pairs)
                seen["mixed"] += 0 < r.shape.num_decode_seqs < r.shape.num_seqs
                seen["recompute"] += len(r.preempted_ids) - len(r.swapped_out_ids)
                seen["swap_out"] += len(r.swapped_out_ids)
                seen["swap_in"] += len(r.swapped_in_ids)
            seen["prefix_hit"] += engine.scheduler.kv.num_hit_tokens
    assert all(seen[k] > 0 for k in ("chunk", "mixed", "recompute", "swap_out", "swap_in", "prefix_hit")), seen


def test_prefix_hit_reuses_real_content() -> None:
    """Two prompts sharing three blocks: the second is served from cache and still matches the oracle."""
    config = SchedulerConfig(num_blocks=32, block_size=BLOCK_SIZE)
    rng = random.Random(3)
    shared = [rng.randrange(TINY.vocab_size) for _ in range(3 * BLOCK_SIZE)]
    engine = Engine(TINY, config, seed=SEED)
    engine.add_request(RequestSpec(0, 0.0, 14, 4), [*shared, 1, 2])
    engine.run()
    b = engine.add_request(RequestSpec(1, 1.0, 15, 4), [*shared, 3, 4, 5])
    engine.run()
    assert b.num_cached_tokens == 3 * BLOCK_SIZE
    assert engine.records[-4].num_computed_tokens == (3 * BLOCK_SIZE,)  # the admission step starts after the hit
    seqs = {0: [*shared, 1, 2] + engine.outputs[0], 1: [*shared, 3, 4, 5] + engine.outputs[1]}
    assert check_against_dense(engine, seqs, {0: 14, 1: 15}) == 8


def test_spec_hashes_fix_tokens_and_drive_prefix_hits() -> None:
    """Requests sharing k leading hashes share k blocks of ids; hashes past the prompt (a session's next
    turn) fix the generated tokens there, so the next turn's prefix hit reuses the same content."""
    h = (11, 22, 33, 44)
    engine = Engine(TINY, SchedulerConfig(num_blocks=32, block_size=BLOCK_SIZE), seed=SEED)
    engine.add_request(RequestSpec(0, 0.0, 9, 8, block_hashes=h))  # hashes cover prompt + 7 outputs
    engine.add_request(RequestSpec(1, 0.0, 6, 2, block_hashes=h[:1]))
    ids0, ids1 = list(engine.token_ids[0]), list(engine.token_ids[1])
    assert ids0[:BLOCK_SIZE] == ids1[:BLOCK_SIZE] == block_tokens(11, BLOCK_SIZE, TINY.vocab_size, SEED)
    assert ids0[BLOCK_SIZE:8] == block_tokens(22, BLOCK_SIZE, TINY.vocab_size, SEED)
    engine.run()
    full0 = ids0 + engine.outputs[0]
    scripted = [t for x in h for t in block_tokens(x, BLOCK_SIZE, TINY.vocab_size, SEED)]
    assert full0[:16] == scripted
    turn2 = engine.add_request(RequestSpec(2, 1.0, 17, 3, block_hashes=h))
    ids2 = list(engine.token_ids[2])
    assert ids2[:16] == scripted
    engine.run()
    assert turn2.num_cached_tokens == 16
    seqs = {0: full0, 1: ids1 + engine.outputs[1], 2: ids2 + engine.outputs[2]}
    assert check_against_dense(engine, seqs, {0: 9, 1: 6, 2: 17}, {0: 16, 1: 4, 2: 16}) == 1 + 2 + 3


def test_engine_hashes_are_the_chained_prompt_hashes() -> None:
    engine = Engine(TINY, SchedulerConfig(num_blocks=16, block_size=BLOCK_SIZE), seed=SEED)
    ids = list(range(10))
    request = engine.add_request(RequestSpec(0, 0.0, 10, 1), ids)
    assert tuple(request.block_hashes) == chain_block_hashes(ids, BLOCK_SIZE)
    assert len(request.block_hashes) == 2
    assert chain_block_hashes(ids[:8], BLOCK_SIZE) == chain_block_hashes(ids[:9], BLOCK_SIZE)
    assert chain_block_hashes([9, *ids[1:8]], BLOCK_SIZE)[1] != request.block_hashes[1]  # chained


def test_pseudo_prompts_are_deterministic() -> None:
    def prompt(seed: int, rid: int) -> list[int]:
        engine = Engine(TINY, SchedulerConfig(num_blocks=16, block_size=BLOCK_SIZE), seed=seed)
        engine.add_request(RequestSpec(rid, 0.0, 12, 1))
        return engine.token_ids[rid]

    assert prompt(0, 5) == prompt(0, 5)
    assert prompt(0, 5) != prompt(0, 6)
    assert prompt(0, 5) != prompt(1, 5)


def test_stream_eos_abort_and_records() -> None:
    """Streaming yields every token once, in step order; EOS stops only requests that allow it; abort
    releases a request's blocks wherever it is."""
    config = SchedulerConfig(num_blocks=32, block_size=BLOCK_SIZE)
    probe = Engine(TINY, config, seed=SEED)
    probe.add_request(RequestSpec(0, 0.0, 6, 6), [1, 2, 3, 4, 5, 6])
    probe.run()
    eos = probe.outputs[0][2]  # the third greedy token of this prompt becomes "EOS"

    engine = Engine(TINY, config, seed=SEED, eos_token_id=eos)
    engine.add_request(RequestSpec(0, 0.0, 6, 6), [1, 2, 3, 4, 5, 6], ignore_eos=False)
    engine.add_request(RequestSpec(1, 0.0, 6, 6), [1, 2, 3, 4, 5, 6])  # exact length: ignores EOS
    engine.add_request(RequestSpec(2, 0.0, 5, 20))
    engine.add_request(RequestSpec(3, 0.0, 5, 20))
    events = []
    for event in engine.stream():
        events.append(event)
        if event.request_id == 2 and len(engine.outputs[2]) == 3:
            engine.abort(2)
        check_block_pool(engine.scheduler)
        if len(events) == 5:
            engine.abort(3)  # aborted while running, mid-stream
    assert engine.outputs[0] == probe.outputs[0][:3]
    assert engine.outputs[1] == probe.outputs[0]
    assert len(engine.outputs[2]) == 3
    assert [e.token for e in events if e.request_id == 1] == engine.outputs[1]
    assert [e.timestamp_s for e in events] == sorted(e.timestamp_s for e in events)
    assert engine.scheduler.kv.pool.num_used == 0
    assert engine.records and all(r.cycle_s >= r.device_s >= 0 for r in engine.records)
    assert sum(len(r.events) for r in engine.records) == len(events)


def test_rejected_request_is_not_run() -> None:
    engine = Engine(TINY, SchedulerConfig(num_blocks=2, block_size=BLOCK_SIZE), seed=SEED)
    assert engine.add_request(RequestSpec(0, 0.0, 20, 2)).status is RequestStatus.REJECTED
    assert not engine.has_work and engine.run() == [] and engine.outputs[0] == []
    with pytest.raises(ValueError, match="already added"):
        engine.add_request(RequestSpec(0, 0.0, 2, 2))
    with pytest.raises(ValueError, match="prompt ids"):
        engine.add_request(RequestSpec(1, 0.0, 3, 2), [1, 2])


def test_swap_round_trip_preserves_tokens() -> None:
    """A forced swap: the swapped request resumes from host KV (no recompute) and still matches."""
    config = SchedulerConfig(
        num_blocks=8, block_size=BLOCK_SIZE, preemption=Preemption.SWAP, num_host_blocks=16,
        max_num_batched_tokens=32,
    )
    engine = Engine(TINY, config, seed=SEED, dtype=torch.float32)
    rng = random.Random(7)
    prompts = {rid: [rng.randrange(TINY.vocab_size) for _ in range(9)] for rid in range(3)}
    for rid, ids in prompts.items():
        engine.add_request(RequestSpec(rid, 0.0, 9, 10), ids)
    engine.run()
    assert any(r.swapped_in_ids for r in engine.records)
    assert sum(r.shape.num_swap_tokens for r in engine.records) > 0
    seqs = {rid: prompts[rid] + engine.outputs[rid] for rid in prompts}
    assert check_against_dense(engine, seqs, dict.fromkeys(prompts, 9)) == 30
