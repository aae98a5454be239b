"""The notebook API: a scenario given as a path, a mapping or a loaded one; results as DataFrames."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simulator import api
from simulator.errors import ConfigError

SCENARIO: dict[str, Any] = {
    "schema_version": 1,
    "name": "api",
    "workload": {
        "num_requests": 60,
        "arrival": {"process": "poisson", "rate_rps": 20},
        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max": 2000},
        "output_tokens": {"dist": "uniform", "low": 5, "high": 60},
    },
    "fleet": {"replicas": 1, "profile": "h200-llama-3-8b-tp1-analytic"},
    "slo": {"ttft_ms": 200},
}


def test_load_and_run_from_a_mapping_a_path_or_a_loaded_scenario(tmp_path: Path) -> None:
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    from_path = api.run(path, ["fleet.replicas=2"]).summary_df()
    from_mapping = api.run(SCENARIO, ["fleet.replicas=2"]).summary_df()
    loaded = api.load_scenario(SCENARIO, seed=0)
    from_loaded = api.run(api.load_scenario(loaded, ["fleet.replicas=2"])).summary_df()
    assert isinstance(from_path, pd.DataFrame) and list(from_path.index) == ["base"]
    pd.testing.assert_frame_equal(from_path, from_mapping)
    pd.testing.assert_frame_equal(from_path, from_loaded)
    assert api.load_scenario(loaded) is loaded


def test_run_picks_variants_by_name() -> None:
    raw = {**SCENARIO, "variants": {"one": {}, "two": {"fleet.replicas": 2}, "four": {"fleet.replicas": 4}}}
    assert list(api.run(raw, variants="two").variants) == ["two"]  # one name, not its letters
    some = api.run(raw, variants=["four", "one"])
    assert list(some.variants) == ["one", "four"]
    pd.testing.assert_frame_equal(some.summary_df(), api.run(raw).summary_df().loc[["one", "four"]])
    with pytest.raises(ConfigError, match=r"no variant 'too'.*did you mean 'two'"):
        api.run(raw, variants=["too"])


def test_plan_and_sweep_in_a_few_lines(tmp_path: Path) -> None:
    result = api.plan(SCENARIO, slo="ttft_ms=200,target=0.9", seeds=1, knee=False, sensitivity=(), workers=1,
                      max_replicas=4)
    assert result.replicas is not None and isinstance(result.trials, pd.DataFrame)
    assert list(result.candidates_df()["replicas"]) == [result.replicas]
    scenario = tmp_path / "api.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    frame = api.sweep({"scenario": str(scenario), "seeds": [0], "grid": {"fleet.replicas": [1, 2]}}, workers=1)
    assert list(frame["fleet.replicas"]) == [1, 2] and frame["error"].isna().all()
