"""The notebook API: load a scenario, run it, plan capacity, sweep a grid — results as DataFrames.

    from simulator import api
    loaded = api.load_scenario("scenarios/quickstart.yaml", overrides=["fleet.replicas=2"])
    api.run(loaded).summary_df()                       # one row per variant
    answer = api.plan(loaded, slo="ttft_p99_ms=1000")  # PlanResult: .replicas, .text(), .trials
    api.sweep("scenarios/grids/quickstart_grid.yaml")  # one row per task

Thin wrappers over ``scenario``, ``fleet``, ``plan`` and ``sweep``: no logic of their own beyond accepting
a path, a mapping or a loaded scenario wherever a scenario is expected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

import simulator.planning.plan as _plan
import simulator.planning.sweep as _sweep
from simulator.planning.plan_result import PlanResult
from simulator.results.run_result import RunResult
from simulator.scenario import LoadedScenario, load_mapping
from simulator.scenario import load_scenario as _load_scenario
from simulator.simulation import run as _run

__all__ = ["PlanResult", "RunResult", "load_scenario", "plan", "run", "sweep"]

ScenarioLike = str | Path | Mapping[str, Any] | LoadedScenario


def load_scenario(scenario: ScenarioLike, overrides: Sequence[str] = (), *, seed: int | None = None) -> LoadedScenario:
    """A validated scenario from a YAML path, a mapping built in code, or a loaded one (overrides applied)."""
    if isinstance(scenario, LoadedScenario):
        if not overrides and seed is None:
            return scenario
        return load_mapping(scenario.raw, tuple(overrides), seed=seed, source=scenario.source)
    if isinstance(scenario, Mapping):
        return load_mapping(dict(scenario), tuple(overrides), seed=seed)
    return _load_scenario(scenario, tuple(overrides), seed=seed)


def run(scenario: ScenarioLike, overrides: Sequence[str] = (), *, seed: int | None = None,
        jobs: int | None = 1, variants: Sequence[str] | None = None) -> RunResult:
    """Simulate every variant, or only those ``variants`` names or matches (``"doc_*"``); the result's
    ``summary_df()``, ``requests_df()`` and ``series_df()`` are DataFrames. ``jobs``: variants at once, each
    in a worker process (None: one per core when the run is large enough to gain; from a script, call it
    under ``if __name__ == "__main__":``, as any code starting processes)."""
    loaded = load_scenario(scenario, overrides, seed=seed)
    if variants is not None:
        if isinstance(variants, str):  # a lone name, not its letters
            variants = [variants]
        loaded = loaded.only(variants)
    return _run(loaded, jobs=jobs)


def plan(scenario: ScenarioLike, *, slo: Any = None, overrides: Sequence[str] = (), **options: Any) -> PlanResult:
    """Capacity plan (``simulator.planning.plan.plan``): ``.replicas``, ``.text()``, ``.candidates_df()``,
    ``.trials``. Its seeds run in worker processes (``workers=1``: in this one): from a script, call it under
    ``if __name__ == "__main__":``."""
    return _plan.plan(load_scenario(scenario, overrides), slo=slo, **options)


def sweep(grid: str | Path | Mapping[str, Any], *, executor: str = "local", workers: int | None = None,
          address: str | None = None, show_progress: bool = False) -> pd.DataFrame:
    """Run a grid file (or the same mapping) -> one row per task and variant (``simulator.planning.sweep.sweep``).
    Tasks run in worker processes (``workers=1``: in this one): from a script, call it under
    ``if __name__ == "__main__":``."""
    return _sweep.sweep(grid, executor=executor, workers=workers, address=address, show_progress=show_progress)
