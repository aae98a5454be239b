"""Every dashboard page under streamlit.testing.v1.AppTest: it renders its plots by default, a changed
control changes the result, and a bad setting shows the CLI's message in the page, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("streamlit")

from streamlit.testing.v1 import AppTest

from dashboard.data import choices, profiles, scenario_base, trace_files, what_if

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
SMALL = 100
"""Requests of the runs that are not the default run: enough for every plot."""
TIMEOUT_S = 120


def app(page: str | None = None) -> AppTest:
    """The whole app (router included), switched to ``page`` (a file under app_pages/)."""
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
    at.run()
    if page is not None:
        at.switch_page(f"app_pages/{page}")
        at.run()
    assert not at.exception
    return at


def charts(at: AppTest) -> list[dict[str, Any]]:
    """The plotly figures on the page, as their JSON specs."""
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def run_button(at: AppTest, key: str) -> AppTest:
    at.button(key=key).click()
    at.run()
    assert not at.exception
    return at


# ----- What-if ---------------------------------------------------------------------------------------


def test_whatif_default_run_renders_plots_verdict_and_cost() -> None:
    at = app()
    assert at.selectbox(key="wi_source").value == "quickstart"
    assert at.number_input(key="wi_num_requests").value == what_if.DEFAULT_MAX_REQUESTS
    run_button(at, "wi_run")
    assert not errors(at)
    figures = charts(at)
    titles = [f["layout"]["title"]["text"] for f in figures]
    for expected in ("TTFT CDF", "TPOT CDF", "E2E CDF", "Throughput", "Waiting requests", "KV cache use"):
        assert any(t.startswith(expected) for t in titles), (expected, titles)
    assert any(s.value.startswith("SLO met") for s in at.success)
    assert any("analytic, not measured" in w.value for w in at.warning)
    assert metrics(at)["$ / M output tokens"].startswith("$")


def test_whatif_changed_control_changes_the_result() -> None:
    at = app()
    at.number_input(key="wi_num_requests").set_value(SMALL)
    run_button(at, "wi_run")
    four = metrics(at)
    at.number_input(key="wi_replicas").set_value(1)
    at.run()
    assert any("settings changed" in i.value for i in at.info)  # stale result flagged until re-run
    run_button(at, "wi_run")
    one = metrics(at)
    assert float(one["TTFT p99 (ms)"].replace(",", "")) > float(four["TTFT p99 (ms)"].replace(",", ""))
    assert len(charts(at)) >= 7


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("wi_block_size", 24, "quickstart.yaml: engine.kv.block_size: "),
        ("wi_model", "llama-3-405b", "quickstart.yaml: fleet.tp: llama-3-405b does not fit on H200 at tp 1"),
    ],
)
def test_whatif_bad_setting_shows_the_cli_error(key: str, value: int | str, message: str) -> None:
    at = app()
    if isinstance(value, int):
        at.number_input(key=key).set_value(value)
    else:
        at.selectbox(key=key).set_value(value)
    at.run()
    assert not at.exception
    assert any(message in e for e in errors(at)), errors(at)
    if key == "wi_block_size":
        assert any("power of two" in e for e in errors(at))
    assert at.button(key="wi_run").disabled


def test_whatif_replays_a_trace() -> None:
    if not any(t.startswith("azure") for t in trace_files.list_traces()):
        pytest.skip("shipped traces not present")
    at = app()
    at.radio(key="wi_load_source").set_value("trace")
    at.run()
    at.selectbox(key="wi_trace_file").set_value(next(t for t in trace_files.list_traces() if t.startswith("azure")))
    at.number_input(key="wi_num_requests").set_value(SMALL)
    run_button(at, "wi_run")
    assert not errors(at)
    assert len(charts(at)) >= 7


def test_whatif_from_scratch_resets_the_controls_and_values_survive_a_page_switch() -> None:
    at = app()
    at.selectbox(key="wi_source").set_value(scenario_base.FROM_SCRATCH)
    at.run()
    assert at.number_input(key="wi_replicas").value == scenario_base.SCRATCH["fleet"]["replicas"]
    at.number_input(key="wi_replicas").set_value(5)
    at.run()
    at.switch_page("app_pages/traces.py")
    at.run()
    at.switch_page("app_pages/whatif.py")
    at.run()
    assert at.selectbox(key="wi_source").value == scenario_base.FROM_SCRATCH
    assert at.number_input(key="wi_replicas").value == 5


# ----- Compare ---------------------------------------------------------------------------------------


def test_compare_runs_variants_with_deltas_and_a_changed_control_changes_them() -> None:
    at = app("compare.py")
    at.number_input(key="cmp_num_requests").set_value(SMALL)
    run_button(at, "cmp_run")
    assert not errors(at)
    shown = [m for m in at.metric if m.label == "TTFT p99 (ms)"]
    assert len(shown) == 2 and shown[1].delta is not None and shown[1].delta.endswith("%")
    figures = charts(at)
    ttft = next(f for f in figures if f["layout"]["title"]["text"].startswith("TTFT CDF"))
    assert [t["name"] for t in ttft["data"]] == ["base", "tgi"]
    before = at.dataframe[0].value
    assert "Δ tgi %" in before.columns
    at.selectbox(key="cmp_v1_preset").set_value("trtllm")
    at.run()
    run_button(at, "cmp_run")
    after = at.dataframe[0].value
    assert "Δ tgi %" in after.columns  # the name stayed, the preset changed
    assert after["tgi"].to_dict() != before["tgi"].to_dict()


def test_compare_bad_setting_shows_the_error() -> None:
    at = app("compare.py")
    at.text_input(key="cmp_v1_name").set_value("base")
    at.run()
    assert any("variants: variant names must differ; 'base' is used twice" in e for e in errors(at))
    assert at.button(key="cmp_run").disabled
    at.text_input(key="cmp_v1_name").set_value("other")
    at.number_input(key="cmp_v1_replicas").set_value(2)
    at.selectbox(key="cmp_v1_hardware").set_value("L40S")
    at.selectbox(key="cmp_v1_preset").set_value(choices.DEFAULT)
    at.run()
    assert not at.exception
    assert not errors(at)  # the quickstart's profile is the automatic one, so another GPU gets its own
    assert not at.button(key="cmp_run").disabled


# ----- Calibration -----------------------------------------------------------------------------------


def test_calibration_shows_curves_and_flags_analytic_profiles() -> None:
    at = app("calibration.py")
    at.selectbox(key="cal_profile").set_value("h200-llama-3-8b-tp1-analytic")
    at.run()
    figures = charts(at)
    assert [f["layout"]["title"]["text"] for f in figures] == ["Decode step time vs batch",
                                                               "Prefill step time vs chunk"]
    assert any("Analytic profile, not measured" in w.value for w in at.warning)
    facts = at.dataframe[0].value
    assert facts.loc["kind", "value"] == "analytic"


def test_calibration_shows_measured_points_when_timings_ship() -> None:
    names = [n for n in profiles.list_profiles_with_timings() if not n.endswith("-analytic")]
    if not names:
        pytest.skip("no measured profile with raw timings is shipped")
    at = app("calibration.py")
    at.selectbox(key="cal_profile").set_value(names[0])
    at.run()
    assert not at.exception and not errors(at)
    figures = charts(at)
    assert len(figures) == 3 and figures[2]["layout"]["title"]["text"] == "Measured vs predicted device time"
    assert any(t["mode"] == "markers" for t in figures[0]["data"])
    assert not any("Analytic profile" in w.value for w in at.warning)


def test_calibration_changed_control_changes_the_curves() -> None:
    at = app("calibration.py")
    at.selectbox(key="cal_profile").set_value("h200-llama-3-8b-tp1-analytic")
    at.run()
    before = charts(at)[0]
    at.text_input(key="cal_contexts").set_value("1024, 4096, 16384, 32768")
    at.run()
    after = charts(at)[0]
    assert len(after["data"]) > len(before["data"])
    names = [t["name"] for t in after["data"]]
    assert "context 32,768 (device)" in names


def test_calibration_typed_contexts_win_over_the_measured_ones() -> None:
    """A measured profile's curves start where its points are; contexts typed in the sidebar replace them."""
    at = app("calibration.py")
    assert at.selectbox(key="cal_profile").value == "h200-llama-3-8b-tp1-measured"
    names = [t["name"] for t in charts(at)[0]["data"]]
    assert "context 16,384 (device)" in names and "context 32,768 (device)" not in names
    at.text_input(key="cal_contexts").set_value("1024, 32768")
    at.run()
    names = [t["name"] for t in charts(at)[0]["data"]]
    assert "context 32,768 (device)" in names and "context 16,384 (device)" not in names


def test_calibration_bad_setting_shows_the_error() -> None:
    at = app("calibration.py")
    at.text_input(key="cal_contexts").set_value("512, lots")
    at.run()
    assert not at.exception
    assert errors(at) == ["decode contexts: expected whole numbers >= 1 separated by commas, got '512, lots'"]
    assert not charts(at)


# ----- Trace explorer --------------------------------------------------------------------------------

needs_traces = pytest.mark.skipif(not any(t.startswith("azure") for t in trace_files.list_traces()),
                                  reason="shipped traces not present")


@needs_traces
def test_traces_shows_rate_and_lengths() -> None:
    at = app("traces.py")
    figures = charts(at)
    assert [f["layout"]["title"]["text"] for f in figures] == ["Arrival rate (60 s bins)", "Length distributions"]
    assert not errors(at)


@needs_traces
def test_traces_changed_control_changes_the_rate() -> None:
    at = app("traces.py")
    before = charts(at)[0]
    at.number_input(key="tr_scale").set_value(0.5)
    at.run()
    after = charts(at)[0]
    assert after["data"][0] != before["data"][0]


@needs_traces
def test_traces_bad_setting_shows_the_error() -> None:
    at = app("traces.py")
    at.selectbox(key="tr_format").set_value("mooncake")
    at.run()
    assert not at.exception
    assert any("invalid JSON" in e for e in errors(at)), errors(at)
