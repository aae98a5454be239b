"""Routing policies of the fleet: which replica receives each arriving request.

Every policy is a small class behind one protocol, ``Router.choose(spec, views, now_s) -> index``, registered
by name in ``ROUTERS`` so a scenario picks it in YAML (``router: {policy: prefix_aware}``). A router reads
replicas only through ``ReplicaView``; ``RouterState`` decides how fresh those views are (live, or snapshots
refreshed every ``refresh_s`` seconds plus the router's own count of what it sent since), so every policy
can be run on stale signals without knowing it.

This module must never reach into a replica's scheduler or mutate a replica, and must never use Python's
salted ``hash()``: routing is part of a seeded run and has to be identical across processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.core.request import RequestSpec
from simulator.fleet.hash_ring import AffinityRoute, HashRing
from simulator.fleet.loads import LeastLoadedRoute, LoadLevels, least_loaded_index
from simulator.fleet.prefix_route import PrefixAwareRoute

if TYPE_CHECKING:
    from simulator.fleet.arrival_feed import RouteFn

RouterPolicy = Literal[
    "round_robin", "random", "least_requests", "least_kv", "power_of_two", "session_affinity", "prefix_aware",
    "weighted_least_requests",
]
"""Names of the routing policies; the keys of ``ROUTERS``, in the same order."""


class RouterConfig(BaseModel):
    """The ``router:`` section of a scenario."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    policy: RouterPolicy = "round_robin"
    """Routing policy by name; round robin is what a plain Kubernetes Service does, hence the default."""
    refresh_s: float = Field(default=0.0, ge=0.0)
    """Seconds between refreshes of the router's view of replica load (0 = exact, live views). Real routers
    scrape engine metrics periodically, so their load signals lag by up to this much."""
    load_factor_epsilon: float = Field(default=0.25, gt=0.0)
    """session_affinity: a replica takes a session only while its load is below ceil((1 + ε)·average);
    0.25 keeps most sessions sticky while capping any replica at 25 % above the mean."""
    virtual_nodes: int = Field(default=100, ge=1)
    """session_affinity: points per replica on the hash ring; 100 keeps each replica's share of sessions
    within about ±10 % of 1/N."""
    prefix_weight: float = Field(default=1.0, ge=0.0)
    """prefix_aware: weight of the fraction of the prompt's blocks already cached on a replica."""
    load_weight: float = Field(default=2.0, ge=0.0)
    """prefix_aware: weight of the replica's load relative to the busiest replica. At 2× the prefix weight,
    a replica holding the whole prefix keeps the request unless another has less than half its load."""


class ReplicaView(Protocol):
    """What a router may know about one replica. Read-only properties, so that both a live replica (plain
    attributes) and a frozen snapshot satisfy it."""

    @property
    def replica_id(self) -> int: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def load(self) -> int:
        """Requests the replica holds: running + waiting (the signal every load-aware policy here uses)."""
        ...
    @property
    def kv_used_frac(self) -> float:
        """KV blocks in use / total blocks, in [0, 1]."""
        ...
    @property
    def speed(self) -> float:
        """The replica's speed relative to the fleet's fastest (1.0): its GPU and model shard, not its load."""
        ...

    def prefix_match_blocks(self, block_hashes: Sequence[int], num_blocks: int | None = None) -> float:
        """How many leading blocks of this hash chain are in the replica's prefix cache (blocks in its KV
        tiers count at their tier's ``router_weight``); ``num_blocks``: the chain's length when the hashes
        are only its first values (``KVManager.prefix_match_blocks``)."""
        ...


class Router(Protocol):
    """A routing policy. ``choose`` returns an index into ``views``; it may keep private state (a cursor, a
    ring) but must draw randomness only from the generator it was built with."""

    name: ClassVar[str]

    @classmethod
    def from_config(cls, config: RouterConfig, num_replicas: int, rng: np.random.Generator) -> Router: ...

    def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int: ...


def load_of(view: ReplicaView) -> int:
    """Requests a replica holds (running + waiting): the load signal every load-aware policy here uses."""
    return view.load


def _check_nonempty(views: Sequence[ReplicaView]) -> int:
    if not views:
        raise ValueError("no replicas to route to")
    return len(views)


class LiveViews(tuple[ReplicaView, ...]):
    """The live replicas, in replica-id order, with ``levels``: the load list the replicas keep equal to
    their ``load`` (``levels.values``, also ``loads``; index = replica id), so a least-loaded choice is one
    C-level scan of ints, stopping at the fleet's smallest load."""

    loads: list[int]
    levels: LoadLevels

    def __new__(cls, replicas: Sequence[ReplicaView], levels: LoadLevels) -> LiveViews:
        if [r.replica_id for r in replicas] != list(range(len(replicas))) or len(levels.values) != len(replicas):
            raise ValueError("live views need replicas in id order 0..n-1 and one load per replica")
        views = super().__new__(cls, replicas)
        views.loads = levels.values
        views.levels = levels
        return views


def _least_loaded(views: Sequence[ReplicaView]) -> int:
    """Index of the replica with the fewest requests, ties by lowest replica id."""
    if isinstance(views, LiveViews):
        levels = views.levels
        return least_loaded_index(levels.values, levels.lowest)  # the first minimum: the lowest id
    n = _check_nonempty(views)
    # (load, id, index) read and compared in C: this scan runs once per request over every replica.
    return min(zip(map(_LOAD, views), map(_REPLICA_ID, views), range(n), strict=True))[2]


_LOAD = attrgetter("load")
_REPLICA_ID = attrgetter("replica_id")


# --------------------------------------------------------------------------------------------- policies


class RoundRobinRouter:
    """Cycle through replicas in index order, ignoring load."""

    name: ClassVar[str] = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    @classmethod
    def from_config(cls, config: RouterConfig, num_replicas: int, rng: np.random.Generator) -> Router:
        return cls()

    def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int:
        n = _check_nonempty(views)
        index = self._next % n
        self._next = index + 1
        return index


class RandomRouter:
    """Uniformly random replica."""

    name: ClassVar[str] = "random"

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    @classmethod
    def from_config(cls, config: RouterConfig, num_replicas: int, rng: np.random.Generator) -> Router:
        return cls(rng)

    def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int:
        return int(self._rng.integers(_check_nonempty(views)))


class LeastRequestsRouter:
    """Fewest running + waiting requests (join-the-shortest-queue), ties by lowest replica id."""

    name: ClassVar[str] = "least_requests"

    @classmethod
    def from_config(cls, config: RouterConfig, num_replicas: int, rng: np.random.Generator) -> Router:
        return cls()

    def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int:
        return _least_loaded(views)

    def live_route(self, views: LiveViews) -> RouteFn:
        """``choose`` on live views, as one call: the first minimum of the load list (what
        ``_least_loaded`` reads from ``LiveViews``)."""
        return LeastLoadedRoute(views.levels)


class LeastKVRouter:
    """Lowest KV-cache use; ties by request count (which includes the router's own in-flight count on stale
    views, so a burst between refreshes still spreads over equally full replicas), then by id."""

    name: ClassVar[str] = "least_kv"

    @classmethod
    def from_config(cls, config: RouterConfig, num_replicas: int, rng: np.random.Generator) -> Router:
        return cls()

    def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int:
        _check_nonempty(views)
        return min(
            range(len(views)), key=lambda i: (views[i].kv_used_frac, load_of(views[i]), views[i].replica_id)
        )


class PowerOfTwoRouter:
    """Sample two distinct replicas uniformly and send to the less loaded (ties by lowest id): nearly the
    balance of least_requests while reading only two replicas, and less herding on stale views."""

    name: ClassVar[str] = "power_of_two"

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    @classmethod
    def from_config(cls, config: RouterConfig, num_replicas: int, rng: np.random.Generator) -> Router:
        return cls(rng)

    def sample_pair(self, num_replicas: int) -> tuple[int, int]:
        """Two distinct indices, uniformly: draw the second from the n-1 others by skipping the first."""
        first = int(self._rng.integers(num_replicas))
        second = int(self._rng.integers(num_replicas - 1))
        if second >= first:
            second += 1
        return first, second

    def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int:
        n = _check_nonempty(views)
        if n == 1:
            return 0
        a, b = self.sample_pair(n)
        return min(a, b, key=lambda i: (load_of(views[i]), views[i].replica_id))


class SessionAffinityRouter:
    """Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018) on ``session_id``.

    A session's turns go to its ring owner, so the KV of earlier turns is reused, as long as the owner's
    load is below the capacity ``c = ceil((1 + ε)·(total load + 1) / N)`` (the +1 counts the request being
    placed); otherwise the request walks clockwise to the next replica under capacity. Since the loads sum to
    less than N·c, some replica is always under capacity. Requests without a session go to least_requests.
    """

    name: ClassVar[str] = "session_affinity"

    def __init__(self, *, epsilon: float, virtual_nodes: int) -> None:
        if epsilon <= 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        self._epsilon = epsilon
        self._virtual_nodes = virtual_nodes
        # The ring depends only on which replica ids exist; rebuild it only when they change.
        self._ring_ids: tuple[int, ...] = ()
        self._ring: HashRing | None = None
        self._live: AffinityRoute | None = None
        """The route ``choose`` answers live views with (for their load list; ``live_route``'s kind)."""

    @classmethod
    def from_config(cls, config: RouterConfig, num_replicas: int, rng: np.random.Generator) -> Router:
        return cls(epsilon=config.load_factor_epsilon, virtual_nodes=config.virtual_nodes)

    def ring_for(self, views: Sequence[ReplicaView]) -> HashRing:
        ids = tuple(v.replica_id for v in views)
        if self._ring is None or ids != self._ring_ids:
            self._ring = HashRing(ids, self._virtual_nodes)
            self._ring_ids = ids
        return self._ring

    def capacity(self, views: Sequence[ReplicaView]) -> int:
        total = sum(load_of(v) for v in views)
        return math.ceil((1.0 + self._epsilon) * float(total + 1) / len(views))

    def live_route(self, views: LiveViews) -> RouteFn:
        """``choose`` on live views, as one call (``AffinityRoute``: the same ring, capacity and walk, read off
        the fleet's load list)."""
        return AffinityRoute(views.levels, self._epsilon, self._virtual_nodes)

    def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int:
        _check_nonempty(views)
        if isinstance(views, LiveViews):
            # Live views: index = replica id, loads and their total read off the fleet's load list.
            live = self._live
            if live is None or live.levels is not views.levels:
                live = self._live = AffinityRoute(views.levels, self._epsilon, self._virtual_nodes)
            return live(spec, now_s)
        if spec.session_id is None:
            return _least_loaded(views)
        index_of = {v.replica_id: i for i, v in enumerate(views)}
        cap = self.capacity(views)
        for rid in self.ring_for(views).walk(spec.session_id):
            i = index_of[rid]
            if load_of(views[i]) < cap:
                return i
        # Unreachable when loads are non-negative (see the class docstring); kept total for safety.
        return _least_loaded(views)


class PrefixAwareRouter:
    """Longest cached prefix, penalised by load, as a weighted sum of per-signal scores in [0, 1], the way
    llm-d's scheduler combines its scorers (prefix-cache score plus load scores, each with a weight):

        score_i = prefix_weight · hit_i − load_weight · load_i / max_j load_j

    where ``hit_i`` is the fraction of the prompt's full blocks replica i already caches and the load term is
    the replica's running + waiting requests relative to the busiest replica (0 when all are idle). The
    highest score wins; ties by lower load, then lower id. Normalising by the busiest replica keeps the
    trade-off scale-free: with weights (1, 2) a full prefix hit is worth half the busiest replica's load, so
    a popular prefix cannot pile requests onto its holder while others sit idle.
    """

    name: ClassVar[str] = "prefix_aware"

    def __init__(self, *, prefix_weight: float, load_weight: float) -> None:
        self._prefix_weight = prefix_weight
        self._load_weight = load_weight

    @classmethod
    def from_config(cls, config: RouterConfig, num_replicas: int, rng: np.random.Generator) -> Router:
        return cls(prefix_weight=config.prefix_weight, load_weight=config.load_weight)

    def scores(self, spec: RequestSpec, views: Sequence[ReplicaView]) -> list[float]:
        """Score of each replica for this request (exposed for tests and decision traces)."""
        return PrefixAwareRoute(views, self._prefix_weight, self._load_weight).scores(spec)

    def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int:
        _check_nonempty(views)
        return PrefixAwareRoute(views, self._prefix_weight, self._load_weight)(spec, now_s)

    def live_route(self, views: LiveViews) -> RouteFn:
        """``choose`` on live views (index = replica id), as one call (``PrefixAwareRoute``): on replicas
        without KV tiers, with one walk of a fleet-wide index for all of them (``fleet.prefix_index``)."""
        return PrefixAwareRoute(views, self._prefix_weight, self._load_weight, live_loads=views.loads)


class WeightedLeastRequestsRouter:
    """Fewest requests per unit of speed, counting the one being placed: the smallest (load + 1) / speed,
    ties by lowest id. On a fleet of one kind of GPU it is least_requests; on a mixed fleet a replica twice
    as fast takes about twice the requests, as Envoy's weighted least-request balancer and SplitwiseSim's
    heterogeneous schedulers weigh machines."""

    name: ClassVar[str] = "weighted_least_requests"

    @classmethod
    def from_config(cls, config: RouterConfig, num_replicas: int, rng: np.random.Generator) -> Router:
        return cls()

    def choose(self, spec: RequestSpec, views: Sequence[ReplicaView], now_s: float) -> int:
        _check_nonempty(views)
        return min(range(len(views)), key=lambda i: ((load_of(views[i]) + 1) / views[i].speed, views[i].replica_id))


ROUTERS: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (
        RoundRobinRouter,
        RandomRouter,
        LeastRequestsRouter,
        LeastKVRouter,
        PowerOfTwoRouter,
        SessionAffinityRouter,
        PrefixAwareRouter,
        WeightedLeastRequestsRouter,
    )
}
"""Routing policies by name, in the order of ``RouterPolicy``."""

if tuple(ROUTERS) != get_args(RouterPolicy):  # pragma: no cover - a programming error, caught at import
    raise RuntimeError(f"RouterPolicy {get_args(RouterPolicy)} and ROUTERS {tuple(ROUTERS)} disagree")


def make_router(config: RouterConfig, num_replicas: int, seed: int) -> Router:
    """Build the configured policy for a fleet of ``num_replicas``, its randomness seeded by ``seed``."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    return ROUTERS[config.policy].from_config(config, num_replicas, np.random.default_rng(seed))


# ----------------------------------------------------------------------------------------- staleness


class ReplicaSnapshot:
    """A replica's load as the router last saw it, plus the requests the router sent it since.

    Load fields are copied at refresh. Prefix lookups are NOT frozen: they go to the live replica. Capturing
    every replica's cached hash set at each refresh costs O(cache blocks) per replica per refresh, far more
    than routing itself at short intervals; and prefix-aware routers in production (llm-d's precise prefix
    scorer) track caches through KV events, which lag far less than metric scrapes. So on stale state the
    router sees stale load but an up-to-date prefix cache.
    """

    __slots__ = ("_live", "kv_used_frac", "num_dispatched", "num_running", "num_waiting", "replica_id", "speed")

    def __init__(self, live: ReplicaView) -> None:
        self._live = live
        self.replica_id = live.replica_id
        self.num_running = live.num_running
        self.num_waiting = live.num_waiting
        """Waiting at refresh plus requests this router sent since (they join the replica's queue)."""
        self.kv_used_frac = live.kv_used_frac
        """As at refresh: the router cannot know the blocks its in-flight requests will take."""
        self.num_dispatched = 0
        """Requests this router sent here since the refresh."""
        self.speed = live.speed

    @property
    def load(self) -> int:
        return self.num_running + self.num_waiting

    def prefix_match_blocks(self, block_hashes: Sequence[int], num_blocks: int | None = None) -> float:
        return self._live.prefix_match_blocks(block_hashes, num_blocks)

    def __repr__(self) -> str:
        return (
            f"ReplicaSnapshot(id={self.replica_id}, running={self.num_running}, waiting={self.num_waiting}, "
            f"kv={self.kv_used_frac:.3f}, dispatched={self.num_dispatched})"
        )


class RouterState:
    """The router's view of the fleet: live replicas when ``refresh_s`` is 0, else snapshots.

    Snapshots are refreshed on the grid k·refresh_s, lazily: the first routing decision at or after a grid
    point takes the new snapshot, so a view is never older than ``refresh_s`` and no timer process is needed
    (a fleet that wants snapshots exactly on the grid may call ``refresh`` from one). Between refreshes the
    router adds each request it sends to that replica's waiting count — the local in-flight accounting real
    routers do — so least_requests on stale views spreads a burst instead of sending it all to one replica.
    With ``refresh_s = 0`` the live views must count a request as waiting as soon as it is handed over.
    """

    def __init__(self, replicas: Sequence[ReplicaView], refresh_s: float, loads: LoadLevels | None = None) -> None:
        if refresh_s < 0:
            raise ValueError(f"refresh_s must be >= 0, got {refresh_s}")
        if not replicas:
            raise ValueError("a fleet needs at least one replica")
        self._replicas: tuple[ReplicaView, ...] = (
            LiveViews(replicas, loads) if loads is not None else tuple(replicas)
        )
        self.refresh_s = refresh_s
        self.is_live = refresh_s == 0
        """Live views (``refresh_s`` 0): no snapshots, no refresh, no dispatch counting."""
        self._snapshots: list[ReplicaSnapshot] = []
        self._next_refresh_s = -math.inf
        self.last_refresh_s: float | None = None
        """Simulated time of the last snapshot; None before the first (and always with live views)."""

    def refresh(self, now_s: float) -> None:
        """Snapshot every replica now and forget the in-flight counts (the snapshot includes them)."""
        self._snapshots = [ReplicaSnapshot(r) for r in self._replicas]
        self.last_refresh_s = now_s
        next_s = (math.floor(now_s / self.refresh_s) + 1) * self.refresh_s
        # Float division can land a hair below a grid point; never schedule the next refresh at ``now_s``.
        self._next_refresh_s = next_s if next_s > now_s else next_s + self.refresh_s

    def views(self, now_s: float) -> Sequence[ReplicaView]:
        if self.is_live:
            return self._replicas
        if now_s >= self._next_refresh_s:
            self.refresh(now_s)
        return self._snapshots

    def record_dispatch(self, index: int) -> None:
        """The router sent one request to replica ``index``: count it until the next refresh sees it."""
        if self.is_live:
            return
        snapshot = self._snapshots[index]
        snapshot.num_waiting += 1
        snapshot.num_dispatched += 1

    def route_fn(self, router: Router) -> RouteFn:
        """``route`` with ``router``, as one callable: the router's own ``live_route`` when it has one and
        the views are live (it reads the fleet's load list directly), else ``route`` itself."""
        live_route: Callable[[LiveViews], RouteFn] | None = getattr(router, "live_route", None)
        if live_route is not None and self.is_live and isinstance(self._replicas, LiveViews):
            return live_route(self._replicas)
        return partial(self.route, router)

    def route(self, router: Router, spec: RequestSpec, now_s: float) -> int:
        """Choose a replica for ``spec`` on the current views and account for the dispatch."""
        live = self.is_live  # live views need no refresh and no dispatch count: skip both calls
        views = self._replicas if live else self.views(now_s)
        index = router.choose(spec, views, now_s)
        if not 0 <= index < len(views):
            raise RuntimeError(f"router {type(router).__name__} chose {index} of {len(views)} replicas")
        if not live:
            self.record_dispatch(index)
        return index
