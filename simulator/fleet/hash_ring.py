"""Consistent hashing for session affinity: ``stable_hash64``, the ``HashRing`` of replica ids, and
``AffinityRoute``, the session-affinity policy's choice on the fleet's live load list.

On the per-request path of a session-affinity fleet (every request hashes its session onto the ring), so
``fleetsim build-native`` compiles it; ``router.SessionAffinityRouter`` holds the policy's settings and
its ``choose`` on any views. Never Python's salted ``hash()``: routing is part of a seeded run and has to be
identical across processes. Standard library only.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from typing import Final

from simulator.core.mix import splitmix64
from simulator.core.request import RequestSpec
from simulator.fleet.loads import LoadLevels, least_loaded_index


def stable_hash64(x: int) -> int:
    """SplitMix64's finaliser (``core.mix``): a fixed 64-bit mix of an integer, identical in every process
    (unlike ``hash()``), and cheap enough to run per request."""
    return splitmix64(x)


class HashRing:
    """Consistent-hash ring: each replica id owns ``virtual_nodes`` pseudo-random points; a key belongs to
    the first point clockwise from its hash. Adding or removing one replica moves only the keys whose first
    point changes, about 1/N of them, which is why session caches survive scaling."""

    def __init__(self, replica_ids: Sequence[int], virtual_nodes: int) -> None:
        # Point of (replica, vnode): hash of the pair packed into one integer, so no two pairs collide
        # before hashing. Sorting by (point, replica_id) makes even a 64-bit collision deterministic.
        points = sorted(
            (stable_hash64((rid << 32) ^ vnode), rid) for rid in replica_ids for vnode in range(virtual_nodes)
        )
        self._points = [p for p, _ in points]
        self._owners = [rid for _, rid in points]
        self.num_replicas = len(set(replica_ids))

    def owner(self, key: int) -> int:
        """The first replica id ``walk`` yields for ``key``, without the walk."""
        start = bisect.bisect_right(self._points, stable_hash64(key))
        return self._owners[start % len(self._owners)]

    def walk(self, key: int) -> Iterator[int]:
        """Distinct replica ids in ring order from ``key``'s position: the owner first, then the fallbacks
        that bounded-load hashing tries in turn. Lazy, because the owner is almost always taken."""
        start = bisect.bisect_right(self._points, stable_hash64(key))
        seen: set[int] = set()
        size = len(self._owners)
        for step in range(size):
            rid = self._owners[(start + step) % size]
            if rid not in seen:
                seen.add(rid)
                yield rid
                if len(seen) == self.num_replicas:
                    return



_HOMES_KEPT: Final = 1 << 16
"""Sessions whose owner ``AffinityRoute`` keeps at most (~6 MB)."""


class AffinityRoute:
    """``SessionAffinityRouter.choose`` on live views (index = replica id), as one call per request: the ring
    of ids 0..n-1 (built again when the fleet's size changes), the bounded-load capacity from the load
    list's running total, the owner or the first replica under capacity clockwise, and least-loaded for a
    request without a session — the same answers, read off ``LoadLevels`` without a view or a sum."""

    __slots__ = ("_epsilon", "_homes", "_homes_kept", "_ring", "_ring_size", "_virtual_nodes", "levels")

    def __init__(self, levels: LoadLevels, epsilon: float, virtual_nodes: int,
                 homes_kept: int = _HOMES_KEPT) -> None:
        self.levels = levels
        self._epsilon = epsilon
        self._virtual_nodes = virtual_nodes
        self._ring: HashRing | None = None
        self._ring_size = -1
        self._homes: dict[int, int] = {}
        """Session -> its owner on the current ring: a session's later turns skip the hash and the search
        (~7 k instructions compiled: the hash's products are big ints). Emptied with a new ring, and when
        it outgrows ``homes_kept`` (a session's turns come minutes apart: recent sessions are the ones asked
        for again)."""
        self._homes_kept = homes_kept

    def __call__(self, spec: RequestSpec, now_s: float) -> int:
        levels = self.levels
        loads = levels.values
        n = len(loads)
        if n == 0:
            raise ValueError("no replicas to route to")
        session = spec.session_id
        if session is None:
            return least_loaded_index(loads, levels.lowest)
        ring = self._ring
        if ring is None or self._ring_size != n:
            ring = self._ring = HashRing(range(n), self._virtual_nodes)
            self._ring_size = n
            self._homes = {}
        cap = math.ceil((1.0 + self._epsilon) * float(levels.total + 1) / n)
        homes = self._homes
        home = homes.get(session, -1)
        if home < 0:
            home = ring.owner(session)
            if len(homes) >= self._homes_kept:
                homes.clear()
            homes[session] = home
        if loads[home] < cap:
            return home
        for rid in ring.walk(session):
            if loads[rid] < cap:
                return rid
        return least_loaded_index(loads, levels.lowest)
