"""Speculative decoding in the real engine: greedy verification gives plain greedy decoding, token for token."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")

from calibration.engine.configs import get_model
from calibration.engine.engine import Engine
from calibration.engine.speculative import acceptance_rates
from simulator.core.config import Preemption, SchedulerConfig
from simulator.core.request import RequestSpec
from simulator.core.scheduler import Scheduler
from simulator.core.speculation import Speculation

TINY = get_model("tiny")  # 2 layers: the self-draft is its first one


def speculation(k: int) -> Speculation:
    return Speculation(num_speculative_tokens=k, acceptance_rates=(0.5,) * k)


def run(config: SchedulerConfig, specs: list[RequestSpec], *, draft_layers: int | None = None,
        ) -> tuple[dict[int, list[int]], Engine]:
    engine = Engine(TINY, config, seed=3, draft_layers=draft_layers)
    pending = list(specs)
    for _ in range(5000):
        if pending:  # one arrival per step: requests join a running batch
            engine.add_request(pending.pop(0))
        if not (pending or engine.has_work):
            break
        engine.step()
        kv = engine.scheduler.kv
        assert kv.pool.num_free + kv.pool.num_used == kv.pool.num_blocks
    return engine.outputs, engine


def workload(seed: int, n: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    return [RequestSpec(rid, 0.0, rng.randint(1, 20), rng.randint(1, 24)) for rid in range(n)]


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_speculative_output_is_plain_greedy_for_any_k(k: int) -> None:
    specs = workload(k, 6)
    base = SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=24)
    plain, _ = run(base, specs)
    fast, engine = run(SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=24,
                                       speculation=speculation(k)), specs, draft_layers=1)
    assert fast == plain
    assert all(len(fast[s.request_id]) == s.output_tokens for s in specs)
    drafted = sum(s.num_draft_tokens for s in engine.spec_stats)
    assert drafted > 0 and engine.scheduler.num_draft_tokens == drafted
    assert engine.scheduler.num_accepted_tokens == sum(s.num_accepted_tokens for s in engine.spec_stats)
    assert len(engine.records) < len(_records_plain(base, specs))  # accepted proposals save steps


def _records_plain(config: SchedulerConfig, specs: list[RequestSpec]) -> list[object]:
    _, engine = run(config, specs)
    return list(engine.records)


def test_speculative_output_survives_preemption_on_a_tight_pool() -> None:
    specs = workload(11, 8)  # 14 blocks of 4 tokens hold any one request (<= 44 tokens), not all of them
    for preemption in Preemption:
        plain, _ = run(SchedulerConfig(num_blocks=14, block_size=4, preemption=preemption, num_host_blocks=64),
                       specs)
        fast, engine = run(SchedulerConfig(num_blocks=14, block_size=4, preemption=preemption, num_host_blocks=64,
                                           speculation=speculation(3)), specs, draft_layers=1)
        assert fast == plain
        assert engine.scheduler.num_preemptions > 0


def test_acceptance_is_measured_per_position() -> None:
    _, engine = run(SchedulerConfig(num_blocks=64, block_size=4, speculation=speculation(3)), workload(5, 4),
                    draft_layers=1)
    rates = acceptance_rates(engine.spec_stats)
    assert len(rates) == 3 and all(0.0 <= r <= 1.0 for r in rates)


def test_an_engine_needs_a_drafter_for_speculation() -> None:
    with pytest.raises(ValueError, match="draft_layers"):
        Engine(TINY, SchedulerConfig(num_blocks=8, speculation=speculation(2)))
    with pytest.raises(ValueError, match="self-draft needs 1 to 1"):
        Engine(TINY, SchedulerConfig(num_blocks=8, speculation=speculation(2)), draft_layers=2)


def test_the_engine_runs_the_cores_plans_a_bare_scheduler_makes_the_same_ones() -> None:
    """Parity: replaying the engine's accepted counts through a scheduler without a model gives the same
    step plans (the core decides everything; the engine only verifies)."""
    config = SchedulerConfig(num_blocks=20, block_size=4, max_num_batched_tokens=16, speculation=speculation(3))
    specs = workload(7, 6)
    _, engine = run(config, specs, draft_layers=1)
    by_step = _accepted_by_step(engine)
    assert len(engine.spec_stats) == len(engine.records)  # every step of a speculative engine verifies
    sched = Scheduler(config)
    pending = list(specs)
    for record, stats in zip(engine.records, engine.spec_stats, strict=True):
        if pending:
            sched.add_request(pending.pop(0))
        plan = sched.schedule()
        assert [r.request_id for r in plan.requests] == list(record.request_ids)
        assert plan.num_new_tokens == list(record.num_new_tokens)
        assert list(plan.preempted_ids) == list(record.preempted_ids)
        assert sum(by_step[record.step_id]) == stats.num_accepted_tokens
        sched.update(plan, accepted=by_step[record.step_id])
    assert not sched.has_work


def _accepted_by_step(engine: Engine) -> dict[int, list[int]]:
    """Each step's accepted counts per row, read back from the tokens each row produced."""
    out: dict[int, list[int]] = {}
    for record in engine.records:
        produced = {rid: 0 for rid in record.request_ids}
        for event in record.events:
            produced[event.request_id] += 1
        out[record.step_id] = [max(0, produced[rid] - 1) for rid in record.request_ids]
    return out
