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
