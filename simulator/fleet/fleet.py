"""The fleet: workload -> router -> replicas on one SimPy clock; ``run(scenario)`` -> ``RunResult``.

Variants of a scenario run one after another on the identical request stream (same seed, same arrivals
and lengths); only what the variant overrides differs.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence

import simpy

from simulator.cost.cost_model import CostModel
from simulator.cost.profile import get_accelerator
from simulator.fleet.arrival_feed import ArrivalFeed
from simulator.fleet.replica import Replica, run_until
from simulator.fleet.router import RouterState, make_router
from simulator.results.metrics import (
    ProfileInfo,
    ReplicaSeries,
    RequestLog,
    RunResult,
    VariantResult,
    fleet_kv_util_mean,
    fleet_kv_waste,
    fleet_running_mean,
    summarize,
)
from simulator.scenario import LoadedScenario, Scenario, resolve_replica, scenario_record
from simulator.workload.workload import Workload, generate

ProgressFn = Callable[[str, int, int], None]
"""progress(variant, requests arrived so far, total requests)."""

InspectFn = Callable[[str, Sequence[Replica]], None]
"""inspect(variant, replicas) after the clock stopped: tests check invariants on the replicas' state."""


def run(loaded: LoadedScenario, *, progress: ProgressFn | None = None, inspect: InspectFn | None = None) -> RunResult:
    """Simulate every variant of a scenario on the same request stream."""
    variants = loaded.variants()
    workloads: dict[tuple[str, int], Workload] = {}
    results = {}
    for name, scenario in variants.items():
        setup = resolve_replica(scenario)
        key = (scenario.workload.model_dump_json(), setup.scheduler.block_size)
        if key not in workloads:  # hashes depend on the block size; arrivals and lengths do not
            workloads[key] = generate(scenario.workload, seed=scenario.seed,
                                      block_size=setup.scheduler.block_size, base_dir=loaded.base_dir)
        results[name] = simulate(scenario, workloads[key], name=name, progress=progress, inspect=inspect)
    record = {name: scenario_record(sc) for name, sc in variants.items()}
    return RunResult(scenario_name=loaded.scenario.name, variants=results, scenario=record)


def simulate(scenario: Scenario, workload: Workload, *, name: str = "base",
             progress: ProgressFn | None = None, inspect: InspectFn | None = None) -> VariantResult:
    """One variant: build the replicas and the router, replay the workload, summarise."""
    setup = resolve_replica(scenario)
    profile = setup.profile
    env = simpy.Environment()
    cost = CostModel(profile, factor=scenario.simulation.cost_factor)  # issue 8: sensitivity factor
    num_requests = len(workload)
    log = RequestLog(num_requests)
    sim = scenario.simulation
    latency_s = scenario.network.latency_ms / 1000.0
    loads = [0] * scenario.fleet.replicas  # each replica's request count, kept by the replica
    replicas = [
        Replica(env, i, setup.scheduler, cost, log, ReplicaSeries(i, sim.sample_interval_s),
                network_latency_s=latency_s, fast_path=sim.fast_path, loads=loads)
        for i in range(scenario.fleet.replicas)
    ]
    for replica in replicas:
        replica.series.kv_probe = _kv_probe(replica)
    router = make_router(scenario.router, len(replicas), scenario.seed)
    state = RouterState(replicas, scenario.router.refresh_s, loads=loads)

    # Block hashes only matter to a prefix cache (the prefix-aware router reads them through one too).
    specs = workload.iter_specs(block_hashes=setup.scheduler.prefix_caching)

    def report(arrived: int) -> None:
        if progress is not None:
            progress(name, arrived, num_requests)

    with _cycle_collector_paused():
        # The specs are the workload's rows in order: their arrivals are logged in bulk once the clock stops.
        feed = ArrivalFeed(env, specs, log, replicas, route=state.route_fn(router),
                           progress=None if progress is None else report, report_every=max(1, num_requests // 100),
                           log_arrivals=False)  # builds the first specs
        run_until(env, sim.horizon_s)
    if not feed.log_arrivals:
        arrived = feed.num_arrived
        log.record_arrivals(workload.arrival_s[:arrived], workload.prompt_tokens[:arrived],
                            workload.output_tokens[:arrived], workload.session_id[:arrived])
    end_s = env.now if sim.horizon_s is None else sim.horizon_s
    end_s = max(end_s, 1e-9)
    for replica in replicas:
        replica.sync()  # a decode run cut by the horizon: its steps so far count
        replica.series.close(end_s)
    if inspect is not None:
        inspect(name, replicas)
    series = [r.series for r in replicas]
    hits = sum(r.scheduler.kv.num_hit_tokens for r in replicas)
    lookups = sum(r.scheduler.kv.num_lookup_tokens for r in replicas)
    try:
        price = get_accelerator(scenario.fleet.hardware).price_usd_per_gpu_hour
    except Exception:  # a calibration device (a CPU) has no list price: cost is simply not reported
        price = None
    summary = summarize(
        log,
        duration_s=end_s,
        slo=scenario.slo,
        num_gpus=scenario.fleet.replicas * scenario.fleet.tp,
        usd_per_gpu_hour=scenario.cost.resolve_price(price),
        kv_util_mean=fleet_kv_util_mean(series, warmup_s=sim.warmup_s),
        prefix_hit_rate=hits / lookups if lookups else 0.0,
        preemptions=sum(r.scheduler.num_preemptions for r in replicas),
        warmup_s=sim.warmup_s,
        running_mean=fleet_running_mean(series, warmup_s=sim.warmup_s),
        running_peak=max(s.peak_running for s in series),
        kv_waste_mean=fleet_kv_waste(series),
    )
    return VariantResult(
        name=name,
        requests=log,
        series=series,
        summary=summary,
        profile=ProfileInfo(name=profile.name, kind="measured" if profile.is_measured else "analytic"),
    )


@contextlib.contextmanager
def _cycle_collector_paused() -> Iterator[None]:
    """Python's cycle collector off while the requests are built and the clock runs. The event loop
    allocates objects without reference cycles (specs, requests, plans, queue entries): reference counting
    frees every one of them, and the collector's passes, triggered by the allocations alone, were ~3 % of
    a run's instructions for nothing. Back on afterwards (if it was on), which collects whatever cycles a
    mixed-in SimPy process may have left."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _kv_probe(replica: Replica) -> Callable[[], tuple[int, int]]:
    """(KV slots allocated, of which reserved but holding no token) of one replica, for its series."""
    scheduler = replica.scheduler

    def probe() -> tuple[int, int]:
        stats = scheduler.kv_stats()
        return stats.num_used_blocks * stats.block_size, stats.num_reserved_unused_slots

    return probe
