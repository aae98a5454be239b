"""dashboard/data.py without Streamlit running: scenarios from controls, runs, tables, traces, profiles."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

pytest.importorskip("streamlit")

from dashboard.data import choices, comparison, profiles, results, runs, scenario_base, trace_files, what_if
from simulator.cli import main as cli
from simulator.cost.profile import ProfileKind, list_profiles, load_profile
from simulator.errors import ConfigError
from simulator.scenario import load_scenario, pick_profile

SMALL = 120
"""Requests of the runs here: enough for every plot and metric, a fraction of a second each."""


def default_profile() -> str:
    names = list_profiles()
    return names[profiles.default_profile_index(names)]


def small(controls: what_if.Controls, **changes: object) -> what_if.Controls:
    return dataclasses.replace(controls, num_requests=SMALL, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def quickstart() -> scenario_base.Base:
    return scenario_base.base_for("quickstart")


@pytest.mark.parametrize("name", scenario_base.list_scenarios())
def test_every_shipped_scenario_round_trips_through_the_controls(name: str) -> None:
    base = scenario_base.base_for(name)
    controls = what_if.controls_from_raw(base.raw)
    assert controls.num_requests <= what_if.DEFAULT_MAX_REQUESTS
    # One default per scenario everywhere: the dashboard opens it on the requests fleetsim run simulates (a
    # scenario sized by its duration, a day of traffic, opens on its first requests, up to the cap).
    expected = base.raw["workload"].get("num_requests", what_if.DEFAULT_MAX_REQUESTS)
    assert controls.num_requests == expected
    raw = what_if.apply_controls(base.raw, controls)
    assert "variants" not in raw
    loaded = runs.validate(raw, base.source)
    original = load_scenario(base.source or "").scenario
    assert loaded.scenario.fleet.model_dump(exclude={"profile"}) == original.fleet.model_dump(exclude={"profile"})
    assert pick_profile(loaded.scenario.fleet).name == pick_profile(original.fleet).name
    assert loaded.scenario.engine == original.engine and loaded.scenario.router == original.router
    # Controls read back from the result are the same controls.
    assert what_if.controls_from_raw(raw) == controls


@pytest.mark.parametrize("name", scenario_base.list_scenarios())
def test_every_shipped_scenario_opens_on_the_compare_page(name: str) -> None:
    base = scenario_base.base_for(name)
    variants = comparison.default_variants(base.raw)
    assert 2 <= len(variants) <= comparison.MAX_VARIANTS
    raw = comparison.compare_raw(base.raw, variants, SMALL)
    loaded = runs.validate(raw, base.source)
    assert list(loaded.variants()) == [v.name for v in variants]


def test_scratch_is_a_valid_scenario() -> None:
    base = scenario_base.scratch_base()
    runs.validate(what_if.apply_controls(base.raw, what_if.controls_from_raw(base.raw)))


def test_controls_map_to_the_fields_they_name(quickstart: scenario_base.Base) -> None:
    controls = small(what_if.controls_from_raw(quickstart.raw), replicas=2, preset="tgi", batching="continuous",
                     kv_policy="reserve", block_size=32, prefix_caching="off", max_num_batched_tokens=4096,
                     router="power_of_two", rate_rps=12.5, ttft_ms=None, tpot_ms=80.0)
    raw = what_if.apply_controls(quickstart.raw, controls)
    sc = runs.validate(raw).scenario
    assert sc.fleet.replicas == 2 and sc.fleet.profile is None  # the quickstart's named profile is "auto"
    assert sc.engine.preset == "tgi" and sc.engine.batching == "continuous" and sc.engine.prefix_caching is False
    assert sc.engine.kv.policy == "reserve" and sc.engine.kv.block_size == 32
    assert sc.engine.max_num_batched_tokens == 4096
    assert sc.router.policy == "power_of_two"
    assert sc.workload.arrival is not None and sc.workload.arrival.rate_rps == 12.5  # type: ignore[union-attr]
    assert sc.workload.num_requests == SMALL
    assert sc.slo is not None and sc.slo.ttft_ms is None and sc.slo.tpot_ms == 80.0
    # "default" leaves the knob to the preset: the key disappears from the YAML.
    raw = what_if.apply_controls(raw, dataclasses.replace(controls, batching=choices.DEFAULT, block_size=None))
    assert "batching" not in raw["engine"] and "block_size" not in raw["engine"]["kv"]


def test_trace_controls_build_a_trace_replay(quickstart: scenario_base.Base) -> None:
    traces = trace_files.list_traces()
    if not any(t.startswith("azure") for t in traces) or not any(t.startswith("vidur") for t in traces):
        pytest.skip("shipped traces not present")
    azure = next(t for t in traces if t.startswith("azure"))
    vidur = next(t for t in traces if t.startswith("vidur"))
    controls = small(what_if.controls_from_raw(quickstart.raw), load_source="trace", trace_file=azure, time_scale=0.5)
    raw = what_if.apply_controls(quickstart.raw, controls)
    trace = runs.validate(raw).scenario.workload.trace
    assert trace is not None and trace.time_scale == 0.5 and trace.path == f"${{traces}}/{azure}"
    assert "prompt_tokens" not in raw["workload"] and "arrival" not in raw["workload"]
    raw = what_if.apply_controls(quickstart.raw, dataclasses.replace(controls, trace_file=vidur, rate_rps=5.0))
    workload = runs.validate(raw).scenario.workload
    assert workload.arrival is not None and workload.arrival.rate_rps == 5.0  # type: ignore[union-attr]


def test_bad_settings_raise_the_message_the_cli_prints(
    quickstart: scenario_base.Base, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = what_if.apply_controls(quickstart.raw, small(what_if.controls_from_raw(quickstart.raw), block_size=24))
    with pytest.raises(ConfigError) as caught:
        runs.validate(raw)
    assert "block_size must be a power of two" in str(caught.value)
    # The CLI, given the same setting, prints exactly this text after its prefix.
    path = tmp_path / "bad.yaml"
    path.write_text(scenario_base.to_yaml(raw))
    assert cli.main(["run", str(path), "--quiet", "--out", str(tmp_path / "out")]) == cli.EXIT_USAGE
    assert f"fleetsim: error: {path}: {caught.value}" in capsys.readouterr().err


def test_a_model_that_does_not_fit_is_an_error(quickstart: scenario_base.Base) -> None:
    controls = small(what_if.controls_from_raw(quickstart.raw), model="llama-3-405b", tp=1)
    with pytest.raises(ConfigError, match="does not fit"):
        runs.validate(what_if.apply_controls(quickstart.raw, controls))


def test_simulate_reports_progress_and_changed_controls_change_results(quickstart: scenario_base.Base) -> None:
    controls = small(what_if.controls_from_raw(quickstart.raw))
    seen: list[float] = []
    result = runs.simulate(what_if.apply_controls(quickstart.raw, controls), progress=lambda f, _: seen.append(f))
    assert seen and seen == sorted(seen) and 0 < seen[-1] <= 1
    one = runs.simulate(what_if.apply_controls(quickstart.raw, dataclasses.replace(controls, replicas=1)))
    base_summary = result.variants["base"].summary
    assert base_summary.requests_completed == SMALL
    assert one.variants["base"].summary.ttft_p99_ms > base_summary.ttft_p99_ms
    verdict = results.slo_verdict(base_summary, what_if.apply_controls(quickstart.raw, controls))
    assert verdict.met is True and verdict.text.startswith("SLO met")
    table = results.summary_table(result)
    assert list(table.columns) == ["base"] and "TTFT p99 (ms)" in table.index


def test_cached_simulate_is_keyed_on_the_scenario(quickstart: scenario_base.Base) -> None:
    raw = what_if.apply_controls(quickstart.raw, small(what_if.controls_from_raw(quickstart.raw)))
    first = runs.cached_simulate(scenario_base.raw_key(raw), None)
    again = runs.cached_simulate(scenario_base.raw_key(raw), None)
    assert first.summary_df().equals(again.summary_df())
    assert scenario_base.raw_key(raw) == scenario_base.raw_key(yaml.safe_load(scenario_base.to_yaml(raw)))


def test_compare_runs_variants_on_one_request_stream(quickstart: scenario_base.Base) -> None:
    variants = [comparison.VariantControls(name="vllm"), comparison.VariantControls(name="tgi", preset="tgi"),
                comparison.VariantControls(name="rr", router="round_robin", replicas=2)]
    raw = comparison.compare_raw(quickstart.raw, variants, SMALL)
    assert raw["variants"] == {"vllm": {}, "tgi": {"engine.preset": "tgi"},
                               "rr": {"fleet.replicas": 2, "router.policy": "round_robin"}}
    result = runs.simulate(raw)
    requests = result.requests_df()
    arrivals = {name: frame["arrival_s"].to_numpy() for name, frame in requests.groupby("variant")}
    np.testing.assert_array_equal(arrivals["vllm"], arrivals["tgi"])
    table = results.delta_table(result)
    assert list(table.columns) == ["vllm", "tgi", "rr", "Δ tgi %", "Δ rr %"]
    row = table.loc["TTFT p99 (ms)"]
    assert row["Δ tgi %"] == pytest.approx(100 * (row["tgi"] - row["vllm"]) / row["vllm"])
    value, delta = results.metric_delta("ttft_p99_ms", result.variants["vllm"].summary, result.variants["tgi"].summary)
    assert value and delta is not None and delta.endswith("%")


@pytest.mark.parametrize(
    ("names", "message"),
    [(["a", "a"], "used twice"), (["a", " "], "has no name"), (["a"], "compare 2 to 4")],
)
def test_compare_rejects_bad_variant_sets(quickstart: scenario_base.Base, names: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        comparison.compare_raw(quickstart.raw, [comparison.VariantControls(name=n) for n in names], SMALL)


def test_a_scenarios_own_variants_keep_overrides_no_control_covers() -> None:
    variant = comparison.variant_from_override("x", {"engine": {"kv": {"policy": "paged", "memory_fraction": 0.5}},
                                                "engine.prefix_caching": False})
    assert variant.kv_policy == "paged" and variant.prefix_caching == "off"
    assert variant.other == (("engine.kv.memory_fraction", 0.5),)
    assert comparison.variant_override(variant) == {"engine.kv.memory_fraction": 0.5, "engine.kv.policy": "paged",
                                              "engine.prefix_caching": False}


def test_relative_change() -> None:
    assert results.relative_change(10.0, 15.0) == 50.0
    assert results.relative_change(0.0, 0.0) == 0.0
    assert math.isnan(results.relative_change(0.0, 1.0))


def test_exported_yaml_loads_in_the_cli_and_uploads_back(quickstart: scenario_base.Base, tmp_path: Path) -> None:
    raw = what_if.apply_controls(quickstart.raw, small(what_if.controls_from_raw(quickstart.raw), replicas=3))
    text = scenario_base.to_yaml(raw)
    path = tmp_path / "exported.yaml"
    path.write_text(text)
    assert load_scenario(path).raw == raw
    uploaded = scenario_base.uploaded_base("exported.yaml", text.encode())
    assert uploaded.raw == raw and uploaded.key.startswith("upload:exported.yaml:")


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"schema_version: 1\nname: x\nworkload: {num_requests: 5\n", "not valid YAML"),
     (b"schema_version: 1\nname: x\nwrokload: {}\n", "did you mean 'workload'")],
)
def test_a_bad_upload_names_the_uploaded_file(content: bytes, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        scenario_base.uploaded_base("mine.yaml", content)
    assert str(caught.value).startswith("mine.yaml: ")


# ----- traces ---------------------------------------------------------------------------------------


def test_trace_helpers_on_a_small_file(tmp_path: Path) -> None:
    path = tmp_path / "azure_tiny.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:00:00.0,100,10\n2023-11-16 18:00:00.5,200,20\n2023-11-16 18:00:03.0,300,30\n")
    assert trace_files.list_traces(tmp_path) == ["azure_tiny.csv"]
    frame = trace_files.load_trace_frame(path.name, folder=tmp_path)
    assert frame["arrival_s"].tolist() == [0.0, 0.5, 3.0]
    rate = trace_files.arrival_rate(frame, bin_s=1.0)
    assert rate["rate_rps"].sum() == 3 and rate["rate_rps"].tolist() == [2.0, 0.0, 0.0, 1.0]
    assert trace_files.arrival_rate(frame, 1.0, time_scale=0.5)["rate_rps"].tolist() == [2.0, 1.0]
    stats = trace_files.trace_stats(frame)
    assert stats.loc["requests", "value"] == "3" and stats.loc["span (s)", "value"] == "3.0"
    with pytest.raises(ConfigError, match="line 1"):
        trace_files.load_trace_frame(path.name, "mooncake", folder=tmp_path)
    with pytest.raises(ConfigError, match="bin width"):
        trace_files.arrival_rate(frame, 0.0)


def test_shipped_traces_load() -> None:
    traces = trace_files.list_traces()
    if not traces:
        pytest.skip("shipped traces not present")
    for name in traces:
        frame = trace_files.load_trace_frame(name)
        assert len(frame) > 0 and {"arrival_s", "prompt_tokens", "output_tokens"} <= set(frame.columns)


# ----- calibration ----------------------------------------------------------------------------------


def test_calibration_opens_on_the_quickstart_fleets_measured_profile() -> None:
    assert default_profile() == "h200-llama-3-8b-tp1-measured"


def test_cost_model_curves_rise_with_batch_context_and_chunk() -> None:
    profile = load_profile("h200-llama-3-8b-tp1-analytic")
    decode = profiles.decode_curves(profile, [512, 8192], max_batch=256)
    for _, rows in decode.groupby("context"):
        assert rows["device_ms"].is_monotonic_increasing
        assert (rows["step_ms"] >= rows["device_ms"]).all()
    at_256 = decode[decode["batch"] == 256].set_index("context")["device_ms"]
    assert at_256[8192] > at_256[512]
    prefill = profiles.prefill_curves(profile, [0, 4096], max_chunk=4096)
    assert prefill.groupby("prefix")["device_ms"].apply(lambda s: s.is_monotonic_increasing).all()
    facts = profiles.profile_facts(profile)
    assert facts.loc["kind", "value"] == "analytic"
    assert "not fitted" in str(facts.loc["fit error", "value"])


def test_measured_points_beside_a_profile(tmp_path: Path) -> None:
    """A measured profile with its timings CSV: the points are found, and predicted = measured when the
    timings are the profile's own predictions."""
    analytic = load_profile(default_profile())
    measured = analytic.model_copy(update={"name": "tiny-measured", "kind": ProfileKind.MEASURED, "derived_from": None})
    path = measured.save(tmp_path / "tiny-measured.yaml")
    assert profiles.timings_path(path) is None
    shapes = [profiles.decode_shape(b, c) for b in (1, 8, 64) for c in (512, 2048)]
    shapes += [profiles.prefill_shape(n, p) for n in (128, 1024) for p in (0, 2048)]
    from simulator.cost.cost_model import CostModel

    model = CostModel(measured)
    frame = pd.DataFrame([s._asdict() for s in shapes]).drop(columns="num_swap_tokens")
    frame["device_s"] = [model.device_time(s) for s in shapes]
    frame.to_csv(tmp_path / "tiny-measured.csv", index=False)
    assert profiles.timings_path(path) == tmp_path / "tiny-measured.csv"
    points = profiles.measured_points(measured, tmp_path / "tiny-measured.csv")
    assert points["error_pct"].abs().max() < 1e-9
    assert sorted(points.loc[points["regime"] == "decode", "context"].unique()) == [512, 2048]
    assert sorted(points["prefix"].dropna().unique()) == [0, 2048]
    frame.drop(columns="device_s").to_csv(tmp_path / "tiny-measured.csv", index=False)
    with pytest.raises(ConfigError, match="lacks columns: device_s"):
        profiles.measured_points(measured, tmp_path / "tiny-measured.csv")


def test_parse_int_list() -> None:
    assert profiles.parse_int_list("2048, 512,512", field="x") == [512, 2048]
    assert profiles.parse_int_list("0, 4096", field="x", minimum=0) == [0, 4096]
    with pytest.raises(ConfigError, match=r"^contexts: expected whole numbers"):
        profiles.parse_int_list("512, many", field="contexts")
