"""``PrefixIndex``: which replicas' prefix caches index each block hash, fleet-wide (as llm-d's KV-block
index does), so that the prefix-aware router walks a prompt's hashes once instead of once per replica.

Every replica's ``BlockPool`` mirrors its index (``cached``) into one shared dict, hash -> a mask with bit
``r`` set while replica ``r``'s index holds the hash (``BlockPool.share_index``, kept as hashes are indexed
and evicted). One walk of a prompt's hashes along the shared dict drops each replica's bit at the first
hash that replica's own walk would stop at, which gives every replica's indexed length at once; each
replica then adds only what a session's chain would add there (``KVManager.chain_match``). The answers
are the per-replica walks' exactly (``Replica.prefix_match_blocks``): the route's pick does not change, only
its cost (16 replicas serving multi-turn sessions on shared system prompts: the walk was 54 % of a run).

Replicas with KV tiers are not indexed (a tier hit counts too, found by the tiers' own walk): the route walks
them one by one. On the per-request path: ``fleetsim build-native`` compiles it. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from simulator.core.kv_manager import KVManager
from simulator.fleet.replica import Replica

if TYPE_CHECKING:
    from mypy_extensions import i64  # compiled, a machine integer; plain int in Python


class PrefixIndex:
    """The shared index of ``replicas`` (in replica-id order: bit ``r`` is ``replicas[r]``, whose id is ``r``),
    attached to their pools on construction (with what they cache already)."""

    __slots__ = ("_index", "_kvs", "_replicas", "loads")

    def __init__(self, replicas: Sequence[object], loads: list[int]) -> None:
        if not self.can_index(replicas):
            raise ValueError("a fleet-wide prefix index needs replicas without KV tiers, indexed nowhere else")
        if len(loads) != len(replicas):
            raise ValueError(f"{len(loads)} loads for {len(replicas)} replicas")
        self._replicas: list[Replica] = [replica for replica in replicas if isinstance(replica, Replica)]
        self.loads = loads
        """Each replica's load (``Replica.load``), kept equal to it by the replicas (``LoadLevels.values``)."""
        self._kvs: list[KVManager] = [replica.scheduler.kv for replica in self._replicas]
        self._index: dict[Any, Any] = {}
        for r, kv in enumerate(self._kvs):
            kv.pool.share_index(self._index, 1 << r)

    @staticmethod
    def can_index(views: Sequence[object]) -> bool:
        """Whether these views are replicas whose cached length the index answers in full (none with KV
        tiers: their hits count what the tiers hold as well), not yet mirrored into another index."""
        return bool(views) and all(isinstance(view, Replica) and view.scheduler.tiers is None
                                   and not view.scheduler.kv.pool.shares_index for view in views)

    def match(self, r: int, block_hashes: Sequence[int], num_blocks: int | None = None) -> float:
        """Replica ``r``'s own ``prefix_match_blocks`` (a walk of its cache alone)."""
        return self._replicas[r].prefix_match_blocks(block_hashes, num_blocks)

    def matches(self, block_hashes: tuple[Any, ...], num_blocks: int | None = None) -> list[int]:
        """Every replica's ``prefix_match_blocks(block_hashes, num_blocks)``, in replica order (each replica
        synced first, as its own call would)."""
        for replica in self._replicas:
            replica.sync()
        kvs = self._kvs
        found = indexed_lengths(self._index, len(kvs), block_hashes)
        return [kv.chain_match(block_hashes, found[r], num_blocks) for r, kv in enumerate(kvs)]


def indexed_lengths(index: dict[Any, Any], num_pools: int, block_hashes: tuple[Any, ...]) -> list[int]:
    """How many leading hashes of ``block_hashes`` each of ``num_pools`` pools indexes (``cached``), from one
    walk of the index they share (``BlockPool.share_index``, pool ``r`` with bit ``1 << r``): a pool's bit
    leaves the walk at the first hash its own walk would stop at."""
    count: i64 = len(block_hashes)
    found: list[int] = [count] * num_pools
    alive: int = (1 << num_pools) - 1
    i: i64 = 0
    while i < count:
        held = index.get(block_hashes[i])
        mask: int = 0 if held is None else held
        gone = alive & ~mask
        if gone:
            # The pools whose walks stop here: their bits leave the walk.
            r = 0
            while gone:
                if gone & 1:
                    found[r] = i
                gone >>= 1
                r += 1
            alive &= mask
            if not alive:
                break
        i += 1
    return found
