"""The engine pair (a prefill engine handing KV to a decode engine) = one engine = the dense oracle, token
for token: with chunked prefill, prefix hits on both sides, and preemption on the decode side, under
synchronous and async scheduling. The block pools of both engines keep their invariants after every step."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

pytest.importorskip("torch")

from test_engine import (
    BLOCK_SIZE,
    SEED,
    TINY,
    Workload,
    check_against_dense,
    check_block_pool,
    random_workload,
    run_engine,
)

from calibration.engine.engine import Engine
from calibration.engine.pair import EnginePair
from simulator.core.config import Batching, KVPolicy, Preemption, Role, SchedulerConfig
from simulator.core.request import RequestSpec, RequestStatus


def config(role: Role, *, num_blocks: int, async_scheduling: bool = False) -> SchedulerConfig:
    return SchedulerConfig(
        role=role, num_blocks=num_blocks, block_size=BLOCK_SIZE, batching=Batching.CHUNKED,
        kv_policy=KVPolicy.PAGED, preemption=Preemption.RECOMPUTE, max_num_seqs=6,
        max_num_batched_tokens=8,  # small budget: prompts are chunked on the prefill engine
        max_model_len=64, async_scheduling=async_scheduling,
    )


def run_pair(pair: EnginePair, work: Workload) -> dict[int, list[int]]:
    """Run to completion, offering arrivals at their steps and checking both pools after every step."""
    step = 0
    sequences: dict[int, list[int]] = {}
    while step <= max(work.arrivals) or pair.has_work:
        for spec, ids in work.arrivals.get(step, []):
            assert pair.add_request(spec, ids) is not RequestStatus.REJECTED
            engine = pair.prefill if spec.output_tokens == 1 else pair.decode
            sequences[spec.request_id] = list(engine.token_ids[spec.request_id])
        pair.step()
        check_block_pool(pair.prefill.scheduler)
        check_block_pool(pair.decode.scheduler)
        step += 1
        assert step < 3000, "the pair made no progress"
    return sequences


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("hashes", [False, True], ids=["ids", "hashes"])
def test_the_pair_generates_what_one_engine_and_the_dense_oracle_do(async_scheduling: bool, hashes: bool) -> None:
    work = random_workload(40 + hashes + 2 * async_scheduling, num_requests=10, max_prompt=20, max_output=8,
                           hashes=hashes)
    single = Engine(TINY, config(Role.MIXED, num_blocks=64, async_scheduling=async_scheduling), seed=SEED)
    alone = run_engine(single, work)
    pair = EnginePair(Engine(TINY, config(Role.PREFILL, num_blocks=24, async_scheduling=async_scheduling), seed=SEED),
                      Engine(TINY, config(Role.DECODE, num_blocks=9, async_scheduling=async_scheduling), seed=SEED))
    sequences = run_pair(pair, work)
    for spec, _ in work.all():
        rid = spec.request_id
        assert pair.outputs(rid) == single.outputs[rid], f"request {rid}: the pair and one engine differ"
        assert len(pair.outputs(rid)) == spec.output_tokens
        sequences[rid] = sequences[rid][: spec.prompt_tokens] + pair.outputs(rid)
    prompt_lens = {spec.request_id: spec.prompt_tokens for spec, _ in work.all()}
    assert check_against_dense(pair.decode, sequences, prompt_lens, alone.scripted_lens) > 0
    # What the run went through: chunked prompts, hits on both sides, a preempted decode, every block back.
    steps_per_prompt = Counter(rid for r in pair.prefill.records for rid in r.request_ids)
    assert max(steps_per_prompt.values()) > 1, "no prompt was chunked on the prefill engine"
    assert pair.prefill.scheduler.kv.num_hit_tokens > 0, "no prefix hit on the prefill side"
    assert any(r.preempted_ids for r in pair.decode.records), "the decode engine never preempted"
    assert pair.copies and all(c.num_bytes > 0 for c in pair.copies if c.num_blocks)
    assert pair.prefill.scheduler.kv.pool.num_used == pair.decode.scheduler.kv.pool.num_used == 0


def test_the_decode_engine_copies_only_the_blocks_it_does_not_hold() -> None:
    prefix = list(range(1, 13))  # three full blocks shared by both requests
    pair = EnginePair(Engine(TINY, config(Role.PREFILL, num_blocks=24), seed=SEED),
                      Engine(TINY, config(Role.DECODE, num_blocks=24), seed=SEED))
    pair.add_request(RequestSpec(0, 0.0, 14, 4), [*prefix, 20, 21])
    pair.run()
    pair.add_request(RequestSpec(1, 1.0, 15, 4), [*prefix, 30, 31, 32])
    pair.run()
    first, second = pair.copies
    assert first.num_blocks == 4 and second.num_blocks == 1  # 15 tokens: 4 blocks, 3 held by the decode engine
    assert pair.decode.scheduler.kv.num_hit_tokens == 0  # the decode side's hits are not prompt lookups
    single = Engine(TINY, config(Role.MIXED, num_blocks=24), seed=SEED)
    single.add_request(RequestSpec(0, 0.0, 14, 4), [*prefix, 20, 21])
    single.add_request(RequestSpec(1, 1.0, 15, 4), [*prefix, 30, 31, 32])
    single.run()
    assert [pair.outputs(0), pair.outputs(1)] == [single.outputs[0], single.outputs[1]]


def test_a_one_token_request_stays_on_the_prefill_engine() -> None:
    pair = EnginePair(Engine(TINY, config(Role.PREFILL, num_blocks=24), seed=SEED),
                      Engine(TINY, config(Role.DECODE, num_blocks=24), seed=SEED))
    pair.add_request(RequestSpec(0, 0.0, 9, 1))
    pair.run()
    assert len(pair.outputs(0)) == 1 and not pair.copies and not pair.decode.records


def test_engines_that_cannot_pair_are_refused() -> None:
    prefill = Engine(TINY, config(Role.PREFILL, num_blocks=8), seed=SEED)
    with pytest.raises(ValueError, match="prefill-role engine and a decode-role"):
        EnginePair(prefill, Engine(TINY, config(Role.MIXED, num_blocks=8), seed=SEED))
    other_blocks = replace(config(Role.DECODE, num_blocks=8), block_size=8)
    with pytest.raises(ValueError, match="same model's KV"):
        EnginePair(prefill, Engine(TINY, other_blocks, seed=SEED))
    with pytest.raises(ValueError, match="same weights"):
        EnginePair(prefill, Engine(TINY, config(Role.DECODE, num_blocks=8), seed=SEED + 1))
