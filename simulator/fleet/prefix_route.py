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
    """What the route reads of a replica: its load and the cached length of a hash chain."""

    @property
    def load(self) -> int: ...

    def prefix_match_blocks(self, block_hashes: Sequence[int]) -> float: ...


class PrefixAwareRoute:
    """``score_i = prefix_weight · hit_i − load_weight · load_i / max_j load_j``, the highest wins, ties by
    lower load, then lower index (= replica id on live views): what ``PrefixAwareRouter.choose`` picks, with
    the same floating-point operations in the same order."""

    __slots__ = ("_load_weight", "_prefix_weight", "_views")

    def __init__(self, views: Sequence[PrefixView], prefix_weight: float, load_weight: float) -> None:
        if not views:
            raise ValueError("no replicas to route to")
        self._views: list[PrefixView] = list(views)
        self._prefix_weight = prefix_weight
        self._load_weight = load_weight

    def __call__(self, spec: RequestSpec, now_s: float) -> int:
        views = self._views
        num_blocks = spec.num_hashed_blocks
        hashes = spec.known_hashes  # the values held: no cache holds a private tail's not yet derived
        loads = [view.load for view in views]
        max_load = max(loads)
        prefix_weight = self._prefix_weight
        load_weight = self._load_weight
        best = -1
        best_score = 0.0
        best_load = 0
        for i, view in enumerate(views):
            load = loads[i]
            hit = view.prefix_match_blocks(hashes) / num_blocks if num_blocks else 0.0
            norm_load = load / max_load if max_load > 0 else 0.0
            score = prefix_weight * hit - load_weight * norm_load
            if best < 0 or score > best_score or (score == best_score and load < best_load):
                best = i
                best_score = score
                best_load = load
        return best
