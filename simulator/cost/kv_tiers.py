"""KV tiers in a scenario, and their pricing: what each tier holds, its link, and what a load costs.

The ``kv_tiers`` section lists the tiers below every replica's GPU pool (host DRAM, local NVMe), and an
optional store shared by all replicas (Mooncake-style), each with a capacity, a read and write bandwidth
and a latency. Capacities and bandwidths are per GPU, as vLLM's ``swap_space``: a tensor-parallel replica
keeps and moves each rank's KV shard in parallel, so one rank's bytes per token price a block.

``TierPricing`` is the cost callback of the core's load-or-recompute decision (``core.kv_tiers.TierCost``):
a load reads each tier's blocks over its link in turn (latency + bytes / read bandwidth per tier touched);
a prefill is the cost model's time of a one-request step. Writes (blocks moving down on eviction) are
counted in bytes but not charged to a step: they leave the GPU asynchronously, as vLLM's offloading
connector and LMCache store them.

Device-free; every bad value is one ``ConfigError`` naming the field (via the scenario loader).
"""

from collections.abc import Sequence
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.core.kv_tiers import EVICTION_POLICIES, TierKind, TierSource, TierSpec
from simulator.cost.cost_model import CostModel

GIB = 2**30


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class TierConfig(_Frozen):
    """One tier below the GPU pool."""

    name: str = Field(min_length=1, max_length=64)
    """What reports call it (host, ssd, ...)."""
    kind: TierKind = TierKind.HOST
    """host, disk or remote; swap preemption takes its room from the first host tier."""
    capacity_gib: float | None = Field(default=None, ge=0)
    """KV it holds per GPU, GiB; omitted (null) = unbounded."""
    read_gb_s: float = Field(gt=0)
    """Bandwidth of loads into GPU memory, GB/s (1e9 bytes/s) per GPU."""
    write_gb_s: float = Field(gt=0)
    """Bandwidth of blocks written down on eviction, GB/s per GPU (bytes counted; writes are asynchronous)."""
    latency_us: float = Field(default=0.0, ge=0)
    """Fixed cost of one load from this tier, microseconds."""
    eviction: str = "lru"
    """Which held block goes when it is full: lru or fifo."""
    min_hits: int = Field(default=0, ge=0)
    """Admission: 0 = every evicted block (write-through on eviction); k = only blocks hit at least k times."""
    source: TierSource = TierSource.ABOVE
    """above: takes what the tier above evicts; device: every block the GPU evicts, as well; compute: every
    block as the GPU computes it (a shared store, Mooncake's way)."""
    router_weight: float | None = Field(default=None, ge=0, le=1)
    """What a prefix block held here counts for the prefix-aware router against one on the GPU; None = 1
    for a replica's own tier (its blocks are this replica's alone, and a load from it is cheap) and 0.5 for
    the shared store (every replica sees the same store: counted fully, it would erase a replica's own GPU
    hits; at 0.5 a replica holding a prefix on its GPU ranks above one that must load it, and that one above
    one that must compute it)."""
    usd_per_gib_hour: float = Field(default=0.0, ge=0)
    """What its capacity costs, $ per GiB-hour (0 = not priced); added to the GPUs' cost per output token."""

    @model_validator(mode="after")
    def _priced_capacity(self) -> Self:
        if self.usd_per_gib_hour > 0 and self.capacity_gib is None:
            raise ValueError("an unbounded tier (no capacity_gib) cannot be priced: give capacity_gib or drop "
                             "usd_per_gib_hour")
        return self

    @field_validator("eviction")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in EVICTION_POLICIES:
            raise ValueError(f"eviction must be one of {', '.join(sorted(EVICTION_POLICIES))}, not {value!r}")
        return value

    def spec(self, *, block_bytes: int) -> TierSpec:
        """The core's bookkeeping settings for blocks of ``block_bytes`` bytes (per GPU)."""
        blocks = None if self.capacity_gib is None else int(self.capacity_gib * GIB // block_bytes)
        return TierSpec(name=self.name, kind=self.kind, capacity_blocks=blocks, eviction=self.eviction,
                        min_hits=self.min_hits, source=self.source)


class KVTiersConfig(_Frozen):
    """KV tiers below every replica's GPU pool, and a store they all share."""

    tiers: list[TierConfig] = Field(default_factory=list)
    """Replica-local tiers, top (nearest the GPU) first."""
    shared_store: TierConfig | None = None
    """A store shared by every replica of the fleet, below the local tiers (Mooncake's KV pool); its
    capacity is the whole store's."""
    overlap: bool = False
    """Loads overlap the step's compute (a step takes the longer of the two) instead of adding to it."""

    @field_validator("tiers")
    @classmethod
    def _distinct_names(cls, value: list[TierConfig]) -> list[TierConfig]:
        names = [t.name for t in value]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must differ, got {names}")
        return value

    @model_validator(mode="after")
    def _some_tier(self) -> Self:
        if not self.tiers and self.shared_store is None:
            raise ValueError("kv_tiers needs tiers (replica-local) or a shared_store: it names no tier")
        return self

    def all_tiers(self) -> list[TierConfig]:
        """The local tiers then the shared store (the hierarchy's order)."""
        return [*self.tiers, *([self.shared_store] if self.shared_store is not None else [])]

    def names(self) -> list[str]:
        return [t.name for t in self.all_tiers()]

    def router_weights(self) -> list[float]:
        """Each tier's ``router_weight``, defaults resolved (the hierarchy's order)."""
        local = [1.0 if t.router_weight is None else t.router_weight for t in self.tiers]
        store = self.shared_store
        if store is None:
            return local
        return [*local, 0.5 if store.router_weight is None else store.router_weight]

    def usd_per_hour(self, num_gpus: int) -> float:
        """What the tiers' capacity costs an hour on a fleet of ``num_gpus`` GPUs (local tiers are per GPU)."""
        local = sum((t.capacity_gib or 0.0) * t.usd_per_gib_hour for t in self.tiers) * num_gpus
        store = self.shared_store
        return local + (0.0 if store is None else (store.capacity_gib or 0.0) * store.usd_per_gib_hour)


def block_bytes(cost: CostModel, block_size: int) -> int:
    """Bytes of one KV block on one GPU."""
    return int(cost.profile.memory.kv_bytes_per_token) * block_size


class TierPricing:
    """The core's ``TierCost`` for one replica: tier links from the config, prefill from the cost model."""

    def __init__(self, tiers: Sequence[TierConfig], cost: CostModel, *, block_size: int) -> None:
        self.block_bytes = block_bytes(cost, block_size)
        self._seconds_per_block = [self.block_bytes / (t.read_gb_s * 1e9) for t in tiers]
        self._latency_s = [t.latency_us * 1e-6 for t in tiers]
        self.write_Bps = [t.write_gb_s * 1e9 for t in tiers]
        self._cost = cost

    def load_s(self, num_blocks_by_tier: Sequence[int]) -> float:
        total = 0.0
        for index, n in enumerate(num_blocks_by_tier):
            if n:
                total += self._latency_s[index] + n * self._seconds_per_block[index]
        return total

    def prefill_s(self, num_computed_tokens: int, num_new_tokens: int) -> float:
        n = float(num_new_tokens)
        pairs = n * (num_computed_tokens + n / 2)
        return self._cost.time_of(1, num_new_tokens, 0, 0, num_new_tokens, pairs, 0)
