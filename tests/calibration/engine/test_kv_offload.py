"""The engine's host offload runs the core's tier decisions: an evicted prefix moves to host memory, a later
request loads it back into fresh device blocks, and greedy decoding gives exactly the tokens recomputing
the prefix gives."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from calibration.engine.configs import get_model
from calibration.engine.engine import Engine
from calibration.engine.kv_offload import MeasuredTierCost
from simulator.core.config import SchedulerConfig
from simulator.core.kv_tiers import KVTiers, TierSource, TierSpec, TierStore
from simulator.core.request import RequestSpec

TINY = get_model("tiny")
BLOCK_SIZE = 4
SEED = 1
PREFIX = (101, 102, 103, 104)


def run_three(tiers: KVTiers | None, *, async_scheduling: bool = False) -> Engine:
    """Request 0 computes a 4-block prefix; request 1 (other blocks) needs the rest of the 12-block pool and
    evicts it; request 2 repeats request 0's prompt."""
    config = SchedulerConfig(num_blocks=12, block_size=BLOCK_SIZE, async_scheduling=async_scheduling)
    engine = Engine(TINY, config, seed=SEED, kv_tiers=tiers)
    engine.add_request(RequestSpec(0, 0.0, 17, 3, block_hashes=PREFIX))
    engine.run()
    engine.add_request(RequestSpec(1, 1.0, 45, 3, block_hashes=tuple(range(200, 211))))
    engine.run()
    engine.add_request(RequestSpec(2, 2.0, 17, 6, block_hashes=PREFIX))
    engine.run()
    return engine


def host_tiers(*, read_bytes_per_s: float = 1e12) -> KVTiers:
    cost = MeasuredTierCost(block_bytes=1 << 16, read_bytes_per_s=read_bytes_per_s, latency_s=0.0,
                            prefill_s_per_token=1e-4)
    return KVTiers([TierStore(TierSpec(name="host"))], cost, block_size=BLOCK_SIZE)


def test_a_prefix_loaded_from_host_memory_decodes_as_its_recompute() -> None:
    tiers = host_tiers()
    offloaded = run_three(tiers)
    recomputed = run_three(None)
    assert offloaded.host_blocks is not None
    assert tiers.counters.num_hit_blocks == [4] and tiers.counters.num_loads == 1
    assert offloaded.host_blocks.num_loaded == 4 and offloaded.host_blocks.num_offloaded >= 4
    admission = next(r for r in offloaded.records if 2 in r.admitted_ids)
    assert admission.num_computed_tokens[admission.request_ids.index(2)] == 16  # only the last token computed
    assert offloaded.outputs[2] == recomputed.outputs[2]
    assert offloaded.outputs == recomputed.outputs
    assert not tiers.problems()


def test_a_slow_link_recomputes_as_the_core_decides() -> None:
    tiers = host_tiers(read_bytes_per_s=1e3)  # loading 4 blocks would take minutes: recompute
    engine = run_three(tiers)
    assert tiers.counters.num_loads == 0 and tiers.counters.num_recomputes == 1
    assert engine.host_blocks is not None and engine.host_blocks.num_loaded == 0
    assert engine.outputs == run_three(None).outputs


def test_a_tier_written_on_compute_is_refused() -> None:
    tiers = KVTiers([TierStore(TierSpec(name="store", source=TierSource.COMPUTE))], host_tiers().cost,
                    block_size=BLOCK_SIZE)
    with pytest.raises(ValueError, match="on compute"):
        Engine(TINY, SchedulerConfig(num_blocks=12, block_size=BLOCK_SIZE), seed=SEED, kv_tiers=tiers)


def test_async_scheduling_loads_the_plan_it_queued() -> None:
    """Under async scheduling a plan's loads run a step after it was scheduled: the host copies it reads are
    kept until then, and the tokens still equal recompute's."""
    tiers = host_tiers()
    offloaded = run_three(tiers, async_scheduling=True)
    assert tiers.counters.num_loads == 1 and offloaded.host_blocks is not None
    assert offloaded.host_blocks.num_loaded == 4
    assert offloaded.outputs == run_three(None, async_scheduling=True).outputs
