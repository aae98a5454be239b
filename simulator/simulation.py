"""A scenario simulated: its variants, one after another, on the identical request stream -> ``RunResult``.

The seam between the scenario (what the user asked for) and the fleet (what runs): ``simulate`` resolves
one variant into the fleet's settings, runs the fleet, and summarises what it recorded. Variants share
the seed, the arrivals and the lengths; only what a variant overrides differs.
"""

from __future__ import annotations

from simulator.core.config import Role
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import get_accelerator
from simulator.cost.speed import relative_speeds
from simulator.fleet.fleet import FleetRun, FleetSetup, InspectFn, ProgressFn, run_fleet
from simulator.fleet.pooled import PooledSetup, PoolGroup, run_pooled_fleet
from simulator.results.handoffs import handoff_figures
from simulator.results.pools import PoolRecord, blended_price, fleet_figures
from simulator.results.run_result import ProfileInfo, RunResult, VariantResult
from simulator.results.series import fleet_kv_util_mean, fleet_kv_waste, fleet_running_mean
from simulator.results.summary import Summary, summarize
from simulator.scenario import (
    LoadedScenario,
    ReplicaSetup,
    ResolvedPool,
    Scenario,
    disaggregation_of,
    fleet_block_size,
    link_transfer,
    pool_scenario,
    resolve_pools,
    resolve_replica,
    scenario_record,
)
from simulator.workload.generate import generate
from simulator.workload.workload import Workload

__all__ = ["InspectFn", "ProgressFn", "run", "simulate"]


def run(loaded: LoadedScenario, *, progress: ProgressFn | None = None, inspect: InspectFn | None = None,
        prepare: InspectFn | None = None) -> RunResult:
    """Simulate every variant of a scenario on the same request stream (``inspect`` sees each variant's
    replicas after its clock stopped, ``prepare`` before it starts)."""
    variants = loaded.variants()
    workloads: dict[tuple[str, int], Workload] = {}
    results = {}
    for name, scenario in variants.items():
        block_size = fleet_block_size(scenario)
        key = (scenario.workload.model_dump_json(), block_size)
        if key not in workloads:  # hashes depend on the block size; arrivals and lengths do not
            workloads[key] = generate(scenario.workload, seed=scenario.seed, block_size=block_size,
                                      base_dir=loaded.base_dir)
        results[name] = simulate(scenario, workloads[key], name=name, progress=progress, inspect=inspect,
                                 prepare=prepare)
    record = {name: scenario_record(sc) for name, sc in variants.items()}
    return RunResult(scenario_name=loaded.scenario.name, variants=results, scenario=record)


def simulate(scenario: Scenario, workload: Workload, *, name: str = "base",
             progress: ProgressFn | None = None, inspect: InspectFn | None = None,
             prepare: InspectFn | None = None) -> VariantResult:
    """One variant: build the replicas and the router, replay the workload, summarise."""
    if scenario.fleet.pools is not None:
        return _simulate_pools(scenario, workload, name=name, progress=progress, inspect=inspect, prepare=prepare)
    setup = resolve_replica(scenario)
    fleet = run_fleet(fleet_setup(scenario, setup), workload, name=name, progress=progress, inspect=inspect,
                      prepare=prepare)
    profile = setup.profile
    return VariantResult(
        name=name,
        requests=fleet.log,
        series=fleet.series,
        summary=_summary(scenario, fleet),
        profile=ProfileInfo(name=profile.name, kind=profile.kind.value, label=profile.label),
    )


def fleet_setup(scenario: Scenario, setup: ReplicaSetup) -> FleetSetup:
    """The fleet's settings for one variant of a scenario."""
    sim = scenario.simulation
    return FleetSetup(
        num_replicas=scenario.fleet.replicas,
        scheduler=setup.scheduler,
        cost=CostModel(setup.profile, factor=sim.cost_factor),  # issue 8: sensitivity factor
        router=scenario.router,
        seed=scenario.seed,
        network_latency_s=scenario.network.latency_ms / 1000.0,
        sample_interval_s=sim.sample_interval_s,
        fast_path=sim.fast_path,
        horizon_s=sim.horizon_s,
    )


def _summary(scenario: Scenario, fleet: FleetRun, *, num_gpus: int | None = None,
             usd_per_gpu_hour: float | None = None) -> Summary:
    """The variant's headline figures from the fleet's log, series and schedulers (``num_gpus`` and
    ``usd_per_gpu_hour``: a fleet of pools gives its own; else the fleet section's)."""
    sim = scenario.simulation
    replicas = fleet.replicas
    series = fleet.series
    hits = sum(r.scheduler.kv.num_hit_tokens for r in replicas)
    lookups = sum(r.scheduler.kv.num_lookup_tokens for r in replicas)
    if num_gpus is None:
        num_gpus = scenario.fleet.replicas * scenario.fleet.tp
        usd_per_gpu_hour = gpu_price(scenario, scenario.fleet.hardware)
    return summarize(
        fleet.log,
        duration_s=fleet.end_s,
        slo=scenario.slo,
        num_gpus=num_gpus,
        usd_per_gpu_hour=usd_per_gpu_hour,
        kv_util_mean=fleet_kv_util_mean(series, warmup_s=sim.warmup_s),
        prefix_hit_rate=hits / lookups if lookups else 0.0,
        preemptions=sum(r.scheduler.num_preemptions for r in replicas),
        warmup_s=sim.warmup_s,
        running_mean=fleet_running_mean(series, warmup_s=sim.warmup_s),
        running_peak=max(s.peak_running for s in series),
        kv_waste_mean=fleet_kv_waste(series),
    )


def gpu_price(scenario: Scenario, hardware: str) -> float | None:
    """What one GPU of ``hardware`` costs an hour in this scenario (its cost section, else the list price;
    None for a calibration device, a CPU, which has none)."""
    try:
        price = get_accelerator(hardware).price_usd_per_gpu_hour
    except Exception:  # a calibration device (a CPU) has no list price: cost is simply not reported
        price = None
    return scenario.cost.resolve_price(price)


def _simulate_pools(scenario: Scenario, workload: Workload, *, name: str, progress: ProgressFn | None,
                    inspect: InspectFn | None, prepare: InspectFn | None) -> VariantResult:
    """A variant whose fleet is given as pools: one mixed pool runs as any fleet does; several pools (of
    mixed GPUs, or prefill and decode) run through ``run_pooled_fleet``."""
    pools = resolve_pools(scenario)
    sim = scenario.simulation
    costs = [CostModel(pool.setup.profile, factor=sim.cost_factor) for pool in pools]
    speeds = _speeds(pools, costs)
    handoffs = coordinator = None
    if len(pools) == 1 and pools[0].role is Role.MIXED:
        only = pool_scenario(scenario, pools[0].name)
        fleet = run_fleet(fleet_setup(only, pools[0].setup), workload, name=name, progress=progress, inspect=inspect,
                          prepare=prepare)
        pool_of = [pools[0].name] * len(fleet.replicas)
    else:
        groups = tuple(PoolGroup(name=pool.name, role=pool.role, num_replicas=pool.replicas,
                                 scheduler=pool.setup.scheduler, cost=cost, speed=speed)
                       for pool, cost, speed in zip(pools, costs, speeds, strict=True))
        disaggregated = pools[0].role is not Role.MIXED
        transfer = {(p.name, d.name): link_transfer(scenario, p, d) for p in pools if p.role is Role.PREFILL
                    for d in pools if d.role is Role.DECODE}
        run = run_pooled_fleet(PooledSetup(
            groups=groups, router=scenario.router,
            disaggregation=disaggregation_of(scenario) if disaggregated else None, transfer=transfer,
            seed=scenario.seed, network_latency_s=scenario.network.latency_ms / 1000.0,
            sample_interval_s=sim.sample_interval_s, fast_path=sim.fast_path, horizon_s=sim.horizon_s,
        ), workload, name=name, progress=progress, inspect=inspect, prepare=prepare)
        fleet, pool_of, handoffs, coordinator = run.fleet, run.pool_of, run.handoffs, run.coordinator
    prices = [gpu_price(scenario, pool.fleet.hardware) for pool in pools]
    num_gpus = sum(pool.gpus for pool in pools)
    price = blended_price([(pool.gpus, price) for pool, price in zip(pools, prices, strict=True)])
    summary = _summary(scenario, fleet, num_gpus=num_gpus, usd_per_gpu_hour=price)
    handoff_summary = None
    if handoffs is not None and coordinator is not None:
        columns = fleet.log.columns()
        handoff_summary = handoff_figures(handoffs, columns["arrival_s"], columns["prompt_tokens"],
                                          num_waited=coordinator.num_waited, num_waiting_at_end=coordinator.num_waiting,
                                          warmup_s=sim.warmup_s)
    records = []
    for pool, price in zip(pools, prices, strict=True):
        members = [r for r, p in zip(fleet.replicas, pool_of, strict=True) if p == pool.name]
        records.append(PoolRecord(
            name=pool.name, role=str(pool.role), hardware=pool.fleet.hardware, model=pool.fleet.model, tp=pool.fleet.tp,
            profile=pool.setup.profile.name, usd_per_gpu_hour=price, busy_s=[r.busy_s for r in members],
            prefill_tokens=sum(r.num_prefill_tokens for r in members), series=[r.series for r in members]))
    figures = fleet_figures(records, summary, duration_s=fleet.end_s, warmup_s=sim.warmup_s, handoffs=handoff_summary)
    return VariantResult(name=name, requests=fleet.log, series=fleet.series, summary=summary,
                         profile=_pools_profile(pools), fleet=figures)


def _speeds(pools: list[ResolvedPool], costs: list[CostModel]) -> list[float]:
    """Each pool's speed relative to the fastest pool of the same role (routers compare within a role)."""
    speeds = [1.0] * len(pools)
    for role in Role:
        members = [i for i, pool in enumerate(pools) if pool.role is role]
        if members:
            for i, speed in zip(members, relative_speeds([(costs[i], role) for i in members]), strict=True):
                speeds[i] = speed
    return speeds


def _pools_profile(pools: list[ResolvedPool]) -> ProfileInfo:
    """The profiles of a fleet of pools as one record: each pool's, and the least measured kind among them."""
    profiles = [pool.setup.profile for pool in pools]
    if len({p.name for p in profiles}) == 1:
        only = profiles[0]
        return ProfileInfo(name=only.name, kind=only.kind.value, label=only.label)
    order = ("measured", "fitted-published", "analytic")
    kind = max((p.kind.value for p in profiles), key=order.index)
    return ProfileInfo(name=" + ".join(f"{pool.name}: {pool.setup.profile.name}" for pool in pools),
                       kind=kind,  # type: ignore[arg-type]
                       label="; ".join(f"{pool.name}: {pool.setup.profile.label}" for pool in pools))
