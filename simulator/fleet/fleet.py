"""The fleet: a workload replayed through a router onto replicas on one SimPy clock.

``run_fleet`` knows nothing of scenario files: it takes the settings a fleet needs (``FleetSetup``) and
hands back what the clock left (``FleetRun``: the request log, the replicas with their series and
schedulers, the end time). ``simulator.simulation`` turns a scenario into a ``FleetSetup`` and the
``FleetRun`` into a summary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import simpy

from simulator.collector import cycle_collector_paused
from simulator.core.config import SchedulerConfig
from simulator.cost.cost_model import CostModel
from simulator.fleet.arrival_feed import ArrivalFeed, DispatchFn, RouteFn
from simulator.fleet.clock import run_until
from simulator.fleet.loads import LoadLevels
from simulator.fleet.replica import Replica
from simulator.fleet.router import RouterConfig, RouterState, make_router
from simulator.results.request_log import RequestLog
from simulator.results.series import ReplicaSeries
from simulator.workload.workload import Workload

ProgressFn = Callable[[str, int, int], None]
"""progress(variant, requests arrived so far, total requests)."""

InspectFn = Callable[[str, Sequence[Replica]], None]
"""inspect(variant, replicas) after the clock stopped: tests check invariants on the replicas' state."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSetup:
    """What one fleet run needs: identical replicas, a router, and how the clock runs and samples."""

    num_replicas: int
    scheduler: SchedulerConfig
    """Every replica's scheduler configuration (the shared core's)."""
    cost: CostModel
    router: RouterConfig
    seed: int
    """Seed of randomised routers."""
    network_latency_s: float
    """One-way replica-to-client latency added to every token the client sees."""
    sample_interval_s: float
    fast_path: bool
    horizon_s: float | None
    """Stop the clock here; None = run until every request finished."""


@dataclass(frozen=True, slots=True)
class FleetRun:
    """What the clock left: every request's record, the replicas as they ended, and the run's end time."""

    log: RequestLog
    replicas: list[Replica]
    end_s: float

    @property
    def series(self) -> list[ReplicaSeries]:
        return [r.series for r in self.replicas]


def run_fleet(setup: FleetSetup, workload: Workload, *, name: str = "base",
              progress: ProgressFn | None = None, inspect: InspectFn | None = None,
              prepare: InspectFn | None = None) -> FleetRun:
    """Build the replicas and the router, replay the workload until the horizon (or the last finish);
    ``prepare`` sees the replicas before the clock starts (to attach recorders, ``Replica.on_plan``)."""
    env = simpy.Environment()
    num_requests = len(workload)
    log = RequestLog(num_requests)
    loads = LoadLevels(setup.num_replicas)  # each replica's request count, kept by the replica
    replicas = [
        Replica(env, i, setup.scheduler, setup.cost, log, ReplicaSeries(i, setup.sample_interval_s),
                network_latency_s=setup.network_latency_s, fast_path=setup.fast_path, loads=loads)
        for i in range(setup.num_replicas)
    ]
    router = make_router(setup.router, len(replicas), setup.seed)
    state = RouterState(replicas, setup.router.refresh_s, loads=loads)
    # Block hashes only matter to a prefix cache (the prefix-aware router reads them through one too).
    return replay(env, log, replicas, workload, route=state.route_fn(router),
                  block_hashes=setup.scheduler.prefix_caching, horizon_s=setup.horizon_s, name=name,
                  progress=progress, inspect=inspect, prepare=prepare)


def replay(env: simpy.Environment, log: RequestLog, replicas: list[Replica], workload: Workload, *,
           route: RouteFn | None = None, dispatch: DispatchFn | None = None, block_hashes: bool,
           horizon_s: float | None, name: str, progress: ProgressFn | None, inspect: InspectFn | None,
           prepare: InspectFn | None = None) -> FleetRun:
    """Feed the workload to built replicas (``route`` picks one per request, or ``dispatch`` takes each
    request) until the horizon (or the last finish); ``block_hashes``: the specs carry their hashes."""
    num_requests = len(workload)
    for replica in replicas:
        replica.series.kv_probe = _kv_probe(replica)
    if prepare is not None:
        prepare(name, replicas)
    lazy = block_hashes and _lazy_chains(replicas, dispatch)
    specs = workload.iter_specs(block_hashes=block_hashes, lazy_chains=lazy)

    def report(arrived: int) -> None:
        if progress is not None:
            progress(name, arrived, num_requests)

    with cycle_collector_paused():  # the loop frees what it makes by reference counting
        # The specs are the workload's rows in order: their arrivals are logged in bulk once the clock stops.
        feed = ArrivalFeed(env, specs, log, replicas, route=route, dispatch=dispatch,
                           progress=None if progress is None else report, report_every=max(1, num_requests // 100),
                           log_arrivals=False)  # builds the first specs
        run_until(env, horizon_s)
    if not feed.log_arrivals:
        arrived = feed.num_arrived
        log.record_arrivals(workload.arrival_s[:arrived], workload.prompt_tokens[:arrived],
                            workload.output_tokens[:arrived], workload.session_id[:arrived])
    end_s = env.now if horizon_s is None else horizon_s
    end_s = max(end_s, 1e-9)
    for replica in replicas:
        replica.stop(end_s)  # a decode run cut by the horizon: the steps that ended count
    if inspect is not None:
        inspect(name, replicas)
    return FleetRun(log, replicas, end_s)


LAZY_CHAINS = True
"""Whether specs may hold a session turn's chained hashes as a tail (``_lazy_chains``); off, every hash is a
value from the start (the same results: a test compares both)."""


def _lazy_chains(replicas: list[Replica], dispatch: DispatchFn | None) -> bool:
    """Whether the specs hold a session turn's hashes past its chain's first block as a tail, derived where
    read (``Workload.iter_specs``): where every replica's KV manager hands chains from turn to turn and
    reads no hash it does not look up (no listener such as the KV tiers; routed, not dispatched to roles),
    most turns never read them. Elsewhere every turn would derive them at once."""
    if not LAZY_CHAINS or dispatch is not None:
        return False
    return all(replica.scheduler.kv.chains_on and not replica.scheduler.kv.reads_every_hash for replica in replicas)


def _kv_probe(replica: Replica) -> Callable[[], tuple[int, int]]:
    """(KV slots allocated, of which reserved but holding no token) of one replica, for its series."""
    scheduler = replica.scheduler

    def probe() -> tuple[int, int]:
        stats = scheduler.kv_stats()
        return stats.num_used_blocks * stats.block_size, stats.num_reserved_unused_slots

    return probe
