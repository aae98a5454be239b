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


class PrefixView(Protocol):
    """What the route reads of a replica: its id, its load and the cached length of a hash chain."""

    @property
    def replica_id(self) -> int: ...

    @property
    def load(self) -> int: ...

    def prefix_match_blocks(self, block_hashes: Sequence[int]) -> float: ...


class PrefixAwareRoute:
    """``score_i = prefix_weight · hit_i − load_weight · load_i / max_j load_j`` (``router.PrefixAwareRouter``),
    the highest wins, ties by lower load, then lower replica id: the policy's one copy of the rule, which its
    ``choose`` and ``scores`` use too."""

    __slots__ = ("_load_weight", "_prefix_weight", "_views")

    def __init__(self, views: Sequence[PrefixView], prefix_weight: float, load_weight: float) -> None:
        if not views:
            raise ValueError("no replicas to route to")
        self._views: list[PrefixView] = list(views)
        self._prefix_weight = prefix_weight
        self._load_weight = load_weight

    def scores(self, spec: RequestSpec) -> list[float]:
        """Each replica's score for this request, in the order of the views."""
        views = self._views
        num_blocks = spec.num_hashed_blocks
        hashes = spec.known_hashes  # the values held: no cache holds a private tail's not yet derived
        loads = [view.load for view in views]
        max_load = max(loads)
        prefix_weight = self._prefix_weight
        load_weight = self._load_weight
        result: list[float] = []
        for i, view in enumerate(views):
            hit = view.prefix_match_blocks(hashes) / num_blocks if num_blocks else 0.0
            norm_load = loads[i] / max_load if max_load > 0 else 0.0
            result.append(prefix_weight * hit - load_weight * norm_load)
        return result

    def __call__(self, spec: RequestSpec, now_s: float) -> int:
        views = self._views
        scores = self.scores(spec)
        best = 0
        best_score = scores[0]
        best_load = views[0].load
        best_id = views[0].replica_id
        for i in range(1, len(views)):
            score = scores[i]
            if score < best_score:
                continue
            view = views[i]
            load = view.load
            rid = view.replica_id
            if score > best_score or load < best_load or (load == best_load and rid < best_id):
                best = i
                best_score = score
                best_load = load
                best_id = rid
        return best
