"""Layout planning: aggregated or disaggregated, with how many prefill and decode workers (xPyD) of which
GPU, for the fewest GPUs or the lowest cost meeting the SLO at the scenario's load.

For each layout asked for (``aggregated``: mixed replicas; ``disaggregated``: a prefill pool and a decode
pool) and each GPU type per pool, the search finds the smallest fleet whose SLO holds (on the mean over
seeds, as ``plan`` judges a point):

- aggregated: the smallest replica count (``smallest_passing``);
- disaggregated: for x = 1, 2, ... prefill workers, the smallest y decode workers (``smallest_passing``
  from the last x's answer, since more prefill workers never need more decode workers), until x prefill
  GPUs alone cost more than the best answer found. Monotone in each of x and y in practice rather than
  by theorem, as ``plan``'s replica search is.

The answer is the layout with the fewest GPUs (ties: lower cost) or the lowest cost per million output
tokens; the result lists every layout's best with its goodput per GPU (DistServe's measure of a
placement), so "disaggregate or not" reads off one table. Pools the scenario declares give the templates
(their engine settings, tp); their replicas and hardware are what the search sets.
"""

from __future__ import annotations

import json
import math
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from simulator.cost.profile import get_accelerator
from simulator.errors import ConfigError
from simulator.planning.criteria import criteria
from simulator.planning.plan import Evaluator, check_load_and_seeds, loaded_scenario, planned_scenario, stream_rate
from simulator.planning.plan_result import Evaluation, ci_text, save_answer, slo_text
from simulator.planning.search import smallest_passing
from simulator.results.summary import SLO, round_sig
from simulator.scenario import LoadedScenario
from simulator.worker_pool import spawn_pool

Layout = Literal["aggregated", "disaggregated"]
LAYOUTS: tuple[Layout, ...] = ("aggregated", "disaggregated")
Objective = Literal["gpus", "cost"]
DEFAULT_MAX_GPUS = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutAnswer:
    """The best fleet of one layout and GPU choice, or none within the GPU limit."""

    layout: Layout
    hardware: dict[str, str]
    """GPU per role: {"mixed": ...} or {"prefill": ..., "decode": ...}."""
    replicas: dict[str, int] | None
    """Replicas per role at the answer; None when nothing up to the limit meets the SLO."""
    gpus: int | None
    usd_per_hour: float | None
    knobs: dict[str, Any]
    at: Evaluation | None

    @property
    def name(self) -> str:
        if self.replicas is None:
            return f"{self.layout} ({self._gpus_text()})"
        if self.layout == "aggregated":
            return f"aggregated {self.replicas['mixed']}x{self.hardware['mixed']}"
        return (f"{self.replicas['prefill']}P{self.replicas['decode']}D "
                f"({self.hardware['prefill']} prefill, {self.hardware['decode']} decode)")

    def _gpus_text(self) -> str:
        return ", ".join(f"{role} {gpu}" for role, gpu in self.hardware.items())

    def metric(self, name: str) -> float:
        return self.at.ci[name].mean if self.at is not None else math.nan

    @property
    def goodput_per_gpu_rps(self) -> float:
        return self.metric("goodput_rps") / self.gpus if self.gpus else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout, "hardware": self.hardware, "replicas": self.replicas, "gpus": self.gpus,
            "usd_per_hour": None if self.usd_per_hour is None else round_sig(self.usd_per_hour),
            "knobs": self.knobs,
            **{name: round_sig(self.metric(name)) for name in ("slo_attainment", "ttft_p99_ms", "tpot_p99_ms",
                                                               "goodput_rps", "cost_per_mtok_usd")},
            "goodput_per_gpu_rps": round_sig(self.goodput_per_gpu_rps),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutPlan:
    """Every layout's best fleet and the one the objective picks."""

    scenario_name: str
    slo: SLO
    load_factor: float
    stream_rate_rps: float
    seeds: list[int]
    objective: Objective
    max_gpus: int
    answers: list[LayoutAnswer]
    best: LayoutAnswer | None
    trials: pd.DataFrame = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "scenario_name": self.scenario_name, "slo": self.slo.model_dump(exclude_none=True),
            "load_factor": self.load_factor, "stream_rate_rps": round_sig(self.stream_rate_rps), "seeds": self.seeds,
            "objective": self.objective, "max_gpus": self.max_gpus,
            "layouts": [a.to_dict() for a in self.answers],
            "best": None if self.best is None else self.best.name,
            "num_simulations": len(self.trials),
        }
        out: dict[str, Any] = json.loads(json.dumps(doc, default=str))
        return out

    def save(self, out_dir: str | Path) -> Path:
        """Write layouts.json and trials.csv into ``out_dir``; returns the path of layouts.json."""
        return save_answer(out_dir, "layouts.json", self.to_dict(), self.trials)

    def text(self) -> str:
        fewest = "GPUs" if self.objective == "gpus" else "dollars"
        lines = [f"layouts for {self.scenario_name}: {slo_text(self.slo)} at {self.stream_rate_rps:.3g} req/s "
                 f"({self.load_factor:g}x the scenario's load), fewest {fewest}, seeds {self.seeds}"]
        for a in self.answers:
            if a.gpus is None:
                lines.append(f"  {a.name}: the SLO is not met within {self.max_gpus} GPUs")
                continue
            assert a.at is not None
            lines.append(f"  {a.name}: {a.gpus} GPU(s), ${a.usd_per_hour or math.nan:.2f}/h; attainment "
                         f"{ci_text(a.at.ci['slo_attainment'], '.3f')}, goodput per GPU "
                         f"{a.goodput_per_gpu_rps:.3g} req/s, {a.metric('cost_per_mtok_usd'):.3f} $/Mtok"
                         + ("  <- best" if a is self.best else ""))
        if self.best is None:
            lines.append("  answer: no layout meets the SLO within the GPU limit")
        else:
            lines.append(f"  answer: {self.best.name}")
        return "\n".join(lines)


def plan_layouts(
    scenario: str | Path | LoadedScenario | Mapping[str, Any],
    *,
    slo: SLO | str | Mapping[str, Any] | None = None,
    layouts: Sequence[Layout] = LAYOUTS,
    hardware: Mapping[str, Sequence[str]] | None = None,
    objective: Objective = "gpus",
    max_gpus: int = DEFAULT_MAX_GPUS,
    load_factor: float = 1.0,
    seeds: int | Sequence[int] = 2,
    overrides: Sequence[str] = (),
    variant: str | None = None,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
) -> LayoutPlan:
    """Plan the layout of ``scenario`` (see the module docstring). ``hardware`` maps a role (mixed, prefill,
    decode) to the GPUs to try for it (default: the scenario's)."""
    check_load_and_seeds(load_factor, seeds)
    if max_gpus < 1:
        raise ConfigError(f"max_gpus must be >= 1, got {max_gpus}", field="max_gpus")
    unknown = [layout for layout in layouts if layout not in LAYOUTS]
    if unknown or not layouts:
        raise ConfigError(f"layouts are {', '.join(LAYOUTS)}; got {', '.join(layouts) or 'none'}", field="layouts")
    loaded, raw = planned_scenario(loaded_scenario(scenario, tuple(overrides)), slo=slo, variant=variant)
    the_slo = loaded.scenario.slo
    assert the_slo is not None
    templates, base = _templates(raw)
    choices = {role: list((hardware or {}).get(role) or [templates[role].get("hardware") or base["fleet"].get(
        "hardware", "H200")]) for role in ("mixed", "prefill", "decode")}
    for role, gpus in choices.items():
        for gpu in gpus:
            try:
                get_accelerator(gpu)
            except ConfigError as err:
                raise ConfigError(err.message, field=f"hardware.{role}") from None
    seed_list = list(range(loaded.scenario.seed, loaded.scenario.seed + seeds)) if isinstance(seeds, int) else list(
        seeds)
    num_workers = min(workers or multiprocessing.cpu_count(), len(seed_list))
    pool = spawn_pool(num_workers) if num_workers > 1 else None
    try:
        ev = Evaluator(base, str(loaded.source) if loaded.source else None, seed_list, criteria(the_slo), pool, log)
        search = _Search(ev, load_factor, loaded.scenario.simulation.cost_factor, max_gpus, objective, templates,
                         base, loaded)
        answers: list[LayoutAnswer] = []
        if "aggregated" in layouts:
            answers += [search.aggregated(gpu) for gpu in choices["mixed"]]
        if "disaggregated" in layouts:
            answers += [search.disaggregated(p, d) for p in choices["prefill"] for d in choices["decode"]]
    finally:
        if pool is not None:
            pool.shutdown()
    found = [a for a in answers if a.gpus is not None]
    best = min(found, key=search.rank) if found else None
    return LayoutPlan(scenario_name=loaded.scenario.name, slo=the_slo, load_factor=load_factor,
                      stream_rate_rps=stream_rate(loaded, load_factor), seeds=seed_list, objective=objective,
                      max_gpus=max_gpus, answers=answers, best=best, trials=pd.DataFrame(ev.trials))


def _templates(raw: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The pool templates per role (a declared pool of that role, else a bare one) and the base mapping
    without pools (each layout sets its own)."""
    fleet = dict(raw.get("fleet") or {})
    declared = fleet.pop("pools", None) or {}
    templates: dict[str, dict[str, Any]] = {"mixed": {}, "prefill": {}, "decode": {}}
    for pool in declared.values():
        role = str(pool.get("role", "mixed"))
        if role in templates and not templates[role]:
            templates[role] = {k: v for k, v in pool.items() if k not in ("replicas", "role")}
    fleet_fields = ("hardware", "model", "tp", "profile", "weight_dtype")
    templates["mixed"] = {**{k: fleet[k] for k in fleet_fields if k in fleet}, **templates["mixed"]}
    return templates, {**raw, "fleet": fleet}


class _Search:
    """The searches of one plan over one evaluator."""

    def __init__(self, ev: Evaluator, load_factor: float, cost_factor: float, max_gpus: int, objective: Objective,
                 templates: dict[str, dict[str, Any]], base: dict[str, Any], loaded: LoadedScenario) -> None:
        self.ev, self.load_factor, self.cost_factor = ev, load_factor, cost_factor
        self.max_gpus, self.objective, self.templates, self.base = max_gpus, objective, templates, base
        self.base_hardware = str(base["fleet"].get("hardware", "H200"))
        self.price_override = loaded.scenario.cost.usd_per_gpu_hour

    def rank(self, answer: LayoutAnswer) -> tuple[float, float]:
        cost = answer.metric("cost_per_mtok_usd")
        cost = cost if math.isfinite(cost) else math.inf
        return (float(answer.gpus or 0), cost) if self.objective == "gpus" else (cost, float(answer.gpus or 0))

    def price(self, gpu: str) -> float:
        return self.price_override if self.price_override is not None else get_accelerator(gpu).price_usd_per_gpu_hour

    def _tp(self, role: str) -> int:
        return int(self.templates[role].get("tp") or self.base["fleet"].get("tp", 1))

    def _evaluate(self, knobs: dict[str, Any], replicas: int) -> Evaluation:
        return self.ev(knobs, replicas, load_factor=self.load_factor, cost_factor=self.cost_factor, purpose="layout")

    def aggregated(self, gpu: str) -> LayoutAnswer:
        tp = self._tp("mixed")
        knobs: dict[str, Any] = {"fleet.hardware": gpu}
        if gpu.lower() != self.base_hardware.lower():
            knobs["fleet.profile"] = None  # the shipped profile of the other GPU
        n = smallest_passing(lambda n: self._evaluate(knobs, n).passes, max_n=max(1, self.max_gpus // tp))
        if n is None or n * tp > self.max_gpus:
            return LayoutAnswer(layout="aggregated", hardware={"mixed": gpu}, replicas=None, gpus=None,
                                usd_per_hour=None, knobs=knobs, at=None)
        return LayoutAnswer(layout="aggregated", hardware={"mixed": gpu}, replicas={"mixed": n}, gpus=n * tp,
                            usd_per_hour=n * tp * self.price(gpu), knobs={**knobs, "fleet.replicas": n},
                            at=self._evaluate(knobs, n))

    def _pools(self, prefill_gpu: str, decode_gpu: str, x: int, y: int) -> dict[str, Any]:
        knobs: dict[str, Any] = {}
        for role, gpu, count in (("prefill", prefill_gpu, x), ("decode", decode_gpu, y)):
            template = self.templates[role]
            pool = {**template, "role": role, "replicas": count, "hardware": gpu}
            if "profile" in template and gpu.lower() != str(template.get("hardware", self.base_hardware)).lower():
                del pool["profile"]  # named for another GPU; without one a pool takes the shipped one of its own
            for key, value in _flatten(pool).items():
                knobs[f"fleet.pools.{role}.{key}"] = value
        return knobs

    def disaggregated(self, prefill_gpu: str, decode_gpu: str) -> LayoutAnswer:
        tp_p, tp_d = self._tp("prefill"), self._tp("decode")
        price_p, price_d = tp_p * self.price(prefill_gpu), tp_d * self.price(decode_gpu)
        best: tuple[int, int, Evaluation] | None = None
        hint = 1
        x = 1
        while x * tp_p + tp_d <= self.max_gpus:
            if best is not None:
                bx, by, _ = best
                floor = (x * tp_p + tp_d, x * price_p + price_d)  # the cheapest fleet with x prefill workers
                bound = (bx * tp_p + by * tp_d, bx * price_p + by * price_d)
                if (floor[0] > bound[0]) if self.objective == "gpus" else (floor[1] >= bound[1]):
                    break
            max_y = (self.max_gpus - x * tp_p) // tp_d

            def passes(y: int, x: int = x) -> bool:
                return self._evaluate(self._pools(prefill_gpu, decode_gpu, x, y), x + y).passes

            y = smallest_passing(passes, max_n=max_y, start=min(hint, max_y))
            if y is not None:
                at = self._evaluate(self._pools(prefill_gpu, decode_gpu, x, y), x + y)
                candidate = (x, y, at)
                if best is None or self._better(candidate, best, tp_p, tp_d, price_p, price_d):
                    best = candidate
                hint = y
            x += 1
        hardware = {"prefill": prefill_gpu, "decode": decode_gpu}
        if best is None:
            return LayoutAnswer(layout="disaggregated", hardware=hardware, replicas=None, gpus=None,
                                usd_per_hour=None, knobs={}, at=None)
        x, y, at = best
        return LayoutAnswer(layout="disaggregated", hardware=hardware, replicas={"prefill": x, "decode": y},
                            gpus=x * tp_p + y * tp_d, usd_per_hour=x * price_p + y * price_d,
                            knobs=self._pools(prefill_gpu, decode_gpu, x, y), at=at)

    def _better(self, a: tuple[int, int, Evaluation], b: tuple[int, int, Evaluation], tp_p: int, tp_d: int,
                price_p: float, price_d: float) -> bool:
        def key(c: tuple[int, int, Evaluation]) -> tuple[float, float]:
            gpus = float(c[0] * tp_p + c[1] * tp_d)
            cost = c[2].ci["cost_per_mtok_usd"].mean
            cost = cost if math.isfinite(cost) else c[0] * price_p + c[1] * price_d
            return (gpus, cost) if self.objective == "gpus" else (cost, gpus)

        return key(a) < key(b)


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"engine": {"kv": {"block_size": 16}}} -> {"engine.kv.block_size": 16}: dotted knobs, one value each."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out

