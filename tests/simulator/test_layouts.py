"""Layout planning (``fleetsim plan --layouts``): aggregated against disaggregated, the xPyD search against
a brute-force scan, GPU types per pool priced per pool, and the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.cli import main as cli
from simulator.errors import ConfigError
from simulator.planning.criteria import parse_hardware
from simulator.planning.layouts import plan_layouts
from simulator.scenario import deep_merge, load_mapping
from simulator.simulation import run

LONG: dict[str, Any] = {
    "schema_version": 1,
    "name": "long",
    "seed": 0,
    "workload": {
        "num_requests": 150,
        "arrival": {"process": "poisson", "rate_rps": 9},
        "prompt_tokens": {"dist": "lognormal", "median": 2600, "sigma": 0.3, "max": 6000},
        "output_tokens": {"dist": "lognormal", "median": 150, "sigma": 0.5, "max": 600},
    },
    "fleet": {"replicas": 1, "hardware": "H100", "profile": "h100-llama-3-8b-tp1-fitted-published"},
    "engine": {"preset": "vllm"},
    "router": {"policy": "least_requests"},
    "slo": {"ttft_ms": 1500, "tpot_ms": 12, "target_attainment": 0.9},
}
QUICK: dict[str, Any] = {"seeds": 1, "workers": 1}


@pytest.fixture(scope="module")
def planned() -> Any:
    return plan_layouts(LONG, max_gpus=4, **QUICK)


def test_long_prompts_and_a_tight_tpot_slo_want_fewer_gpus_disaggregated(planned: Any) -> None:
    aggregated, disaggregated = planned.answers
    assert aggregated.layout == "aggregated" and disaggregated.layout == "disaggregated"
    assert aggregated.gpus is not None and disaggregated.gpus is not None
    assert disaggregated.gpus < aggregated.gpus
    assert planned.best is disaggregated
    assert disaggregated.goodput_per_gpu_rps > aggregated.goodput_per_gpu_rps
    assert disaggregated.usd_per_hour == pytest.approx(disaggregated.gpus * 2.99)
    doc = planned.to_dict()
    assert doc["best"] == disaggregated.name and {row["layout"] for row in doc["layouts"]} == {
        "aggregated", "disaggregated"}


def attains(pools: dict[str, Any] | None, replicas: int = 1) -> bool:
    raw = deep_merge(LONG, {"fleet": {"replicas": replicas}})
    if pools is not None:
        raw["fleet"]["pools"] = pools
    summary = run(load_mapping(raw)).variants["base"].summary
    return summary.slo_attainment >= LONG["slo"]["target_attainment"]


def test_the_searches_equal_a_brute_force_scan(planned: Any) -> None:
    """Every aggregated fleet and every (x, y) with x + y <= 4, judged as the plan judges a point (one
    seed: its attainment against the target): each layout's answer is the fewest GPUs that pass."""
    passing = {(x, y) for x in range(1, 4) for y in range(1, 5 - x)
               if attains({"prefill": {"role": "prefill", "replicas": x}, "decode": {"role": "decode", "replicas": y}})}
    aggregated, disaggregated = planned.answers
    assert disaggregated.gpus == min(x + y for x, y in passing)
    assert (disaggregated.replicas["prefill"], disaggregated.replicas["decode"]) in passing
    assert aggregated.gpus == min(n for n in range(1, 5) if attains(None, n))


def test_a_gpu_type_per_pool_is_searched_and_priced() -> None:
    result = plan_layouts(LONG, layouts=["disaggregated"], hardware={"prefill": ["H100"], "decode": ["A100", "H100"]},
                          max_gpus=4, objective="cost", **QUICK)
    assert [a.hardware for a in result.answers] == [{"prefill": "H100", "decode": "A100"},
                                                    {"prefill": "H100", "decode": "H100"}]
    for answer in result.answers:
        if answer.replicas is not None:
            prices = {"H100": 2.99, "A100": 1.79}
            expected = answer.replicas["prefill"] * 2.99 + answer.replicas["decode"] * prices[answer.hardware["decode"]]
            assert answer.usd_per_hour == pytest.approx(expected)
    assert result.best is not None
    found = [a for a in result.answers if a.gpus is not None]
    assert result.best.metric("cost_per_mtok_usd") == min(a.metric("cost_per_mtok_usd") for a in found)


def test_bad_layout_input_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="layouts are aggregated, disaggregated"):
        plan_layouts(LONG, layouts=["sideways"], **QUICK)  # type: ignore[list-item]
    with pytest.raises(ConfigError) as info:
        plan_layouts(LONG, hardware={"decode": ["H999"]}, **QUICK)
    assert info.value.field == "hardware.decode"
    with pytest.raises(ConfigError, match="ROLE=GPU1,GPU2"):
        parse_hardware(["router=H100"])
    assert parse_hardware(["prefill=H100, H200", "decode=A100"]) == {"prefill": ["H100", "H200"], "decode": ["A100"]}


def test_cli_plan_layouts_prints_every_layout_and_writes_layouts_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(cli.PLUGINS, "plan", "simulator.cli.plan")
    scenario = tmp_path / "long.yaml"
    scenario.write_text(yaml.safe_dump(LONG))
    out = tmp_path / "out"
    code = cli.main(["plan", str(scenario), "--layouts", "aggregated,disaggregated", "--seeds", "1", "--workers", "1",
                     "--max-gpus", "4", "--out", str(out), "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    doc = json.loads((out / "layouts.json").read_text())
    assert f"answer: {doc['best']}" in printed and "goodput per GPU" in printed
    assert (out / "trials.csv").is_file()
