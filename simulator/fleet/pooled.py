"""A fleet of several pools: replicas of different GPUs, model shards or engine settings behind one router
(mixed pools), or prefill and decode pools of a disaggregated fleet (``disaggregation``).

Replica ids run over the pools in order (pool 0's replicas first); each replica carries its pool's speed
relative to the fastest (``Replica.speed``), which speed-weighted routers divide its load by. A fleet of
one mixed pool is ``fleet.run_fleet``'s, and takes that path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import simpy

from simulator.core.config import Role, SchedulerConfig
from simulator.cost.cost_model import CostModel
from simulator.cost.link import TransferModel
from simulator.fleet.config import DisaggregationConfig
from simulator.fleet.disaggregation import Disaggregation
from simulator.fleet.fleet import FleetRun, InspectFn, ProgressFn, replay
from simulator.fleet.loads import LoadLevels
from simulator.fleet.replica import Replica
from simulator.fleet.router import RouterConfig, RouterState, make_router
from simulator.results.handoffs import HandoffLog
from simulator.results.request_log import RequestLog
from simulator.results.series import ReplicaSeries
from simulator.workload.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolGroup:
    """One pool as the fleet runs it: identical replicas with one role, engine and cost model."""

    name: str
    """The pool's name in the scenario (``fleet.pools.NAME``)."""
    role: Role
    """mixed, prefill or decode (also its scheduler's role)."""
    num_replicas: int
    """Replicas in the pool (at least one)."""
    scheduler: SchedulerConfig
    """Every replica's scheduler configuration."""
    cost: CostModel
    """Every replica's step-time model."""
    speed: float
    """Relative speed of this pool's replicas (1.0 = the fleet's fastest)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PooledSetup:
    """What a run of several pools needs (the single-pool ``FleetSetup``'s settings, per pool)."""

    groups: tuple[PoolGroup, ...]
    router: RouterConfig
    """Routing over the replicas of mixed pools; its weights and staleness for a disaggregated fleet's two routers."""
    disaggregation: DisaggregationConfig | None
    """Set when the pools are prefill and decode pools."""
    transfer: dict[tuple[str, str], TransferModel]
    """The link's model between each (prefill pool, decode pool) pair, by pool names."""
    seed: int
    """Seed of randomised routers (the decode side's router takes the next one)."""
    network_latency_s: float
    """One-way replica-to-client latency added to every token the client sees."""
    sample_interval_s: float
    """Grid of the per-replica time series."""
    fast_path: bool
    """Advance runs of identical decode steps in one event (same results as step by step)."""
    horizon_s: float | None
    """Stop the clock here; None = run until every request finished."""


@dataclass(frozen=True, slots=True)
class PooledRun:
    """What the clock left: the fleet's run, each replica's pool, and a disaggregated fleet's hand-offs."""

    fleet: FleetRun
    """The log, the replicas as they ended and the end time, as a one-pool fleet's."""
    pool_of: list[str]
    """Pool name of each replica, by replica id."""
    handoffs: HandoffLog | None
    """A disaggregated fleet's per-request hand-off columns; None for mixed pools."""
    coordinator: Disaggregation | None
    """A disaggregated fleet's request path (its counts of requests that waited); None for mixed pools."""


def run_pooled_fleet(setup: PooledSetup, workload: Workload, *, name: str = "base",
                     progress: ProgressFn | None = None, inspect: InspectFn | None = None,
                     prepare: InspectFn | None = None) -> PooledRun:
    """Build every pool's replicas and the router (or the disaggregated request path), replay the workload."""
    env = simpy.Environment()
    num_requests = len(workload)
    log = RequestLog(num_requests)
    total = sum(group.num_replicas for group in setup.groups)
    loads = LoadLevels(total)
    replicas: list[Replica] = []
    pool_of: list[str] = []
    for group in setup.groups:
        for _ in range(group.num_replicas):
            i = len(replicas)
            replica = Replica(env, i, group.scheduler, group.cost, log, ReplicaSeries(i, setup.sample_interval_s),
                              network_latency_s=setup.network_latency_s, fast_path=setup.fast_path, loads=loads)
            replica.speed = group.speed
            replicas.append(replica)
            pool_of.append(group.name)
    caching = any(group.scheduler.prefix_caching for group in setup.groups)
    if setup.disaggregation is None:
        router = make_router(setup.router, total, setup.seed)
        state = RouterState(replicas, setup.router.refresh_s, loads=loads)
        run = replay(env, log, replicas, workload, route=state.route_fn(router), block_hashes=caching,
                     horizon_s=setup.horizon_s, name=name, progress=progress, inspect=inspect, prepare=prepare)
        return PooledRun(run, pool_of, None, None)
    handoffs = HandoffLog(num_requests)
    coordinator = Disaggregation(
        _with_role(replicas, pool_of, setup.groups, Role.PREFILL), _with_role(replicas, pool_of, setup.groups,
                                                                             Role.DECODE),
        log, handoffs, config=setup.disaggregation, router=setup.router,
        transfer=lambda p, d: setup.transfer[(pool_of[p.replica_id], pool_of[d.replica_id])],
        seed=setup.seed, network_latency_s=setup.network_latency_s,
    )
    run = replay(env, log, replicas, workload, dispatch=coordinator.dispatch, block_hashes=caching,
                 horizon_s=setup.horizon_s, name=name, progress=progress, inspect=inspect, prepare=prepare)
    return PooledRun(run, pool_of, handoffs, coordinator)


def _with_role(replicas: Sequence[Replica], pool_of: Sequence[str], groups: Sequence[PoolGroup],
               role: Role) -> list[Replica]:
    names = {group.name for group in groups if group.role is role}
    return [replica for replica, pool in zip(replicas, pool_of, strict=True) if pool in names]
