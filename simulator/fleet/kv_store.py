"""KV tiers on simulated replicas, and the cluster KV store they share (Mooncake-style).

``attach_tiers`` gives every replica's core its hierarchy (``core.kv_tiers.KVTiers``): the scenario's local
tiers, each its own, and the shared store, one ``TierStore`` object in every replica's hierarchy, so a
prefix one replica computed and let go can be loaded by any other at the store's network cost. The store
spans replicas, so it lives here, above the core; every decision about it (what goes in, what a hit loads)
is still the core's.

The replica asks ``TierTiming`` for the time of each step: a step that loads from tiers takes the load
time on top of its compute (or the longer of the two, with ``overlap``). ``TierTiming`` also keeps what
the results need: each request's load seconds, and each replica's cumulative hits per tier over time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from simulator.core.kv_manager import KVManager
from simulator.core.kv_tiers import KVTiers, TierStore
from simulator.core.step import StepPlan
from simulator.cost.cost_model import CostModel
from simulator.cost.kv_tiers import KVTiersConfig, TierPricing, block_bytes
from simulator.errors import ConfigError
from simulator.fleet.replica import Replica
from simulator.results.kv_tiers import TierFigures, TierReplica, tier_figures
from simulator.results.request_log import RequestLog
from simulator.results.summary import Summary


@dataclass(frozen=True, slots=True)
class TierGroup:
    """Replicas that share one model, block size and cost model (a fleet, or one pool of it)."""

    model: str
    block_size: int
    cost: CostModel
    num_replicas: int


@dataclass(slots=True)
class TierTiming:
    """Prices a replica's loads and records them (one per replica, attached as ``Replica.tier_timing``)."""

    tiers: KVTiers
    kv: KVManager
    """The replica's KV manager (its device hit counters)."""
    overlap: bool
    load_s: dict[int, float]
    """Request id -> seconds its loads added to its steps (the fleet's, shared by every replica's timing)."""
    times_s: list[float] = field(default_factory=list)
    """Step starts at which requests were admitted: the instants of the hit samples."""
    hit_tokens: list[list[int]] = field(default_factory=list)
    """At each of those instants: cumulative prompt tokens served by [device, tier 0, tier 1, ...]."""
    lookup_tokens: list[int] = field(default_factory=list)
    """At each of those instants: cumulative prompt tokens looked up."""

    def __call__(self, plan: StepPlan, start_s: float, step_s: float) -> float:
        loads = plan.loads
        if loads is not None:
            total = 0.0
            for op in loads:
                total += op.load_s
            if self.overlap:
                added = max(0.0, total - step_s)
                step_s = max(step_s, total)
            else:
                added = total
                step_s += total
            if added > 0.0:
                record = self.load_s
                for op in loads:
                    share = added * op.load_s / total if total > 0.0 else 0.0
                    record[op.request_id] = record.get(op.request_id, 0.0) + share
        if plan.admitted_ids:
            self._sample(start_s)
        return step_s

    def _sample(self, now_s: float) -> None:
        kv = self.kv
        counters = self.tiers.counters
        bs = self.tiers.block_size
        self.times_s.append(now_s)
        self.hit_tokens.append([kv.num_hit_tokens, *(n * bs for n in counters.num_hit_blocks)])
        self.lookup_tokens.append(kv.num_lookup_tokens)


def check_groups(config: KVTiersConfig, groups: Sequence[TierGroup]) -> None:
    """A store shared by pools needs one model and one block size (its blocks mean the same to all)."""
    if config.shared_store is None or len(groups) < 2:
        return
    first = groups[0]
    for group in groups[1:]:
        if group.model != first.model:
            raise ConfigError(f"a shared KV store serves one model, but the pools serve {first.model} and "
                              f"{group.model}", field="kv_tiers.shared_store")
        if group.block_size != first.block_size:
            raise ConfigError(f"a shared KV store holds one block size, but the pools use {first.block_size} and "
                              f"{group.block_size} tokens per block", field="kv_tiers.shared_store")
        if block_bytes(group.cost, group.block_size) != block_bytes(first.cost, first.block_size):
            raise ConfigError("a shared KV store holds one KV layout, but the pools' blocks differ in bytes",
                              field="kv_tiers.shared_store")


def attach_tiers(config: KVTiersConfig, groups: Sequence[TierGroup], replicas: Sequence[Replica],
                 load_s: dict[int, float]) -> list[TierTiming]:
    """Give each replica (``groups`` in order cover ``replicas``) its tiers and the shared store; returns
    each replica's timing."""
    check_groups(config, groups)
    if sum(g.num_replicas for g in groups) != len(replicas):
        raise ValueError(f"{len(replicas)} replicas but groups of {sum(g.num_replicas for g in groups)}")
    shared: TierStore | None = None
    if config.shared_store is not None:
        shared = TierStore(config.shared_store.spec(block_bytes=block_bytes(groups[0].cost, groups[0].block_size)))
        shared.shared = True
    timings = []
    index = 0
    for group in groups:
        size = block_bytes(group.cost, group.block_size)
        pricing = TierPricing(config.all_tiers(), group.cost, block_size=group.block_size)
        for _ in range(group.num_replicas):
            replica = replicas[index]
            index += 1
            stores = [TierStore(t.spec(block_bytes=size)) for t in config.tiers]
            if shared is not None:
                stores.append(shared)
            tiers = KVTiers(stores, pricing, block_size=group.block_size)
            tiers.match_weights = config.router_weights()
            replica.scheduler.attach_tiers(tiers)
            if shared is not None:
                # A decode run applies its steps lazily: another replica could read the store before the
                # run's evictions and computed blocks reach it. Replicas sharing a store go step by step.
                replica.fast_path = False
            timing = TierTiming(tiers, replica.scheduler.kv, config.overlap, load_s)
            replica.tier_timing = timing
            timings.append(timing)
    return timings


class TierRun:
    """One variant's tiers: attached to its replicas before the clock starts (``prepare``), read after."""

    def __init__(self, config: KVTiersConfig, groups: Sequence[TierGroup]) -> None:
        check_groups(config, groups)
        self.config = config
        self.groups = list(groups)
        self.load_s: dict[int, float] = {}
        self.timings: list[TierTiming] = []

    def prepare(self, replicas: Sequence[Replica]) -> None:
        self.timings = attach_tiers(self.config, self.groups, replicas, self.load_s)

    def records(self) -> list[TierReplica]:
        out = []
        for timing, group in zip(self.timings, [g for g in self.groups for _ in range(g.num_replicas)], strict=True):
            out.append(TierReplica(tiers=timing.tiers, device_hit_tokens=timing.kv.num_hit_tokens,
                                   lookup_tokens=timing.kv.num_lookup_tokens,
                                   block_bytes=block_bytes(group.cost, group.block_size), times_s=timing.times_s,
                                   hit_tokens=timing.hit_tokens, lookup_samples=timing.lookup_tokens))
        return out

    def figures(self, log: RequestLog, summary: Summary, *, warmup_s: float, end_s: float) -> TierFigures:
        num_gpus = sum(g.num_replicas * g.cost.profile.tp for g in self.groups)
        write_Bps = [t.write_gb_s * 1e9 * num_gpus for t in self.config.all_tiers()]
        return tier_figures(self.config.names(), self.records(), self.load_s, log, summary,
                            usd_per_hour=self.config.usd_per_hour(num_gpus), write_Bps=write_Bps,
                            warmup_s=warmup_s, end_s=end_s)
