"""``PrefixAwareRoute``: the prefix-aware policy's choice on live views (``router.PrefixAwareRouter.choose``'s
scores and tie-breaks) as one call per request.

Every request asks each replica how much of its prompt it caches and weighs that against the replica's
load; on the per-request path, so ``fleetsim build-native`` compiles it: one native loop over the replicas
instead of a list of scores and a ``min`` with a key function. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from simulator.core.request import RequestSpec
from simulator.fleet.prefix_index import PrefixIndex


class PrefixView(Protocol):
    """What the route reads of a replica: its id, its load and the cached length of a hash chain."""

    @property
    def replica_id(self) -> int: ...

    @property
    def load(self) -> int: ...

    def prefix_match_blocks(self, block_hashes: Sequence[int], num_blocks: int | None = None) -> float: ...


class PrefixAwareRoute:
    """``score_i = prefix_weight · hit_i − load_weight · load_i / max_j load_j`` (``router.PrefixAwareRouter``),
    the highest wins, ties by lower load, then lower replica id: the policy's one copy of the rule, which its
    ``choose`` and ``scores`` use too."""

    __slots__ = ("_index", "_live_loads", "_load_weight", "_prefix_weight", "_views")

    def __init__(self, views: Sequence[PrefixView], prefix_weight: float, load_weight: float,
                 live_loads: list[int] | None = None) -> None:
        if not views:
            raise ValueError("no replicas to route to")
        self._views: list[PrefixView] = list(views)
        self._prefix_weight = prefix_weight
        self._load_weight = load_weight
        self._live_loads = live_loads
        """Live views' load list (``LiveViews.loads``: index = replica id), until the first pick builds the
        fleet-wide index from them (``PrefixIndex``), then None."""
        self._index: PrefixIndex | None = None
        """The views' fleet-wide index, or None: each view walks its own cache (views that are not replicas,
        replicas with KV tiers)."""

    def scores(self, spec: RequestSpec) -> list[float]:
        """Each replica's score for this request, in the order of the views."""
        views = self._views
        num_blocks = spec.num_hashed_blocks
        loads = [view.load for view in views]
        max_load = max(loads)
        prefix_weight = self._prefix_weight
        load_weight = self._load_weight
        return [_score(prefix_weight, load_weight, _match(view, spec), num_blocks, loads[i], max_load)
                for i, view in enumerate(views)]

    def __call__(self, spec: RequestSpec, now_s: float) -> int:
        """The index of the view ``scores`` ranks first (ties by lower load, then lower replica id)."""
        if self._live_loads is not None:
            # The first pick, with the clock running: the replicas are as they serve (KV tiers, attached
            # before the clock starts, are there).
            views = self._views
            self._index = PrefixIndex(views, self._live_loads) if PrefixIndex.can_index(views) else None
            self._live_loads = None
        if self._index is not None and spec.num_hashed_blocks:
            return self._indexed(spec, self._index)
        return self._walked(spec)

    def _indexed(self, spec: RequestSpec, index: PrefixIndex) -> int:
        """``_walked``'s pick with every replica's hit from one walk of the fleet-wide index: all scored (the
        walks the pruning saves are nearly free here), the best by score, then lower load, then lower id (the
        index's replicas are in id order: the first of equals)."""
        num_blocks = spec.num_hashed_blocks
        loads: list[int] = index.loads[:]  # as they are now: the syncs below may finish requests
        max_load = 0
        for load in loads:  # (compiled, a native loop; the builtin max compares objects)
            if load > max_load:
                max_load = load
        prefix_weight = self._prefix_weight
        load_weight = self._load_weight
        hashes = spec.known_hashes
        lookup = spec.num_lookup_blocks
        hits = index.matches(hashes, lookup)
        known = len(hashes)
        best = -1
        best_score = 0.0
        best_load = 0
        for i in range(len(loads)):
            found = hits[i]
            # A walk that used up the values held: the rest derived, and asked again (as ``_match``).
            cached = index.match(i, spec.block_hashes, lookup) if _used_up(found, known, lookup) else found
            load = loads[i]
            score = _score(prefix_weight, load_weight, cached, num_blocks, load, max_load)
            if best < 0 or score > best_score or (score == best_score and load < best_load):
                best = i
                best_score = score
                best_load = load
        return best

    def _walked(self, spec: RequestSpec) -> int:
        """The index of the view ``scores`` ranks first (ties by lower load, then lower replica id), with
        fewer cache walks: replicas are visited by rising load, and one whose score could not reach the best
        so far even with the whole prompt cached is not walked. Its score is at most
        ``prefix_weight · len(hashes) / num_blocks − load_weight · norm_load`` in floating point too (both
        operations are monotone), so a strictly lower bound means strictly behind, and the bound only falls
        as the load rises: the first replica behind ends the search, and the pick is the same."""
        views = self._views
        num_blocks = spec.num_hashed_blocks
        loads = [view.load for view in views]
        max_load = max(loads)
        prefix_weight = self._prefix_weight
        load_weight = self._load_weight
        # The most a replica's hit term can be: every block a cache may hold cached (a walk never matches more).
        top_hit = spec.num_lookup_blocks / num_blocks if num_blocks else 0.0
        order = sorted(range(len(views)), key=loads.__getitem__)
        best = -1
        best_score = 0.0
        best_load = 0
        best_id = 0
        for i in order:
            load = loads[i]
            norm_load = load / max_load if max_load > 0 else 0.0
            if best >= 0 and prefix_weight * top_hit - load_weight * norm_load < best_score:
                break  # even a full hit stays behind the best, and so does every later (busier) one
            view = views[i]
            score = _score(prefix_weight, load_weight, _match(view, spec), num_blocks, load, max_load)
            rid = view.replica_id
            if (best < 0 or score > best_score
                    or (score == best_score and (load < best_load or (load == best_load and rid < best_id)))):
                best = i
                best_score = score
                best_load = load
                best_id = rid
        return best


def _match(view: PrefixView, spec: RequestSpec) -> float:
    """The view's cached length of the request's blocks, read with the hash values the spec holds: those of
    a tail not yet derived are needed only where the walk uses up the values (a session whose chain was
    indexed after all): derived then, and asked again."""
    hashes = spec.known_hashes
    lookup = spec.num_lookup_blocks
    hit = view.prefix_match_blocks(hashes, lookup)
    if _used_up(hit, len(hashes), lookup):
        hit = view.prefix_match_blocks(spec.block_hashes, lookup)
    return hit


def _used_up(found: float, num_known: int, num_lookup: int) -> bool:
    """Whether a walk that found ``found`` blocks used up the ``num_known`` hash values a spec holds while its
    lookup reaches further: the rest must be derived and the walk asked again."""
    return found == num_known < num_lookup


def _score(prefix_weight: float, load_weight: float, cached: float, num_blocks: int, load: int,
           max_load: int) -> float:
    """A replica's score, the policy's rule written once: ``prefix_weight · cached / num_blocks −
    load_weight · load / max_load``, each ratio 0 where its denominator is."""
    hit = cached / num_blocks if num_blocks else 0.0
    norm_load = load / max_load if max_load > 0 else 0.0
    return prefix_weight * hit - load_weight * norm_load
