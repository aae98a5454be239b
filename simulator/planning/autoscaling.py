"""``fleetsim plan --autoscalers``: the static fleet the plan found beside every autoscaled variant of the
scenario, over the same request stream: GPU-hours, dollars per day, SLO attainment, SLO-minutes lost,
cold starts, retries and failed requests. The answer to "static N or autoscaled, and which policy".

Runs the scenario (``simulation.run``) with the static fleet as one more variant; decides nothing itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.scenario import LoadedScenario, load_mapping
from simulator.simulation import run

STATIC = "static-plan"
"""Name of the variant holding the plan's static fleet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRow:
    """One fleet over the scenario's requests."""

    variant: str
    policy: str
    replicas: str
    """The static count, or min-max of an autoscaler."""
    gpu_hours: float
    cost_per_day_usd: float
    slo_attainment: float
    slo_met: bool
    slo_minutes_lost: int
    cold_starts: int
    retried: int
    failed: int


@dataclass(frozen=True, slots=True)
class PolicyComparison:
    rows: list[PolicyRow]

    def text(self) -> str:
        head = (f"{'fleet':18s} {'policy':12s} {'replicas':>9s} {'GPU-h':>9s} {'$/day':>9s} {'attain':>8s} "
                f"{'SLO':>4s} {'SLO-min lost':>13s} {'cold':>5s} {'retried':>8s} {'failed':>7s}")
        lines = ["static fleet against each autoscaler, same requests:", head]
        for r in self.rows:
            lines.append(f"{r.variant:18s} {r.policy:12s} {r.replicas:>9s} {r.gpu_hours:9.1f} "
                         f"{_num(r.cost_per_day_usd):>9s} {r.slo_attainment:8.4f} {'met' if r.slo_met else 'no':>4s} "
                         f"{r.slo_minutes_lost:13d} {r.cold_starts:5d} {r.retried:8d} {r.failed:7d}")
        return "\n".join(lines)

    def save(self, folder: Path) -> Path:
        import pandas as pd

        path = folder / "autoscalers.csv"
        pd.DataFrame([_as_dict(r) for r in self.rows]).to_csv(path, index=False)
        return path


def _as_dict(row: PolicyRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in PolicyRow.__slots__}


def _num(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:,.0f}"


def compare_policies(loaded: LoadedScenario, *, static_replicas: int,
                     log: Callable[[str], None] | None = None, jobs: int | None = 1) -> PolicyComparison:
    """Simulate ``static_replicas`` fixed replicas (the plan's answer; failures and the lifecycle as the
    scenario has them) and every variant of ``loaded`` with an ``autoscaling`` section; ``jobs``: as
    ``simulation.run`` (variants side by side in worker processes; None: when worth it)."""
    raw = {k: v for k, v in loaded.raw.items() if k != "variants"}
    autoscaled = {name: override for name, override in loaded.scenario.variants.items()
                  if "autoscaling" in override or any(key.startswith("autoscaling.") for key in override)}
    variants: dict[str, Any] = {STATIC: {"fleet.replicas": static_replicas, "autoscaling": None}, **autoscaled}
    if raw.get("lifecycle") is None and raw.get("failures") is None:
        variants[STATIC]["lifecycle"] = {}  # a dynamic fleet, so the day's figures come with it
    if log is not None:
        log(f"comparing {static_replicas} static replicas with {len(autoscaled)} autoscaled variant(s)")
    result = run(load_mapping({**raw, "variants": variants}, source=loaded.source), jobs=jobs)
    rows = []
    for name, variant in result.variants.items():
        day = variant.day
        assert day is not None  # every variant here is a dynamic fleet
        figures = day.figures
        scenario = result.scenario[name]
        auto = scenario.get("autoscaling")
        replicas = (f"{auto['min_replicas']}-{auto['max_replicas']}" if auto else f"{static_replicas}")
        rows.append(PolicyRow(
            variant=name, policy=figures.policy, replicas=replicas, gpu_hours=figures.gpu_hours,
            cost_per_day_usd=figures.cost_per_day_usd, slo_attainment=variant.summary.slo_attainment,
            slo_met=variant.summary.slo_met, slo_minutes_lost=figures.slo_minutes_lost,
            cold_starts=figures.num_cold_starts, retried=figures.requests_retried, failed=figures.requests_failed))
    return PolicyComparison(rows)
