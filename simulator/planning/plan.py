"""Capacity planning: the smallest fleet that meets an SLO at a given load, and what it costs.

``plan(scenario, slo=...)`` answers, for the scenario's request stream (optionally ``load_factor`` times
faster):

1. **Replicas.** The smallest replica count whose SLO holds, for each setting of the searched engine knobs;
   the answer is the setting with the lowest cost per million output tokens. The count is found by
   exponential probing (1, 2, 4, 8, ...) then binary search between the last failing and the first
   passing count (``smallest_passing``).
2. **Saturation knee of one replica.** The highest arrival rate one replica sustains with the SLO holding,
   by bisection (in log space) on a time-compression factor of the request stream
   (``largest_passing_factor``).
3. **Noise.** Every point runs on several seeds; the SLO holds at a point when it holds for the *mean*
   over seeds (attainment ≥ target, every p99 limit ≥ the mean p99). Confidence intervals come from
   ``results.intervals.summaries_with_ci``; when the interval of a criterion straddles its threshold at the chosen
   count (or at one less), the verdict says the answer is within noise ("N or N+1").
4. **Sensitivity.** The replica search again with every step time ×0.9 and ×1.1
   (``simulation.cost_factor``): how the answer moves if the cost model is off by ±10 %.

Why the searches are valid (and what they assume): for a fixed request stream, adding a replica never
lowers SLO attainment — each replica sees a subset of the same requests and the router spreads them over
more servers — and a faster stream (the same requests, arrival times divided by the factor) never raises
it. Both are monotone in practice rather than by theorem (a router's choices can shift in ways that hurt
a few requests), so the tests check them on seeded scenarios and compare the search with a brute-force
scan. If a non-monotone stretch exists, the answer is still a count that passes with one less failing.

Load scaling compresses time: the same requests (lengths, prefixes, sessions) arrive ``factor`` times
faster. Session think times compress too.

Simulations run as independent tasks (one per seed) on a spawn process pool; nothing here mutates a
scenario — each point is a new mapping validated by the scenario loader.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.errors import ConfigError
from simulator.planning.criteria import Criterion, criteria, parse_slo
from simulator.planning.plan_result import Evaluation, KneeResult, PlanResult, ReplicaAnswer, ci_text
from simulator.planning.search import largest_passing_factor, smallest_passing
from simulator.results.intervals import summaries_with_ci
from simulator.results.summary import SLO, Summary
from simulator.scenario import SEED_LIMIT, LoadedScenario, deep_merge, expand_dotted, load_mapping, load_scenario
from simulator.worker_pool import explained, spawn_pool
from simulator.workload.workload import Workload

__all__ = ["PlanResult", "plan"]


DEFAULT_MAX_REPLICAS = 64


DEFAULT_SENSITIVITY = (0.9, 1.1)


from simulator.planning import DEFAULT_SEEDS  # noqa: E402  (re-exported: the planner's default)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Point:
    raw: dict[str, Any]
    source: str | None
    seed: int
    load_factor: float


_WORKLOADS: dict[tuple[str, int, int, str | None], Workload] = {}
"""Per worker process: generated streams, so a search does not regenerate one per replica count."""


def compress(workload: Workload, factor: float) -> Workload:
    """The same requests arriving ``factor`` times faster (arrival times divided by ``factor``)."""
    if factor == 1.0:
        return workload
    return Workload(
        arrival_s=workload.arrival_s / factor,
        prompt_tokens=workload.prompt_tokens,
        output_tokens=workload.output_tokens,
        block_size=workload.block_size,
        session_id=workload.session_id,
        # Block keys depend on the requests, not on when they arrive. (Workload has no public copy-with-new-
        # arrivals yet; reading its private field here is the one place that relies on its internals.)
        block_keys=workload._block_keys,
    )


def _simulate_point(point: _Point) -> Summary:
    """Top-level (spawn-safe): validate the mapping, replay the (compressed) stream, return the Summary."""
    from simulator.scenario import fleet_block_size
    from simulator.simulation import simulate
    from simulator.workload.generate import generate

    loaded = load_mapping(point.raw, seed=point.seed, source=Path(point.source) if point.source else None)
    scenario = loaded.scenario
    block_size = fleet_block_size(scenario)
    key = (scenario.workload.model_dump_json(), scenario.seed, block_size, point.source)
    workload = _WORKLOADS.get(key)
    if workload is None:
        if len(_WORKLOADS) >= 8:
            _WORKLOADS.clear()
        workload = _WORKLOADS[key] = generate(scenario.workload, seed=scenario.seed, block_size=block_size,
                                              base_dir=loaded.base_dir)
    return simulate(scenario, compress(workload, point.load_factor)).summary


class Evaluator:
    """Runs points on every seed (in parallel when a pool is given), caches them and records trials."""

    def __init__(self, base: dict[str, Any], source: str | None, seeds: list[int], crit: list[Criterion],
                 pool: ProcessPoolExecutor | None, log: Callable[[str], None] | None) -> None:
        self.base, self.source, self.seeds, self.crit = base, source, seeds, crit
        self.pool, self.log = pool, log
        self.cache: dict[str, Evaluation] = {}
        self.trials: list[dict[str, Any]] = []

    def __call__(self, knobs: Mapping[str, Any], replicas: int, *, load_factor: float, cost_factor: float,
                 purpose: str) -> Evaluation:
        overrides = {**knobs, "fleet.replicas": replicas, "simulation.cost_factor": cost_factor}
        key = json.dumps([overrides, load_factor], sort_keys=True, default=str)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        raw = deep_merge(self.base, expand_dotted(overrides))
        points = [_Point(raw=raw, source=self.source, seed=s, load_factor=load_factor) for s in self.seeds]
        if self.pool is None:
            summaries = [_simulate_point(p) for p in points]
        else:
            with explained("running a plan's simulation", "workers=1 (--workers 1)"):
                summaries = list(self.pool.map(_simulate_point, points))
        ci = summaries_with_ci(summaries)
        ev = Evaluation(summaries=summaries, ci=ci, passes=all(c.holds(ci[c.metric].mean) for c in self.crit))
        self.cache[key] = ev
        for seed, s in zip(self.seeds, summaries, strict=True):
            self.trials.append({"purpose": purpose, **knobs, "replicas": replicas, "load_factor": load_factor,
                                "cost_factor": cost_factor, "seed": seed, "passes": ev.passes, **s.to_dict()})
        if self.log is not None:
            k = " ".join(f"{name}={v}" for name, v in knobs.items())
            self.log(f"  {purpose:11s} replicas={replicas:<3d} load x{load_factor:<7.4g} cost x{cost_factor:<4g} {k} "
                     f"attainment {ci_text(ci['slo_attainment'], '.3f')} "
                     f"-> {'meets' if ev.passes else 'fails'}")
        return ev

    def search(self, knobs: Mapping[str, Any], *, load_factor: float, cost_factor: float, max_replicas: int,
               start: int, purpose: str) -> ReplicaAnswer:
        def passes(n: int) -> bool:
            return self(knobs, n, load_factor=load_factor, cost_factor=cost_factor, purpose=purpose).passes

        n = smallest_passing(passes, max_n=max_replicas, start=start)
        at = below = None
        if n is not None:
            at = self(knobs, n, load_factor=load_factor, cost_factor=cost_factor, purpose=purpose)
            if n > 1:
                below = self(knobs, n - 1, load_factor=load_factor, cost_factor=cost_factor, purpose=purpose)
        return ReplicaAnswer(knobs=dict(knobs), cost_factor=cost_factor, replicas=n, at=at, below=below)


def _verdict(answer: ReplicaAnswer, crit: list[Criterion], num_seeds: int) -> tuple[str, bool]:
    n = answer.replicas
    if n is None or answer.at is None:
        return "no answer: the SLO is not met within max_replicas", False
    if num_seeds < 2:
        return f"{n} replica(s) (one seed: no confidence interval; use several seeds to judge noise)", False
    upper = [f"{c.describe()} ({answer.at.ci[c.metric].describe()})" for c in crit
             if c.straddled(answer.at.ci[c.metric])]
    if upper:
        return (f"within noise: {n} or {n + 1} replicas (at {n} the threshold lies inside {', '.join(upper)}; "
                f"{n + 1} is the safe choice)"), True
    if answer.below is not None:
        lower = [f"{c.describe()} ({answer.below.ci[c.metric].describe()})" for c in crit
                 if c.straddled(answer.below.ci[c.metric])]
        if lower:
            return (f"within noise: {n - 1} or {n} replicas (at {n - 1} the threshold lies inside "
                    f"{', '.join(lower)})"), True
    return f"{n} replica(s), clear of the noise across {num_seeds} seeds", False


def stream_rate(loaded: LoadedScenario, load_factor: float) -> float:
    from simulator.scenario import fleet_block_size
    from simulator.workload.generate import generate

    sc = loaded.scenario
    w = generate(sc.workload, seed=sc.seed, block_size=fleet_block_size(sc), base_dir=loaded.base_dir)
    if len(w) < 2 or w.arrival_s[-1] <= w.arrival_s[0]:
        return math.nan
    return (len(w) - 1) / float(w.arrival_s[-1] - w.arrival_s[0]) * load_factor


def plan(
    scenario: str | Path | LoadedScenario | Mapping[str, Any],
    *,
    slo: SLO | str | Mapping[str, Any] | None = None,
    load_factor: float = 1.0,
    max_replicas: int = DEFAULT_MAX_REPLICAS,
    search: Mapping[str, Sequence[Any]] | None = None,
    seeds: int | Sequence[int] = DEFAULT_SEEDS,
    overrides: Sequence[str] = (),
    variant: str | None = None,
    knee: bool = True,
    sensitivity: Sequence[float] = DEFAULT_SENSITIVITY,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
) -> PlanResult:
    """Plan capacity for ``scenario`` (see the module docstring).

    ``slo`` overrides the scenario's (a SLO, its mapping, or ``"ttft_ms=500,target=0.9"``); ``seeds`` is a
    count (the scenario's seed and the next ones) or explicit seeds; ``search`` maps dotted engine keys to
    the values to try; ``workers`` processes run the seeds of a point in parallel (default: one per seed,
    at most the CPU count; 1 runs everything in this process).
    """
    loaded = loaded_scenario(scenario, tuple(overrides))
    check_load_and_seeds(load_factor, seeds)
    if max_replicas < 1:
        raise ConfigError(f"max_replicas must be >= 1, got {max_replicas}", field="max_replicas")
    loaded, raw = planned_scenario(loaded, slo=slo, variant=variant)
    the_slo = loaded.scenario.slo
    assert the_slo is not None
    seed_list = list(range(loaded.scenario.seed, loaded.scenario.seed + seeds)) if isinstance(seeds, int) else list(
        seeds)
    if not seed_list:
        raise ConfigError("the plan needs at least one seed", field="seeds")
    combos = _knob_combos(raw, search or {}, loaded.source)
    crit = criteria(the_slo)
    base_cost = loaded.scenario.simulation.cost_factor
    num_workers = min(workers or multiprocessing.cpu_count(), len(seed_list))
    pool = spawn_pool(num_workers) if num_workers > 1 else None
    try:
        ev = Evaluator(raw, str(loaded.source) if loaded.source else None, seed_list, crit, pool, log)
        candidates = [
            ev.search(combo, load_factor=load_factor, cost_factor=base_cost, max_replicas=max_replicas, start=1,
                      purpose="replicas")
            for combo in combos
        ]
        answered = [c for c in candidates if c.replicas is not None]
        best = min(answered, key=lambda c: (_nan_last(c.cost_per_mtok_usd), c.replicas)) if answered else candidates[0]
        verdict, noisy = _verdict(best, crit, len(seed_list))
        start = best.replicas or max_replicas
        sens = {
            factor: ev.search(best.knobs, load_factor=load_factor, cost_factor=base_cost * factor,
                              max_replicas=max_replicas, start=start, purpose="sensitivity")
            for factor in sensitivity
        }
        rate = stream_rate(loaded, load_factor)
        knee_result = _knee(ev, best, load_factor=load_factor, cost_factor=base_cost, start=start,
                            stream_rate_rps=rate) if knee else None
    finally:
        if pool is not None:
            pool.shutdown()
    return PlanResult(
        scenario_name=loaded.scenario.name,
        slo=the_slo,
        load_factor=load_factor,
        stream_rate_rps=rate,
        seeds=seed_list,
        max_replicas=max_replicas,
        answer=best,
        candidates=candidates,
        knee=knee_result,
        sensitivity=sens,
        verdict=verdict,
        within_noise=noisy,
        trials=pd.DataFrame(ev.trials),
    )


def loaded_scenario(scenario: str | Path | LoadedScenario | Mapping[str, Any],
                    overrides: tuple[str, ...]) -> LoadedScenario:
    if isinstance(scenario, LoadedScenario):
        return scenario if not overrides else load_mapping(scenario.raw, overrides, source=scenario.source)
    if isinstance(scenario, Mapping):
        return load_mapping(dict(scenario), overrides)
    return load_scenario(scenario, overrides)


def planned_scenario(loaded: LoadedScenario, *, slo: SLO | str | Mapping[str, Any] | None, variant: str | None
                      ) -> tuple[LoadedScenario, dict[str, Any]]:
    """The scenario the plan searches (the chosen variant merged in, the given SLO fields merged over the
    scenario's), validated, and its raw mapping without variants."""
    raw = {k: v for k, v in loaded.raw.items() if k != "variants"}
    if variant is not None:
        if variant not in loaded.scenario.variants:
            raise ConfigError(f"no variant {variant!r}; variants are {sorted(loaded.scenario.variants)}",
                              file=loaded.source, field="variants")
        raw = deep_merge(raw, expand_dotted(loaded.scenario.variants[variant]))
    if slo is not None:
        chosen = parse_slo(slo) if isinstance(slo, str) else slo if isinstance(slo, SLO) else SLO.model_validate(slo)
        # Only the fields given replace the scenario's: --slo ttft_ms=500 keeps the scenario's TPOT limit.
        raw["slo"] = {**(raw.get("slo") or {}), **chosen.model_dump(exclude_unset=True, exclude_none=True)}
    if raw.get("slo") is None:
        raise ConfigError("the plan needs an SLO: give --slo or an slo: section", file=loaded.source, field="slo")
    return load_mapping(raw, source=loaded.source), raw  # validates the SLO and the variant


def _knob_combos(raw: dict[str, Any], search: Mapping[str, Sequence[Any]], source: Path | None) -> list[dict[str, Any]]:
    """Every combination of the searched knobs, each checked now: a bad knob is one error up front, not a
    failure halfway through the search."""
    space = dict(search)
    combos = [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]
    for combo in combos:
        load_mapping(deep_merge(raw, expand_dotted(combo)), source=source)
    return combos


def _knee(ev: Evaluator, best: ReplicaAnswer, *, load_factor: float, cost_factor: float, start: int,
          stream_rate_rps: float) -> KneeResult:
    """The highest arrival rate one replica of the best setting sustains with the SLO holding."""
    def one_replica_passes(f: float) -> bool:
        return ev(best.knobs, 1, load_factor=f, cost_factor=cost_factor, purpose="knee").passes

    ok, bad = largest_passing_factor(one_replica_passes, start=load_factor / start)
    base_rate = stream_rate_rps / load_factor
    return KneeResult(factor=ok, rate_rps=ok * base_rate, failing_rate_rps=None if bad is None else bad * base_rate)


MAX_SEEDS = 1000
"""Most seeds a plan runs each point with (each is a whole simulation per point tried)."""


def check_load_and_seeds(load_factor: float, seeds: int | Sequence[int]) -> None:
    """A plan's load factor (finite, > 0) and seeds (a count of 1 to ``MAX_SEEDS``, or seeds each 0 to
    2**63 - 1, as a scenario's), refused in one line before anything runs."""
    if not (load_factor > 0 and math.isfinite(load_factor)):
        raise ConfigError(f"load_factor must be a finite number > 0, got {load_factor}", field="load_factor")
    if isinstance(seeds, int):
        if not 1 <= seeds <= MAX_SEEDS:
            raise ConfigError(f"seeds must be a count from 1 to {MAX_SEEDS}, got {seeds}", field="seeds")
    elif not all(isinstance(seed, int) and 0 <= seed < SEED_LIMIT for seed in seeds):
        raise ConfigError(f"seeds must be whole numbers from 0 to {SEED_LIMIT - 1}", field="seeds")


def _nan_last(value: float) -> float:
    return value if math.isfinite(value) else math.inf


def print_log(line: str) -> None:
    """A ``log`` for ``plan`` that writes progress lines to stderr."""
    print(line, file=sys.stderr, flush=True)
