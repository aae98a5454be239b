"""What a capacity plan found: each searched point on every seed (``Evaluation``), the replica answer
per knob setting, the one-replica knee, the sensitivity to cost-model error, and the plan's text, table
and JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.results.intervals import MetricCI
from simulator.results.summary import SLO, Summary, round_sig


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
        return save_answer(out_dir, "plan.json", self.to_dict(), self.trials)

    def text(self) -> str:
        """The answer as a few readable lines."""
        a = self.answer
        knobs = ", ".join(f"{k}={v}" for k, v in a.knobs.items())
        lines = [f"plan for {self.scenario_name}: {slo_text(self.slo)} at {self.stream_rate_rps:.3g} req/s "
                 f"({self.load_factor:g}x the scenario's load), seeds {self.seeds}"]
        if a.replicas is None or a.at is None:
            lines.append(f"  answer: the SLO is not met even with {self.max_replicas} replicas")
        else:
            ci = a.at.ci
            lines.append(f"  answer: {a.replicas} replica(s)" + (f" with {knobs}" if knobs else ""))
            lines.append(f"    SLO attainment {ci_text(ci['slo_attainment'], '.3f')} "
                         f"(target {self.slo.target_attainment:g}); TTFT p99 {ci_text(ci['ttft_p99_ms'], '.0f')} ms; "
                         f"TPOT p99 {ci_text(ci['tpot_p99_ms'], '.1f')} ms")
            lines.append(f"    cost {ci_text(ci['cost_per_mtok_usd'], '.3f')} $ per million output tokens")
            if ci["slo_attainment"].kind == "range":
                lines.append(f"    ({len(self.seeds)} seeds are too few for a confidence interval: each figure gives "
                             "the seeds' lowest and highest value; three or more seeds give a 95 % interval)")
            elif ci["slo_attainment"].kind == "bootstrap":
                lines.append(f"    [brackets: 95 % bootstrap interval over {len(self.seeds)} seeds]")
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


def ci_text(ci: MetricCI, fmt: str) -> str:
    """``mean [low, high]`` for a bootstrap interval; ``mean (seeds low to high)``, the seeds' own values, when
    there were too few for one; the mean alone with one seed. Either lies within the seeds' values, so a latency
    never reads negative and a share never above 1 (``results.intervals``)."""
    if not math.isfinite(ci.mean):
        return "-"
    if ci.kind == "range":
        return f"{ci.mean:{fmt}} (seeds {ci.low:{fmt}} to {ci.high:{fmt}})"
    if ci.kind == "bootstrap" and math.isfinite(ci.low) and math.isfinite(ci.high):
        return f"{ci.mean:{fmt}} [{ci.low:{fmt}}, {ci.high:{fmt}}]"
    return format(ci.mean, fmt)


def slo_text(slo: SLO) -> str:
    parts = [f"{k}<={v:g}" for k, v in slo.model_dump(exclude_none=True).items() if k != "target_attainment"]
    return f"SLO {', '.join(parts) or '(none)'} for {slo.target_attainment:.0%} of requests"


def save_answer(out_dir: str | Path, name: str, doc: dict[str, Any], trials: pd.DataFrame) -> Path:
    """A planning answer's files: ``doc`` as the JSON file ``name`` and every simulation as trials.csv, in
    ``out_dir``; returns the JSON file's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n")
    trials.to_csv(out / "trials.csv", index=False)
    return path
