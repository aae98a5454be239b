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
   ``metrics.summaries_with_ci``; when the interval of a criterion straddles its threshold at the chosen
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from simulator import yaml_text
from simulator.cost.profile import config_error_from_validation
from simulator.errors import ConfigError
from simulator.results.metrics import SLO, MetricCI, Summary, round_sig, summaries_with_ci
from simulator.scenario import LoadedScenario, deep_merge, expand_dotted, load_mapping, load_scenario
from simulator.workload.workload import Workload

__all__ = [
    "Criterion",
    "KneeResult",
    "PlanResult",
    "ReplicaAnswer",
    "largest_passing_factor",
    "parse_search",
    "parse_slo",
    "plan",
    "smallest_passing",
]

DEFAULT_MAX_REPLICAS = 64
DEFAULT_SENSITIVITY = (0.9, 1.1)
KNEE_REL_TOL = 0.05
"""Bisection on the knee stops when the bracket's upper end is within 5 % of its lower end."""
KNEE_FACTOR_RANGE = (1 / 1024, 1024.0)
"""Time-compression factors the knee search explores; outside it the knee is reported as a bound."""


# ----- the searches (pure; monotone predicates) ---------------------------------------------------------


def smallest_passing(passes: Callable[[int], bool], *, max_n: int, start: int = 1) -> int | None:
    """Smallest ``n`` in [1, max_n] with ``passes(n)``, assuming passes is monotone (False.. then True..).

    Exponential probing from ``start`` — upward at start + 1, start + 3, start + 7, ... (from 1: 2, 4, 8,
    16), or downward when ``start`` already passes — then binary search between the largest failing and
    the smallest passing count. ``None`` when even ``max_n`` fails. Calls ``passes`` O(log n) times.
    """
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    start = min(max(start, 1), max_n)
    lo, hi = 0, start  # lo: largest count known to fail (0 = none); hi: smallest known to pass
    k = 0
    if passes(start):
        while hi > lo + 1:
            k += 1
            n = max(start - (2**k - 1), lo + 1)
            if n >= hi:
                break
            if passes(n):
                hi = n
            else:
                lo = n
                break
    else:
        lo = start
        while True:
            if lo >= max_n:
                return None
            k += 1
            n = min(start + 2**k - 1, max_n)
            if passes(n):
                hi = n
                break
            lo = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return hi


DEFAULT_SEEDS = 2
"""Seeds per point: two give a confidence interval (wide, and the verdict says when the answer is within
it) at one simulation per core on a 2-core machine; three would take two rounds there."""


def largest_passing_factor(passes: Callable[[float], bool], *, start: float = 1.0, rel_tol: float = KNEE_REL_TOL,
                           bounds: tuple[float, float] = KNEE_FACTOR_RANGE) -> tuple[float, float | None]:
    """(largest factor known to pass, smallest known to fail) for a predicate that holds below a knee.

    Doubles or halves from ``start`` until the knee is bracketed, then bisects geometrically until
    ``fail / pass <= 1 + rel_tol``. (0.0, low bound) when even the lowest factor fails; (high bound, None)
    when even the highest passes.
    """
    low, high = bounds
    f = min(max(start, low), high)
    ok: float | None = None
    bad: float | None = None
    if passes(f):
        ok = f
        while bad is None:
            if ok >= high:
                return ok, None
            f = min(ok * 2, high)
            if passes(f):
                ok = f
            else:
                bad = f
    else:
        bad = f
        while ok is None:
            if bad <= low:
                return 0.0, bad
            f = max(bad / 2, low)
            if passes(f):
                ok = f
            else:
                bad = f
    while bad / ok > 1 + rel_tol:
        mid = math.sqrt(ok * bad)
        if passes(mid):
            ok = mid
        else:
            bad = mid
    return ok, bad


# ----- SLO criteria -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Criterion:
    """One condition of the SLO on a Summary metric: ``metric >= threshold`` or ``metric <= threshold``."""

    metric: str
    threshold: float
    at_least: bool
    """True: the metric must reach the threshold (attainment); False: stay under it (a p99 limit)."""

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        return value >= self.threshold if self.at_least else value <= self.threshold

    def straddled(self, ci: MetricCI) -> bool:
        """The confidence interval contains the threshold: another set of seeds could flip the verdict."""
        return math.isfinite(ci.low) and math.isfinite(ci.high) and ci.low <= self.threshold <= ci.high

    def describe(self) -> str:
        return f"{self.metric} {'>=' if self.at_least else '<='} {self.threshold:g}"


def criteria(slo: SLO) -> list[Criterion]:
    """The SLO as criteria on seed-mean summary metrics (per-request thresholds live in attainment)."""
    out = [Criterion(metric="slo_attainment", threshold=slo.target_attainment, at_least=True)]
    for metric, limit in (("ttft_p99_ms", slo.ttft_p99_ms), ("tpot_p99_ms", slo.tpot_p99_ms),
                          ("e2e_p99_ms", slo.e2e_p99_ms)):
        if limit is not None:
            out.append(Criterion(metric=metric, threshold=limit, at_least=False))
    return out


SLO_ALIASES = {"target": "target_attainment", "ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}


def parse_slo(text: str) -> SLO:
    """``ttft_ms=500,tpot_ms=50,target=0.9`` (any SLO field; ``target`` = target_attainment) -> SLO."""
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"expected key=value, got {item!r}", field="--slo")
        values[SLO_ALIASES.get(key.strip(), key.strip())] = yaml_text.safe_load(value)
    try:
        return SLO.model_validate(values)
    except ValidationError as err:
        e = config_error_from_validation(err, SLO)
        raise ConfigError(e.message, field=f"--slo {e.field or ''}".strip()) from None


def parse_search(items: Iterable[str]) -> dict[str, list[Any]]:
    """``["engine.max_num_batched_tokens=2048,8192", ...]`` -> {key: [values]} (values parsed as YAML)."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        values = [yaml_text.safe_load(v) for v in text.split(",") if v.strip()]
        if not sep or not key.strip() or not values:
            raise ConfigError(f"expected key.path=v1,v2,..., got {item!r}", field="--search")
        if key.strip() == "fleet.replicas":
            raise ConfigError("the plan searches fleet.replicas itself; use --max-replicas", field="--search")
        out[key.strip()] = values
    return out


# ----- one simulated point (runs in a worker process) ---------------------------------------------------


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
    from simulator.fleet.fleet import simulate
    from simulator.scenario import resolve_replica
    from simulator.workload.workload import generate

    loaded = load_mapping(point.raw, seed=point.seed, source=Path(point.source) if point.source else None)
    scenario = loaded.scenario
    block_size = resolve_replica(scenario).scheduler.block_size
    key = (scenario.workload.model_dump_json(), scenario.seed, block_size, point.source)
    workload = _WORKLOADS.get(key)
    if workload is None:
        if len(_WORKLOADS) >= 8:
            _WORKLOADS.clear()
        workload = _WORKLOADS[key] = generate(scenario.workload, seed=scenario.seed, block_size=block_size,
                                              base_dir=loaded.base_dir)
    return simulate(scenario, compress(workload, point.load_factor)).summary


# ----- results ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """One point of a search (knobs, replicas, load, cost factor) on every seed."""

    summaries: list[Summary]
    ci: dict[str, MetricCI]
    passes: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaAnswer:
    """The replica search of one knob setting at one cost factor."""

    knobs: dict[str, Any]
    cost_factor: float
    replicas: int | None
    """Smallest passing count; None when even max_replicas fails."""
    at: Evaluation | None
    """The evaluation at ``replicas``."""
    below: Evaluation | None
    """The evaluation at ``replicas - 1`` (None when the answer is 1)."""

    @property
    def cost_per_mtok_usd(self) -> float:
        return self.at.ci["cost_per_mtok_usd"].mean if self.at is not None else math.nan

    def to_dict(self) -> dict[str, Any]:
        def cis(ev: Evaluation | None) -> dict[str, Any] | None:
            if ev is None:
                return None
            keys = ("slo_attainment", "ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms", "cost_per_mtok_usd",
                    "goodput_rps", "throughput_tok_s")
            return {k: ev.ci[k].to_dict() for k in keys}

        return {
            "knobs": self.knobs,
            "cost_factor": self.cost_factor,
            "replicas": self.replicas,
            "at_replicas": cis(self.at),
            "at_replicas_minus_one": cis(self.below),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class KneeResult:
    """Highest sustainable arrival rate of ONE replica (best knobs) with the SLO holding."""

    factor: float
    """Time-compression factor of the scenario's stream at the knee (0: fails even at the lowest)."""
    rate_rps: float
    """Arrival rate at the knee: factor × the stream's mean rate."""
    failing_rate_rps: float | None
    """Lowest rate found to fail (the knee lies between); None when the highest factor tried passed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """Everything ``plan`` found; ``answer`` is the cheapest knob setting's replica search."""

    scenario_name: str
    slo: SLO
    load_factor: float
    stream_rate_rps: float
    """Mean arrival rate of the planned stream (after load_factor), requests per second."""
    seeds: list[int]
    max_replicas: int
    answer: ReplicaAnswer
    candidates: list[ReplicaAnswer]
    knee: KneeResult | None
    sensitivity: dict[float, ReplicaAnswer]
    verdict: str
    within_noise: bool
    trials: pd.DataFrame = field(repr=False)
    """Every simulation run: knobs, replicas, load and cost factors, seed, purpose, summary metrics."""

    @property
    def replicas(self) -> int | None:
        return self.answer.replicas

    @property
    def knobs(self) -> dict[str, Any]:
        return self.answer.knobs

    def candidates_df(self) -> pd.DataFrame:
        """One row per searched knob setting: its replica count, attainment and cost (seed means)."""
        rows = []
        for c in self.candidates:
            row: dict[str, Any] = {**c.knobs, "replicas": c.replicas}
            for metric in ("slo_attainment", "ttft_p99_ms", "tpot_p99_ms", "cost_per_mtok_usd"):
                row[metric] = c.at.ci[metric].mean if c.at is not None else math.nan
            row["best"] = c is self.answer
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "scenario_name": self.scenario_name,
            "slo": self.slo.model_dump(exclude_none=True),
            "load_factor": self.load_factor,
            "stream_rate_rps": round_sig(self.stream_rate_rps),
            "seeds": self.seeds,
            "max_replicas": self.max_replicas,
            "answer": self.answer.to_dict(),
            "verdict": self.verdict,
            "within_noise": self.within_noise,
            "candidates": [c.to_dict() for c in self.candidates],
            "knee": None if self.knee is None else {
                "factor": round_sig(self.knee.factor),
                "rate_rps": round_sig(self.knee.rate_rps),
                "failing_rate_rps": None if self.knee.failing_rate_rps is None else round_sig(
                    self.knee.failing_rate_rps),
            },
            "sensitivity": {f"{factor:g}": a.to_dict() for factor, a in self.sensitivity.items()},
            "num_simulations": len(self.trials),
        }
        out: dict[str, Any] = json.loads(json.dumps(doc, default=str))  # knob values as JSON sees them
        return out

    def save(self, out_dir: str | Path) -> Path:
        """Write plan.json and trials.csv into ``out_dir``; returns the path of plan.json."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / "plan.json"
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n")
        self.trials.to_csv(out / "trials.csv", index=False)
        return path

    def text(self) -> str:
        """The answer as a few readable lines."""
        a = self.answer
        knobs = ", ".join(f"{k}={v}" for k, v in a.knobs.items())
        lines = [f"plan for {self.scenario_name}: {_slo_text(self.slo)} at {self.stream_rate_rps:.3g} req/s "
                 f"({self.load_factor:g}x the scenario's load), seeds {self.seeds}"]
        if a.replicas is None or a.at is None:
            lines.append(f"  answer: the SLO is not met even with {self.max_replicas} replicas")
        else:
            ci = a.at.ci
            lines.append(f"  answer: {a.replicas} replica(s)" + (f" with {knobs}" if knobs else ""))
            lines.append(f"    SLO attainment {_ci_text(ci['slo_attainment'], '.3f', share=True)} "
                         f"(target {self.slo.target_attainment:g}); TTFT p99 {_ci_text(ci['ttft_p99_ms'], '.0f')} ms; "
                         f"TPOT p99 {_ci_text(ci['tpot_p99_ms'], '.1f')} ms")
            lines.append(f"    cost {_ci_text(ci['cost_per_mtok_usd'], '.3f')} $ per million output tokens")
        lines.append(f"  verdict: {self.verdict}")
        if len(self.candidates) > 1:
            lines.append("  searched knobs:")
            for c in self.candidates:
                k = ", ".join(f"{key}={v}" for key, v in c.knobs.items())
                n = "none" if c.replicas is None else str(c.replicas)
                lines.append(f"    {k}: {n} replica(s), {c.cost_per_mtok_usd:.3f} $/Mtok"
                             + ("  <- best" if c is a else ""))
        if self.knee is not None:
            if self.knee.factor == 0.0:
                lines.append("  one replica: the SLO fails even at the lowest load tried")
            elif self.knee.failing_rate_rps is None:
                lines.append(f"  one replica sustains at least {self.knee.rate_rps:.3g} req/s (no knee found)")
            else:
                lines.append(f"  one replica saturates at {self.knee.rate_rps:.3g} req/s "
                             f"(fails at {self.knee.failing_rate_rps:.3g} req/s)")
        for factor, s in self.sensitivity.items():
            n = "none" if s.replicas is None else str(s.replicas)
            lines.append(f"  if step times are x{factor:g}: {n} replica(s), {s.cost_per_mtok_usd:.3f} $/Mtok")
        return "\n".join(lines)


def _ci_text(ci: MetricCI, fmt: str, *, share: bool = False) -> str:
    """``mean [low, high]``; a share (attainment) has its t-interval clipped to [0, 1] for display."""
    if not math.isfinite(ci.mean):
        return "-"
    if not (math.isfinite(ci.low) and math.isfinite(ci.high)):
        return format(ci.mean, fmt)
    low, high = (max(ci.low, 0.0), min(ci.high, 1.0)) if share else (ci.low, ci.high)
    return f"{ci.mean:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def _slo_text(slo: SLO) -> str:
    parts = [f"{k}<={v:g}" for k, v in slo.model_dump(exclude_none=True).items() if k != "target_attainment"]
    return f"SLO {', '.join(parts) or '(none)'} for {slo.target_attainment:.0%} of requests"


# ----- the planner --------------------------------------------------------------------------------------


class _Evaluator:
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
        summaries = list(self.pool.map(_simulate_point, points)) if self.pool else [_simulate_point(p)
                                                                                    for p in points]
        ci = summaries_with_ci(summaries)
        ev = Evaluation(summaries=summaries, ci=ci, passes=all(c.holds(ci[c.metric].mean) for c in self.crit))
        self.cache[key] = ev
        for seed, s in zip(self.seeds, summaries, strict=True):
            self.trials.append({"purpose": purpose, **knobs, "replicas": replicas, "load_factor": load_factor,
                                "cost_factor": cost_factor, "seed": seed, "passes": ev.passes, **s.to_dict()})
        if self.log is not None:
            k = " ".join(f"{name}={v}" for name, v in knobs.items())
            self.log(f"  {purpose:11s} replicas={replicas:<3d} load x{load_factor:<7.4g} cost x{cost_factor:<4g} {k} "
                     f"attainment {_ci_text(ci['slo_attainment'], '.3f', share=True)} "
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
    upper = [c.describe() for c in crit if c.straddled(answer.at.ci[c.metric])]
    if upper:
        return (f"within noise: {n} or {n + 1} replicas (the 95 % CI of {', '.join(upper)} straddles the "
                f"threshold at {n}; {n + 1} is the safe choice)"), True
    if answer.below is not None:
        lower = [c.describe() for c in crit if c.straddled(answer.below.ci[c.metric])]
        if lower:
            return (f"within noise: {n - 1} or {n} replicas (at {n - 1} the 95 % CI of {', '.join(lower)} "
                    f"straddles the threshold)"), True
    return f"{n} replica(s), clear of the noise across {num_seeds} seeds", False


def _stream_rate(loaded: LoadedScenario, load_factor: float) -> float:
    from simulator.scenario import resolve_replica
    from simulator.workload.workload import generate

    sc = loaded.scenario
    w = generate(sc.workload, seed=sc.seed, block_size=resolve_replica(sc).scheduler.block_size,
                 base_dir=loaded.base_dir)
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
    overrides = tuple(overrides)
    if isinstance(scenario, LoadedScenario):
        loaded = scenario if not overrides else load_mapping(scenario.raw, overrides, source=scenario.source)
    elif isinstance(scenario, Mapping):
        loaded = load_mapping(dict(scenario), overrides)
    else:
        loaded = load_scenario(scenario, overrides)
    if not load_factor > 0:
        raise ConfigError(f"load_factor must be > 0, got {load_factor}", field="load_factor")
    if max_replicas < 1:
        raise ConfigError(f"max_replicas must be >= 1, got {max_replicas}", field="max_replicas")
    raw = {k: v for k, v in loaded.raw.items() if k != "variants"}
    if variant is not None:
        if variant not in loaded.scenario.variants:
            raise ConfigError(f"no variant {variant!r}; variants are {sorted(loaded.scenario.variants)}",
                              file=loaded.source, field="variants")
        raw = deep_merge(raw, expand_dotted(loaded.scenario.variants[variant]))
    if slo is not None:
        chosen = parse_slo(slo) if isinstance(slo, str) else slo if isinstance(slo, SLO) else SLO.model_validate(slo)
        raw["slo"] = chosen.model_dump(exclude_none=True)
    if raw.get("slo") is None:
        raise ConfigError("the plan needs an SLO: give --slo or an slo: section", file=loaded.source, field="slo")
    loaded = load_mapping(raw, source=loaded.source)  # validates the SLO and the variant
    the_slo = loaded.scenario.slo
    assert the_slo is not None
    seed_list = list(range(loaded.scenario.seed, loaded.scenario.seed + seeds)) if isinstance(seeds, int) else list(
        seeds)
    if not seed_list:
        raise ConfigError("the plan needs at least one seed", field="seeds")
    space = dict(search or {})
    combos = [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]
    for combo in combos:  # a bad knob is one error now, not a failure halfway through the search
        load_mapping(deep_merge(raw, expand_dotted(combo)), source=loaded.source)
    crit = criteria(the_slo)
    base_cost = loaded.scenario.simulation.cost_factor
    num_workers = min(workers or multiprocessing.cpu_count(), len(seed_list))
    pool = (ProcessPoolExecutor(max_workers=num_workers, mp_context=multiprocessing.get_context("spawn"))
            if num_workers > 1 else None)
    try:
        ev = _Evaluator(raw, str(loaded.source) if loaded.source else None, seed_list, crit, pool, log)
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
        stream_rate = _stream_rate(loaded, load_factor)
        knee_result = None
        if knee:
            def one_replica_passes(f: float) -> bool:
                return ev(best.knobs, 1, load_factor=f, cost_factor=base_cost, purpose="knee").passes

            ok, bad = largest_passing_factor(one_replica_passes, start=load_factor / start)
            base_rate = stream_rate / load_factor
            knee_result = KneeResult(factor=ok, rate_rps=ok * base_rate,
                                     failing_rate_rps=None if bad is None else bad * base_rate)
    finally:
        if pool is not None:
            pool.shutdown()
    return PlanResult(
        scenario_name=loaded.scenario.name,
        slo=the_slo,
        load_factor=load_factor,
        stream_rate_rps=stream_rate,
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


def _nan_last(value: float) -> float:
    return value if math.isfinite(value) else math.inf


def print_log(line: str) -> None:
    """A ``log`` for ``plan`` that writes progress lines to stderr."""
    print(line, file=sys.stderr, flush=True)
