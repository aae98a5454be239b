"""KV tiers below the device pool: where an evicted prefix block goes, and whether a hit there is loaded.

A block the device's prefix cache evicts (``BlockPool`` calls ``KVTiers.on_evict`` with its hash) moves
down instead of disappearing: into the first tier that admits it (host DRAM, then local NVMe, then a
store shared by replicas). A tier that is full evicts by its policy (LRU by default) and its victim moves
on down; what leaves the last tier is dropped. A tier holds hashes only: which device block, host page or
file holds the bytes is the runner's business (the simulator has none; the engine keeps tensors by hash).

At admission the prefix lookup continues past the device's hits into the tiers (``KVTiers.plan``): the
run of blocks found there may be loaded back (into fresh device blocks, priced by the tiers' links) or
recomputed. The choice is the one that finishes the prompt soonest according to a cost callback
(``TierCost``): loading the first m found blocks costs ``load_s`` for them plus prefilling the rest from
there; m is tried at every boundary between tiers, so a tier's run of blocks is loaded whole or not at all
(one cost evaluation per tier touched, not per block: a 32k-token prompt has 2,000 blocks). Within a run
the load time grows linearly with m while the prefill saved shrinks; where a cost model has a knee (a
prefill below it costs as much as at it) the best m can lie inside a run, which this does not search. The
scheduler commits the plan only when the request is admitted (``KVTiers.commit``).

Invariants (``KVTiers.problems``; tested by a hypothesis state machine):
- a tier holds each hash at most once, and never more than its capacity (swap reservations included);
- nothing is lost: every hash offered to a tier is stored, already there, or passed down (an offer made to
  a tier directly, a block written as it is computed or a device-fed tier's copy of an eviction, goes no
  further: the device still holds the block, or the eviction went down from the first tier as well); every
  hash a tier evicts is offered to the next one or, from the last, counted as dropped.

Swap preemption takes its room from the host tier (``reserve``/``release``): one host memory, not two.

Standard library only; imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeAlias

BlockHash: TypeAlias = Any
"""A block's hash, kept as the Python int object it arrives as. Compiled, an ``int`` is a machine integer:
a hash below 2**62 would be unboxed on its way in and boxed anew for every dict operation (an allocation,
a hash of the new object, and a compare by value in the dict instead of by identity): kv_tiers.yaml's
host_ssd_store variant ran 13 % more instructions in its event loop so. As an object it goes from the
request's tuple, through the block pool's index, into the tiers' dicts as it is (as ``block_pool`` keeps
its ids and hashes)."""


class TierKind(StrEnum):
    HOST = "host"
    """CPU memory over PCIe or NVLink-C2C; swap preemption takes its room from the first such tier."""
    DISK = "disk"
    """Local NVMe."""
    REMOTE = "remote"
    """A store over the network (a cluster store shared by replicas, Mooncake-style)."""


class TierSource(StrEnum):
    ABOVE = "above"
    """Takes what the tier above evicts (the device's evictions, for the first tier)."""
    DEVICE = "device"
    """Takes every block the device evicts, as well (a shared store written as soon as the GPU lets go)."""
    COMPUTE = "compute"
    """Takes every block as the device computes it (Mooncake's store: other replicas can load a prefix
    while its owner still holds it)."""


class EvictionOrder:
    """The order a tier gives up its hashes in: each hash held once, the next victim first. What a hit does
    to the order is the policy's (``touch``): each policy is a subclass, registered by name in
    ``EVICTION_POLICIES``.

    A base class rather than a protocol: compiled, a tier's calls on its order are then direct calls (a
    protocol's were generic Python calls: ~1,600 of the ~2,640 instructions an offer to a tier cost, in
    kv_tiers.yaml's host_ssd_store variant).

    Kept as a queue of hashes in the order they were stored or touched, and per held hash the number of
    its entries in it: a touch appends one more, and a hash's place is its last entry (the earlier ones
    are stale, skipped when they reach the head). A plain dict and a list: an ``OrderedDict``'s store,
    move and pop from the front each cost several probes of its index and, as its table was rebuilt under
    the churn, a rebuild of its node index too (the same variant's event loop ran 5 % more instructions
    on it). Stale
    entries beyond ``compact_slack`` more than the live ones are dropped in one pass (amortised O(1))."""

    def __init__(self, *, compact_slack: int = 1024) -> None:
        self._entries: dict[BlockHash, int] = {}
        """Each held hash -> its entries in ``_queue`` (its place is the last one)."""
        self._queue: list[BlockHash] = []
        """Hashes as they were stored or touched, oldest first; those before ``_head`` are read."""
        self._head = 0
        self._compact_slack = compact_slack

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, block_hash: BlockHash) -> None:
        """Store a hash it does not hold: the last victim."""
        self._entries[block_hash] = 1
        self._queue.append(block_hash)

    def touch(self, block_hash: BlockHash) -> None:
        """A hit on a held hash."""
        raise NotImplementedError

    def touch_range(self, block_hashes: Sequence[BlockHash], start: int, stop: int) -> None:
        """``touch`` each of ``block_hashes[start:stop]`` it holds, in order."""
        raise NotImplementedError

    def _renew(self, block_hash: BlockHash) -> None:
        """Move a held hash to the back: the last victim."""
        entries = self._entries
        entries[block_hash] += 1
        queue = self._queue
        queue.append(block_hash)
        if len(queue) - self._head > 2 * len(entries) + self._compact_slack:
            self._compact()

    def pop_victim(self) -> BlockHash:
        queue = self._queue
        entries = self._entries
        head = self._head
        while True:
            block_hash = queue[head]
            head += 1
            count = entries[block_hash]
            if count == 1:
                del entries[block_hash]
                break
            entries[block_hash] = count - 1  # a stale entry: the hash was touched since
        if head > self._compact_slack and 2 * head > len(queue):
            del queue[:head]  # the entries read are most of the list: drop them (amortised O(1) each)
            head = 0
        self._head = head
        return block_hash

    def hashes(self) -> list[BlockHash]:
        """Held hashes, next victim first."""
        remaining = dict(self._entries)
        out: list[BlockHash] = []
        queue = self._queue
        for position in range(self._head, len(queue)):
            block_hash = queue[position]
            count = remaining[block_hash]
            if count == 1:
                out.append(block_hash)
            else:
                remaining[block_hash] = count - 1
        return out

    def _compact(self) -> None:
        """The queue without its stale entries: each held hash once, at its place."""
        live = self.hashes()
        entries = self._entries
        for block_hash in live:
            entries[block_hash] = 1
        self._queue = live
        self._head = 0

    def members(self) -> Container[BlockHash]:
        """The held hashes as a container kept current (looked up without a call per hash)."""
        return self._entries


class LRUOrder(EvictionOrder):
    """Least recently stored or hit first."""

    def touch(self, block_hash: BlockHash) -> None:
        self._renew(block_hash)

    def touch_range(self, block_hashes: Sequence[BlockHash], start: int, stop: int) -> None:
        entries = self._entries
        for position in range(start, stop):
            block_hash = block_hashes[position]
            if block_hash in entries:
                self._renew(block_hash)


class FIFOOrder(EvictionOrder):
    """First stored first out; a hit does not rejuvenate a block."""

    def touch(self, block_hash: BlockHash) -> None:
        pass

    def touch_range(self, block_hashes: Sequence[BlockHash], start: int, stop: int) -> None:
        pass


EVICTION_POLICIES: dict[str, type[EvictionOrder]] = {"lru": LRUOrder, "fifo": FIFOOrder}
"""Tier eviction policies by name (the scenario's ``eviction`` field picks one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TierSpec:
    """One tier's bookkeeping settings (its link's bandwidth and latency are the cost model's)."""

    name: str
    kind: TierKind = TierKind.HOST
    capacity_blocks: int | None = None
    """Blocks it holds; None = unbounded."""
    eviction: str = "lru"
    """A name in ``EVICTION_POLICIES``."""
    min_hits: int = 0
    """Admission: 0 stores every block offered (write-through on eviction); k stores only blocks hit at
    least k times (device or tier hits) before they were offered."""
    source: TierSource = TierSource.ABOVE

    def __post_init__(self) -> None:
        if self.capacity_blocks is not None and self.capacity_blocks < 0:
            raise ValueError(f"tier {self.name}: capacity_blocks must be >= 0, got {self.capacity_blocks}")
        if self.eviction not in EVICTION_POLICIES:
            raise ValueError(f"tier {self.name}: eviction must be one of {sorted(EVICTION_POLICIES)}, "
                             f"got {self.eviction!r}")
        if self.min_hits < 0:
            raise ValueError(f"tier {self.name}: min_hits must be >= 0, got {self.min_hits}")


class TierStore:
    """One tier's contents: hashes in eviction order, and the room swap preemption holds in it."""

    def __init__(self, spec: TierSpec) -> None:
        self.spec = spec
        self._order: EvictionOrder = EVICTION_POLICIES[spec.eviction]()
        self.num_reserved = 0
        """Blocks held by swapped-out requests (host tier only)."""
        self.num_offered = 0
        self.num_stored = 0
        self.num_present = 0
        """Offers of a hash it already held (refreshed in place, not stored twice)."""
        self.num_rejected = 0
        """Offers its admission rule (or a zero capacity) turned away: passed down, unless made directly."""
        self.num_rejected_direct = 0
        """Of those, offers made to it directly (written as blocks are computed, or a device-fed tier's copy
        of an eviction), which are not passed down: the device still holds the block, or the eviction went
        down the hierarchy from the first tier as well."""
        self.num_evicted = 0
        self.shared = False
        """Shared by several replicas' hierarchies (its counters are theirs together)."""
        self.membership_version = 0
        """Moves whenever a hash enters or leaves (``KVTiers.plan`` reuses a lookup while none has)."""
        self.order_version = 0
        """Moves whenever its eviction order may have changed: a hash stored, touched or evicted
        (``KVTiers.refresh`` skips touching again a run it touched last, with nothing done since)."""

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._order

    def __len__(self) -> int:
        return len(self._order)

    @property
    def capacity_blocks(self) -> int | None:
        return self.spec.capacity_blocks

    def hashes(self) -> list[BlockHash]:
        """Held hashes, next victim first."""
        return self._order.hashes()

    def touch(self, block_hash: BlockHash) -> None:
        self.order_version += 1
        self._order.touch(block_hash)

    def touch_range(self, block_hashes: Sequence[BlockHash], start: int, stop: int) -> None:
        """Touch each of ``block_hashes[start:stop]`` it holds, in order."""
        self.order_version += 1
        self._order.touch_range(block_hashes, start, stop)

    def members(self) -> Container[BlockHash]:
        """Its hashes, as a container kept current: ``hash in members()`` is ``hash in self``."""
        return self._order.members()

    def offer(self, block_hash: BlockHash, num_hits: int) -> tuple[bool, list[BlockHash] | None]:
        """Store ``block_hash`` if admitted. Returns (taken: stored or already held, the victims it evicted;
        None when none, as for most offers, which then make no list)."""
        self.num_offered += 1
        order = self._order
        if block_hash in order:
            self.num_present += 1
            self.order_version += 1
            order.touch(block_hash)
            return True, None
        capacity = self.spec.capacity_blocks
        if num_hits < self.spec.min_hits or (capacity is not None and capacity - self.num_reserved < 1):
            self.num_rejected += 1
            return False, None
        victims = self._make_room(1)
        order.add(block_hash)
        self.membership_version += 1
        self.order_version += 1
        self.num_stored += 1
        return True, victims

    def reserve(self, num_blocks: int) -> list[BlockHash] | None:
        """Room for ``num_blocks`` swapped-out blocks, evicting cached hashes (returned) as needed; None
        (nothing changed) when even an empty tier would not have the room."""
        capacity = self.spec.capacity_blocks
        if capacity is not None and self.num_reserved + num_blocks > capacity:
            return None
        victims = self._make_room(num_blocks)
        self.num_reserved += num_blocks
        return [] if victims is None else victims

    def release(self, num_blocks: int) -> None:
        if num_blocks > self.num_reserved:
            raise ValueError(f"tier {self.spec.name}: releasing {num_blocks} blocks, {self.num_reserved} reserved")
        self.num_reserved -= num_blocks

    def _make_room(self, num_blocks: int) -> list[BlockHash] | None:
        """Evict until ``num_blocks`` more fit (or nothing is left); the victims, None when there were none."""
        capacity = self.spec.capacity_blocks
        order = self._order
        if capacity is None or not len(order) or len(order) + self.num_reserved + num_blocks <= capacity:
            return None
        victims: list[BlockHash] = []
        while len(order) and len(order) + self.num_reserved + num_blocks > capacity:
            victims.append(order.pop_victim())
        self.num_evicted += len(victims)
        self.membership_version += 1
        self.order_version += 1
        return victims


class TierCost(Protocol):
    """What the load-or-recompute decision asks of a cost model (the simulator's: ``cost.kv_tiers``)."""

    def load_s(self, num_blocks_by_tier: Sequence[int]) -> float:
        """Seconds to bring these blocks (per tier, in the hierarchy's order) into device memory."""
        ...

    def prefill_s(self, num_computed_tokens: int, num_new_tokens: int) -> float:
        """Seconds to prefill ``num_new_tokens`` after ``num_computed_tokens`` already computed."""
        ...


@dataclass(slots=True)
class TierLoad:
    """A load the scheduler may commit: the found blocks' tiers (in prefix order), and how many of them
    to load (the rest is recomputed)."""

    tiers: list[int]
    """Per found block after the device hits, the index of the first tier holding it."""
    num_load_blocks: int
    load_s: float
    """The cost callback's load time of the blocks loaded."""

    @property
    def num_found_blocks(self) -> int:
        return len(self.tiers)

    def blocks_by_tier(self, num_tiers: int) -> list[int]:
        counts = [0] * num_tiers
        for tier in self.tiers[: self.num_load_blocks]:
            counts[tier] += 1
        return counts


@dataclass(frozen=True, slots=True)
class LoadOp:
    """Blocks of one request copied from tiers into fresh device blocks before its step computes."""

    request_id: int
    block_ids: tuple[int, ...]
    """Device blocks written, in prefix order."""
    block_hashes: tuple[int, ...]
    tiers: tuple[int, ...]
    """Per block, the tier read."""
    load_s: float


@dataclass(slots=True)
class TierCounters:
    """One replica's tier figures over its life (device hits are the KV manager's)."""

    num_hit_blocks: list[int]
    """Per tier: blocks loaded from it (counted on a request's first admission only, as device hits)."""
    num_read_blocks: list[int]
    """Per tier: blocks read, re-admissions after preemption included."""
    num_loads: int = 0
    """Admissions that loaded from a tier."""
    num_recomputes: int = 0
    """Admissions that found blocks in a tier and recomputed some or all of them (cheaper)."""
    num_recomputed_blocks: int = 0
    num_device_evictions: int = 0
    """Hashes that left the device's prefix cache (offered to the tiers)."""
    num_dropped: int = 0
    """Hashes no tier kept (evicted from, or turned away by, the last)."""
    hit_counts: dict[int, int] = field(default_factory=dict)
    """Hits of each hash seen (device or tier), for hit-count admission."""


class KVTiers:
    """A replica's tiers below its device pool (the last may be a store other replicas share)."""

    def __init__(self, stores: Sequence[TierStore], cost: TierCost, *, block_size: int) -> None:
        if not stores:
            raise ValueError("KVTiers needs at least one tier")
        self.stores = list(stores)
        self.cost = cost
        self.block_size = block_size
        self.counters = TierCounters(num_hit_blocks=[0] * len(stores), num_read_blocks=[0] * len(stores))
        self._count_hits = any(s.spec.min_hits > 0 for s in stores)
        self.host: TierStore | None = next((s for s in stores if s.spec.kind is TierKind.HOST), None)
        """The tier swap preemption takes its room from (the first host tier), if any."""
        self.match_weights = [1.0] * len(stores)
        """What a block held in each tier counts for a prefix-aware router against one on the device (a
        block there must be loaded first); the fleet sets them."""
        self.written_on_compute = [i for i, s in enumerate(stores) if s.spec.source is TierSource.COMPUTE]
        """Tiers written as blocks are computed (``on_compute``); the pool calls it only when there are any."""
        self._members = [s.members() for s in self.stores]
        """Each tier's hashes, looked up directly by ``find``."""
        # A queue head the KV cannot take yet is planned again step after step, its lookup walking its whole
        # prompt (a 24k-token document's 1,500 blocks) and its refresh touching as many: ``plan`` keeps its
        # last answer, reused while no tier's membership moved, and ``refresh`` skips a run it touched last
        # while no tier's order moved since (touching it again would leave every order as it is).
        self._plan_hashes: tuple[int, ...] | None = None
        self._plan_args = (0, 0, 0)
        """(device hits, prompt tokens, max blocks) of the plan kept."""
        self._plan_versions: list[int] = []
        self._plan: TierLoad | None = None
        self._refreshed: TierLoad | None = None
        self._refreshed_hashes: Sequence[BlockHash] | None = None
        self._refreshed_start = 0
        self._refreshed_versions: list[int] = []

    # ----- eviction -----------------------------------------------------------------------------------

    def on_evict(self, block_hash: BlockHash, block_id: int | None = None) -> None:
        """The device's prefix cache let go of ``block_hash`` (held in device block ``block_id``, which the
        bookkeeping does not need): it moves down."""
        self.counters.num_device_evictions += 1
        hits = self.counters.hit_counts.get(block_hash, 0) if self._count_hits else 0
        self._offer_from(0, block_hash, hits)
        for index in range(1, len(self.stores)):
            if self.stores[index].spec.source is TierSource.DEVICE:
                self._offer_direct(index, block_hash, hits)

    def on_compute(self, block_hash: BlockHash) -> None:
        """The device indexed ``block_hash`` (its KV is being computed): tiers written on compute take it."""
        hits = self.counters.hit_counts.get(block_hash, 0) if self._count_hits else 0
        for index in self.written_on_compute:
            self._offer_direct(index, block_hash, hits)

    def _offer_direct(self, index: int, block_hash: BlockHash, hits: int) -> None:
        """Offer to tier ``index`` alone: turned away, it goes no further (its victims still move down)."""
        if not self._offer_one(index, block_hash, hits):
            self.stores[index].num_rejected_direct += 1

    def _offer_from(self, start: int, block_hash: BlockHash, hits: int) -> None:
        """Offer to tier ``start``; turned away, to the next; each victim on to the tier below its own."""
        stores = self.stores
        index = start
        while index < len(stores):
            taken = self._offer_one(index, block_hash, hits)
            if taken:
                return
            index += 1
        self.counters.num_dropped += 1

    def _offer_one(self, index: int, block_hash: BlockHash, hits: int) -> bool:
        taken, victims = self.stores[index].offer(block_hash, hits)
        if victims is None:
            return taken
        for victim in victims:
            victim_hits = self.counters.hit_counts.get(victim, 0) if self._count_hits else 0
            self._offer_from(index + 1, victim, victim_hits)
        return taken

    # ----- lookup and the load-or-recompute decision -----------------------------------------------

    def find(self, block_hashes: Sequence[BlockHash], start: int, stop: int) -> list[int]:
        """Per block from ``start`` on (before ``stop``), the first tier holding it, while found."""
        members = self._members
        num_tiers = len(members)
        found: list[int] = []
        end = len(block_hashes)
        if stop < end:
            end = stop
        for position in range(start, end):
            block_hash = block_hashes[position]
            index = 0
            while index < num_tiers and block_hash not in members[index]:
                index += 1
            if index == num_tiers:
                break
            found.append(index)
        return found

    def plan(self, block_hashes: Sequence[BlockHash], num_device_hits: int, num_prompt_tokens: int,
             max_blocks: int) -> TierLoad | None:
        """The blocks after the device's ``num_device_hits`` hits found in the tiers (at most up to
        ``max_blocks`` in all), and how many of them to load: the m that minimises load time plus the
        prefill of the prompt from there. None when no tier holds the next block.

        The same arguments with no tier's membership moved since give the same answer (the same object:
        a ``TierLoad`` is not changed by its users)."""
        stores = self.stores
        if isinstance(block_hashes, tuple):  # immutable: the same object holds the same hashes
            if (block_hashes is self._plan_hashes
                    and self._plan_args == (num_device_hits, num_prompt_tokens, max_blocks)
                    and self._versions_match(self._plan_versions, True)):
                return self._plan
            self._plan_hashes = block_hashes
            self._plan_args = (num_device_hits, num_prompt_tokens, max_blocks)
            self._plan_versions = [store.membership_version for store in stores]
            self._plan = self._search(block_hashes, num_device_hits, num_prompt_tokens, max_blocks)
            return self._plan
        return self._search(block_hashes, num_device_hits, num_prompt_tokens, max_blocks)

    def _versions_match(self, saved: list[int], membership: bool) -> bool:
        stores = self.stores
        for index in range(len(stores)):
            store = stores[index]
            version = store.membership_version if membership else store.order_version
            if version != saved[index]:
                return False
        return True

    def _search(self, block_hashes: Sequence[BlockHash], num_device_hits: int, num_prompt_tokens: int,
                max_blocks: int) -> TierLoad | None:
        """``plan``, worked out."""
        found = self.find(block_hashes, num_device_hits, max_blocks)
        if not found:
            return None
        bs = self.block_size
        cost = self.cost
        base = num_device_hits * bs
        best_m = 0
        best_s = cost.prefill_s(base, num_prompt_tokens - base)
        best_load_s = 0.0
        counts = [0] * len(self.stores)
        for m in range(1, len(found) + 1):
            counts[found[m - 1]] += 1
            if m < len(found) and found[m] == found[m - 1]:
                continue  # not a boundary between tiers (runs load whole or not at all)
            load_s = cost.load_s(counts)
            computed = base + m * bs
            total = load_s + cost.prefill_s(computed, num_prompt_tokens - computed)
            if total < best_s:
                best_m, best_s, best_load_s = m, total, load_s
        return TierLoad(found, best_m, best_load_s)

    def commit(self, load: TierLoad, request_id: int, block_ids: Sequence[int], block_hashes: Sequence[BlockHash],
               *, first_admission: bool) -> LoadOp | None:
        """The request was admitted with ``load``: count it, refresh the blocks read in their tiers, and
        return the copy the runner performs (``block_ids``: the fresh device blocks, prefix order)."""
        counters = self.counters
        n = load.num_load_blocks
        if n < load.num_found_blocks:
            counters.num_recomputes += 1
            counters.num_recomputed_blocks += load.num_found_blocks - n
        if n == 0:
            return None
        counters.num_loads += 1
        for position in range(n):
            tier = load.tiers[position]
            counters.num_read_blocks[tier] += 1
            if first_admission:
                counters.num_hit_blocks[tier] += 1
        if self._count_hits:
            self.count_hits(block_hashes[:n])
        return LoadOp(request_id, tuple(block_ids), tuple(block_hashes[:n]), tuple(load.tiers[:n]), load.load_s)

    def refresh(self, load: TierLoad, block_hashes: Sequence[BlockHash], start: int) -> None:
        """Make the blocks a load will read the most recently used of their tiers, before the admission
        allocates device blocks (whose evictions move down and could otherwise push them out first).
        ``block_hashes[start:]`` are the found blocks. A tier's blocks are touched in prefix order (touches in
        different tiers do not interact), one call per run of blocks in one tier."""
        if (load is self._refreshed and block_hashes is self._refreshed_hashes and isinstance(block_hashes, tuple)
                and start == self._refreshed_start and self._versions_match(self._refreshed_versions, False)):
            return  # this run, touched last in every tier with nothing since: already the most recent
        tiers = load.tiers
        n = load.num_load_blocks
        position = 0
        while position < n:
            tier = tiers[position]
            end = position + 1
            while end < n and tiers[end] == tier:
                end += 1
            self.stores[tier].touch_range(block_hashes, start + position, start + end)
            position = end
        self._refreshed = load
        self._refreshed_hashes = block_hashes
        self._refreshed_start = start
        self._refreshed_versions = [store.order_version for store in self.stores]

    def count_hits(self, block_hashes: Sequence[BlockHash]) -> None:
        """Hits on these hashes (for hit-count admission; a no-op without such a tier)."""
        if not self._count_hits:
            return
        counts = self.counters.hit_counts
        for block_hash in block_hashes:
            counts[block_hash] = counts.get(block_hash, 0) + 1

    def prefix_match_blocks(self, block_hashes: Sequence[BlockHash], start: int) -> float:
        """Blocks from ``start`` on that the tiers hold, in a run, each counted at its tier's weight in
        ``match_weights``: what a prefix-aware router adds to a replica's device match."""
        weights = self.match_weights
        return sum(weights[tier] for tier in self.find(block_hashes, start, len(block_hashes)))

    # ----- swap preemption's room in host memory ------------------------------------------------------

    def reserve_host(self, num_blocks: int) -> bool:
        """Room in the host tier for a swapped-out request; its cached victims move down."""
        host = self.host
        if host is None:
            return False
        victims = host.reserve(num_blocks)
        if victims is None:
            return False
        index = self.stores.index(host)
        for victim in victims:
            self._offer_from(index + 1, victim, self.counters.hit_counts.get(victim, 0))
        return True

    def release_host(self, num_blocks: int) -> None:
        if self.host is not None:
            self.host.release(num_blocks)

    # ----- invariants --------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Broken invariants (none: an empty list). See the module docstring."""
        out: list[str] = []
        top = self.stores[0]
        evictions = self.counters.num_device_evictions
        if not top.shared and top.spec.source is TierSource.ABOVE and top.num_offered != evictions:
            out.append(f"tier {top.spec.name}: offered {top.num_offered} != device evictions "
                       f"{self.counters.num_device_evictions}")
        for index, store in enumerate(self.stores):
            name = store.spec.name
            held = store.hashes()
            if len(set(held)) != len(held):
                out.append(f"tier {name} holds a hash twice")
            capacity = store.capacity_blocks
            if capacity is not None and len(held) + store.num_reserved > capacity:
                out.append(f"tier {name} holds {len(held)} + {store.num_reserved} reserved > {capacity} blocks")
            if store.num_stored - store.num_evicted != len(held):
                out.append(f"tier {name}: stored {store.num_stored} - evicted {store.num_evicted} != held {len(held)}")
            if store.num_offered != store.num_stored + store.num_present + store.num_rejected:
                out.append(f"tier {name}: offers {store.num_offered} != stored + present + rejected")
            if index > 0 and store.spec.source is TierSource.ABOVE and not store.shared:
                above = self.stores[index - 1]
                if store.num_offered != above.num_evicted + above.num_rejected - above.num_rejected_direct:
                    out.append(f"tier {name}: offered {store.num_offered} != evicted + rejected (and passed down) "
                               "above")
        return out
