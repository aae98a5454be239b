"""A scenario simulated: its variants, one after another, on the identical request stream -> ``RunResult``.

The seam between the scenario (what the user asked for) and the fleet (what runs): ``simulate`` resolves
one variant into the fleet's settings, runs the fleet, and summarises what it recorded. Variants share
the seed, the arrivals and the lengths; only what a variant overrides differs.

What only some variants use (a fleet that changes size, pools, KV tiers) is imported by the function that
runs it: a plain run does not pay for those modules at start-up (their classes, dataclasses above all, cost
about a millisecond each to create; ``tests/simulator/test_startup.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from simulator.core.config import Role
from simulator.core.request import RequestStatus
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import get_accelerator
from simulator.cost.speed import relative_speeds
from simulator.errors import ConfigError
from simulator.fleet.config import FirstToken, LifecycleConfig
from simulator.fleet.fleet import FleetRun, FleetSetup, InspectFn, ProgressFn, run_fleet
from simulator.fleet.replica import Replica
from simulator.results.invariants import ReplicaEnd, check_requested, check_run
from simulator.results.run_result import ProfileInfo, RunResult, VariantResult
from simulator.results.series import fleet_kv_util_mean, fleet_kv_waste, fleet_running_mean
from simulator.results.summary import Summary, summarize
from simulator.scenario import (
    ClientPath,
    LoadedScenario,
    ReplicaSetup,
    ResolvedPool,
    Scenario,
    client_path,
    disaggregation_of,
    fleet_block_size,
    link_transfer,
    pool_scenario,
    resolve_pools,
    resolve_replica,
    scenario_record,
    tier_groups,
)
from simulator.variant_workers import VariantTask, simulate_variants
from simulator.workload.generate import generate
from simulator.workload.workload import Workload

if TYPE_CHECKING:
    from simulator.fleet.kv_store import TierRun

__all__ = ["InspectFn", "ProgressFn", "run", "simulate"]


def run(loaded: LoadedScenario, *, progress: ProgressFn | None = None, inspect: InspectFn | None = None,
        prepare: InspectFn | None = None, check: bool = False, jobs: int | None = 1) -> RunResult:
    """Simulate every variant of a scenario on the same request stream (``inspect`` sees each variant's
    replicas after its clock stopped, ``prepare`` before it starts); ``check``: verify each variant's
    invariants once it ends (``results.invariants``; also on when $FLEETSIM_CHECK is 1). ``jobs`` > 1:
    up to that many variants at once, each in a worker process (``variant_workers``; the same results),
    unless ``inspect`` or ``prepare`` must see the replicas in this process; None: ``auto_jobs``."""
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    variants = loaded.variants()
    workloads: dict[tuple[str, int], Workload] = {}
    tasks: list[VariantTask] = []
    for name, scenario in variants.items():
        block_size = fleet_block_size(scenario)
        key = (scenario.workload.model_dump_json(), block_size)
        if key not in workloads:  # hashes depend on the block size; arrivals and lengths do not
            workloads[key] = generate(scenario.workload, seed=scenario.seed, block_size=block_size,
                                      base_dir=loaded.base_dir)
        tasks.append(VariantTask(name, scenario, workloads[key]))
    if jobs is None:
        jobs = auto_jobs(tasks)
    if jobs > 1 and len(tasks) > 1 and inspect is None and prepare is None:
        results = simulate_variants(simulate, tasks, jobs=jobs, progress=progress, check=check)
    else:
        results = {task.name: simulate(task.scenario, task.workload, name=task.name, progress=progress,
                                       inspect=inspect, prepare=prepare, check=check) for task in tasks}
    record = {name: scenario_record(sc) for name, sc in variants.items()}
    return RunResult(scenario_name=loaded.scenario.name, variants=results, scenario=record)


PARALLEL_MIN_REQUESTS = 20_000
"""Requests a scenario's variants must replay in all before ``auto_jobs`` runs them in worker processes: a
worker's start-up (a fresh interpreter, the imports, the workload sent over) costs about a second, as
much as simulating this many requests (compiled)."""


def auto_jobs(tasks: Sequence[VariantTask]) -> int:
    """Worker processes for these variants: one per CPU core, at most one per variant, and none (1: in this
    process) when they are too small to gain from workers."""
    if len(tasks) < 2 or sum(len(task.workload) for task in tasks) < PARALLEL_MIN_REQUESTS:
        return 1
    return max(1, min(len(tasks), os.cpu_count() or 1))


def simulate(scenario: Scenario, workload: Workload, *, name: str = "base",
             progress: ProgressFn | None = None, inspect: InspectFn | None = None,
             prepare: InspectFn | None = None, check: bool = False) -> VariantResult:
    """One variant: build the replicas and the router, replay the workload, summarise (and, with
    ``check``, raise ``InvariantError`` if the run broke an invariant)."""
    if scenario.fleet.pools is not None:
        return _simulate_pools(scenario, workload, name=name, progress=progress, inspect=inspect, prepare=prepare,
                               check=check)
    if scenario.is_dynamic:
        return _simulate_dynamic(scenario, workload, name=name, progress=progress, inspect=inspect, prepare=prepare,
                                 check=check)
    setup = resolve_replica(scenario)
    fleet_settings = fleet_setup(scenario, setup)
    check_sample_grid(scenario, workload, fleet_settings.cost)
    tiers = _tier_run(scenario)
    fleet = run_fleet(fleet_settings, workload, name=name, progress=progress, inspect=inspect,
                      prepare=prepare if tiers is None else _with_tiers(tiers, prepare))
    _finish_run(scenario, workload, fleet, name=name, check=check,
                client=client_path(scenario, [setup.profile]))
    profile = setup.profile
    summary = _summary(scenario, fleet)
    return VariantResult(
        name=name,
        requests=fleet.log,
        series=fleet.series,
        summary=summary,
        profile=ProfileInfo(name=profile.name, kind=profile.kind.value, label=profile.label),
        tiers=None if tiers is None else tiers.figures(fleet.log, summary, warmup_s=scenario.simulation.warmup_s,
                                                       end_s=fleet.end_s),
    )


def _tier_run(scenario: Scenario) -> TierRun | None:
    """The variant's KV tiers, to attach to its replicas (None without a ``kv_tiers`` section)."""
    if scenario.kv_tiers is None:
        return None
    from simulator.fleet.kv_store import TierRun

    return TierRun(scenario.kv_tiers, tier_groups(scenario))


def _with_tiers(tiers: TierRun, prepare: InspectFn | None) -> InspectFn:
    """``prepare`` preceded by attaching the tiers to the replicas."""

    def prepare_with_tiers(name: str, replicas: Sequence[Replica]) -> None:
        tiers.prepare(replicas)
        if prepare is not None:
            prepare(name, replicas)

    return prepare_with_tiers


MAX_SAMPLE_POINTS = 10_000_000
"""Most points the replicas' time series may hold together (about 1.5 GB, and seconds to fill): a day at the
default 1 s on over a hundred replicas. A finer grid over a long run is a memory and time bomb, refused
before the clock starts."""


def check_sample_grid(scenario: Scenario, workload: Workload, cost: CostModel) -> None:
    """Refuse a sampling grid too fine for the run. The grid reaches the horizon when there is one (the series
    are filled up to it), else at least the moment the slowest request could finish: its arrival plus one
    decode step of a lone request per output token (a lower bound: no step is faster)."""
    sim = scenario.simulation
    if sim.horizon_s is not None:
        span_s, what = sim.horizon_s, "horizon_s"
    elif len(workload):
        step_s = cost.time_of(1, 1, 1, 1, 0, 0.0, 0)
        span_s = float(np.max(workload.arrival_s + workload.output_tokens * step_s))
        what = "least the run can last"
    else:
        return
    replicas = num_replicas(scenario)
    points = (span_s / sim.sample_interval_s + 1) * replicas
    if points > MAX_SAMPLE_POINTS:
        raise ConfigError(f"sampling every {sim.sample_interval_s:.3g} s over {span_s:.4g} s (the {what}) on "
                          f"{replicas} replica(s) makes {points:.3g} time-series points, more than "
                          f"{MAX_SAMPLE_POINTS:,}: make the interval coarser", field="simulation.sample_interval_s")


def handoff_counts(replicas: list[Replica]) -> dict[int, int]:
    """Each request a decode worker holds for a KV handoff (offered and waiting for blocks, or reserved with
    its KV on the way) -> the output tokens produced for it so far: the prefill worker's count (1 once its
    prefill has finished), 0 while its prefill has not started. Such a request is the decode worker's (the
    one it was routed to); the prefill worker's copy of it is not counted again."""
    counts = {rid: 0 for replica in replicas if replica.scheduler.receiver is not None
              for rid, request in replica.scheduler.requests.items()
              if request.status is RequestStatus.WAITING_FOR_KV}
    if counts:
        for replica in replicas:
            sender = replica.scheduler.sender
            if sender is None:
                continue
            for held in (replica.scheduler.requests, sender.held):
                for rid, request in held.items():
                    if rid in counts:
                        counts[rid] = request.num_output_tokens
    return counts


def _live(replica: Replica, handoff: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """Request id -> (output tokens produced, asked for) of each request the replica holds and answers for."""
    scheduler = replica.scheduler
    prefill_worker = scheduler.sender is not None
    live = {}
    for rid, request in scheduler.requests.items():
        if rid in handoff:
            if prefill_worker:
                continue  # its decode worker holds it too and answers for it
            live[rid] = (handoff[rid], request.max_output_tokens)
        else:
            live[rid] = (request.num_output_tokens, request.max_output_tokens)
    return live


def replica_end(replica: Replica, handoff: Mapping[int, int] | None = None) -> ReplicaEnd:
    """A replica's state when the clock stopped, as the run check reads it (``handoff``: ``handoff_counts``
    of the whole fleet, for a disaggregated one)."""
    scheduler = replica.scheduler
    pool = scheduler.kv.pool
    table_refs = [0] * pool.num_blocks
    holders = list(scheduler.requests.values())
    if scheduler.sender is not None:  # finished prefills whose blocks wait for the transfer to read them
        holders += scheduler.sender.held.values()
    for request in holders:
        for block in request.block_table:
            table_refs[block] += 1
    block_size = scheduler.block_size
    return ReplicaEnd(
        replica=replica.replica_id,
        live=_live(replica, handoff or {}),
        ref_counts=list(pool.ref_cnt), table_refs=table_refs, num_blocks=pool.num_blocks,
        num_used_blocks=pool.num_used, host_blocks_used=scheduler.num_host_blocks_used,
        host_blocks_expected=sum(-(-r.num_swapped_tokens // block_size) for r in scheduler.swapped),
        tier_problems=() if scheduler.tiers is None else tuple(scheduler.tiers.problems()),
    )


def _finish_run(scenario: Scenario, workload: Workload, fleet: FleetRun, *, name: str, check: bool,
                client: ClientPath, failed: np.ndarray | None = None, pending: list[int] | None = None) -> None:
    """After the clock stopped: a warm-up that measured nothing is an error, first and last tokens moved to a
    buffering proxy's flushes, each request's produced tokens logged, and (``check``) the run's invariants
    verified. (Decode runs the horizon cut were settled as the clock stopped: ``Replica.stop``.)"""
    if fleet.end_s <= scenario.simulation.warmup_s:
        raise ConfigError(f"the run ended at {fleet.end_s:.4g} s, within simulation.warmup_s "
                          f"({scenario.simulation.warmup_s:.4g} s): no request is measured; shorten the warm-up",
                          field="simulation.warmup_s")
    if client.flush_interval_s > 0:
        fleet.log.flush_deliveries(client.flush_interval_s)
    handoff = handoff_counts(fleet.replicas)
    fleet.log.record_produced({rid: produced for replica in fleet.replicas
                               for rid, (produced, _) in _live(replica, handoff).items()})
    if check_requested(check):
        # A request whose prefill produced its first token, on its way to a decode worker that will stream it
        # (``first_token: decode``): produced, not yet delivered.
        undelivered = ([rid for rid, produced in handoff.items() if produced == 1]
                       if disaggregation_of(scenario).first_token is FirstToken.DECODE else [])
        check_run(fleet.log, [replica_end(replica, handoff) for replica in fleet.replicas], variant=name,
                  num_requests=len(workload), horizon=scenario.simulation.horizon_s is not None, failed=failed,
                  pending=pending or [], undelivered=undelivered)


def num_replicas(scenario: Scenario) -> int:
    """Replicas of the variant's fleet: its pools' together, or the fleet section's."""
    pools = scenario.fleet.pools
    if pools is None:
        return scenario.fleet.replicas
    return sum(pool.replicas for pool in pools.values())


def fleet_setup(scenario: Scenario, setup: ReplicaSetup) -> FleetSetup:
    """The fleet's settings for one variant of a scenario."""
    sim = scenario.simulation
    return FleetSetup(
        num_replicas=scenario.fleet.replicas,
        scheduler=setup.scheduler,
        cost=CostModel(setup.profile, factor=sim.cost_factor),  # issue 8: sensitivity factor
        router=scenario.router,
        seed=scenario.seed,
        network_latency_s=client_path(scenario, [setup.profile]).latency_s,
        sample_interval_s=sim.sample_interval_s,
        fast_path=sim.fast_path,
        horizon_s=sim.horizon_s,
    )


def _summary(scenario: Scenario, fleet: FleetRun, *, num_gpus: int | None = None,
             usd_per_gpu_hour: float | None = None, failed: np.ndarray | None = None,
             gpu_hours: float | None = None) -> Summary:
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
    summary = summarize(
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
        failed=failed,
        gpu_hours=gpu_hours,
    )
    rows = sum(r.scheduler.num_spec_rows for r in replicas)
    if not rows:
        return summary
    drafts = sum(r.scheduler.num_draft_tokens for r in replicas)
    accepted = sum(r.scheduler.num_accepted_tokens for r in replicas)
    return replace(summary, spec_tokens_per_step=1 + accepted / rows, spec_acceptance_rate=accepted / drafts)


def _simulate_dynamic(scenario: Scenario, workload: Workload, *, name: str, progress: ProgressFn | None,
                      inspect: InspectFn | None, prepare: InspectFn | None, check: bool) -> VariantResult:
    """A variant whose replicas come and go (``lifecycle``, ``autoscaling``, ``failures``): the fleet of
    ``fleet.dynamic``, its figures of the day beside the summary."""
    from simulator.fleet.dynamic import DynamicSetup, run_dynamic_fleet
    from simulator.fleet.lifecycle import cold_start
    from simulator.results.day import DayResult, day_figures

    setup = resolve_replica(scenario)
    base = fleet_setup(scenario, setup)
    check_sample_grid(scenario, workload, base.cost)
    lifecycle = scenario.lifecycle if scenario.lifecycle is not None else LifecycleConfig()
    slo = scenario.slo
    run = run_dynamic_fleet(DynamicSetup(
        base=base, tp=scenario.fleet.tp, lifecycle=lifecycle,
        cold_start=cold_start(lifecycle, setup.profile.memory.weight_bytes),
        autoscaling=scenario.autoscaling, failures=scenario.failures,
        ttft_target_ms=None if slo is None else slo.ttft_ms, tpot_target_ms=None if slo is None else slo.tpot_ms,
    ), workload, name=name, progress=progress, inspect=inspect, prepare=prepare)
    fleet = run.fleet
    failed = run.day.failed if scenario.failures is not None else None
    _finish_run(scenario, workload, fleet, name=name, check=check, client=client_path(scenario, [setup.profile]),
                failed=run.day.failed, pending=run.pending)
    price = gpu_price(scenario, scenario.fleet.hardware)
    peak = max((count[1] + count[2] + count[3] for count in run.day.counts), default=scenario.fleet.replicas)
    summary = _summary(scenario, fleet, num_gpus=peak * scenario.fleet.tp, usd_per_gpu_hour=price, failed=failed,
                       gpu_hours=run.gpu_hours)
    policy = scenario.autoscaling.policy if scenario.autoscaling is not None else "static"
    figures = day_figures(run.day, fleet.log, policy=policy, gpu_hours=run.gpu_hours, usd_per_gpu_hour=price,
                          duration_s=fleet.end_s, slo=slo)
    profile = setup.profile
    return VariantResult(name=name, requests=fleet.log, series=fleet.series, summary=summary,
                         profile=ProfileInfo(name=profile.name, kind=profile.kind.value, label=profile.label),
                         day=DayResult(figures=figures, log=run.day))


def gpu_price(scenario: Scenario, hardware: str) -> float | None:
    """What one GPU of ``hardware`` costs an hour in this scenario (its cost section, else the list price;
    None for a calibration device, a CPU, which has none)."""
    try:
        price = get_accelerator(hardware).price_usd_per_gpu_hour
    except Exception:  # a calibration device (a CPU) has no list price: cost is simply not reported
        price = None
    return scenario.cost.resolve_price(price)


def _simulate_pools(scenario: Scenario, workload: Workload, *, name: str, progress: ProgressFn | None,
                    inspect: InspectFn | None, prepare: InspectFn | None, check: bool) -> VariantResult:
    """A variant whose fleet is given as pools: one mixed pool runs as any fleet does; several pools (of
    mixed GPUs, or prefill and decode) run through ``run_pooled_fleet``."""
    from simulator.fleet.pooled import PooledSetup, PoolGroup, run_pooled_fleet
    from simulator.results.handoffs import handoff_figures
    from simulator.results.pools import PoolRecord, blended_price, fleet_figures

    pools = resolve_pools(scenario)
    sim = scenario.simulation
    client = client_path(scenario, [pool.setup.profile for pool in pools])
    costs = [CostModel(pool.setup.profile, factor=sim.cost_factor) for pool in pools]
    speeds = _speeds(pools, costs)
    handoffs = coordinator = None
    tiers = _tier_run(scenario)
    if tiers is not None:
        prepare = _with_tiers(tiers, prepare)
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
            seed=scenario.seed, network_latency_s=client.latency_s,
            sample_interval_s=sim.sample_interval_s, fast_path=sim.fast_path, horizon_s=sim.horizon_s,
        ), workload, name=name, progress=progress, inspect=inspect, prepare=prepare)
        fleet, pool_of, handoffs, coordinator = run.fleet, run.pool_of, run.handoffs, run.coordinator
    _finish_run(scenario, workload, fleet, name=name, check=check, client=client)
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
    tier_figures = None if tiers is None else tiers.figures(fleet.log, summary, warmup_s=sim.warmup_s,
                                                            end_s=fleet.end_s)
    return VariantResult(name=name, requests=fleet.log, series=fleet.series, summary=summary,
                         profile=_pools_profile(pools), fleet=figures, tiers=tier_figures)


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
