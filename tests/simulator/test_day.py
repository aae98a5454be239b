"""A day of traffic: diurnal arrivals, replica lifecycle, autoscalers, failures with retries, and the
conservation of requests (arrivals = completed + failed + rejected + in flight, exactly)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli.main import main
from simulator.errors import ConfigError
from simulator.fleet import dynamic
from simulator.fleet.autoscaler import (
    ConcurrencyAutoscaler,
    Observation,
    OracleAutoscaler,
    Scaler,
    ScalingContext,
)
from simulator.fleet.config import AutoscalingConfig, LifecycleConfig
from simulator.fleet.lifecycle import cold_start
from simulator.results.request_log import REQUEST_COLUMNS, RequestOutcome
from simulator.results.run_result import VariantResult
from simulator.scenario import load_mapping
from simulator.simulation import run
from simulator.workload.arrival import DiurnalArrival, arrival_times
from simulator.workload.rate_curve import rate_points

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "day-test",
    "seed": 3,
    "workload": {
        "duration_s": 600,
        "arrival": {"process": "diurnal", "trough_rps": 2, "peak_rps": 30, "peak_at_s": 300, "period_s": 600},
        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 3000},
        "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "max": 400},
    },
    "fleet": {"replicas": 2, "profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm"},
    "router": {"policy": "least_requests"},
    "slo": {"ttft_ms": 500, "tpot_ms": 50},
    "simulation": {"sample_interval_s": 5},
    "lifecycle": {"provision_s": 20, "load_s": 5, "warmup_s": 5, "gpus_per_node": 2},
}


def simulate(overrides: list[str] | None = None, data: dict[str, Any] | None = None) -> VariantResult:
    result = run(load_mapping(data or BASE, overrides or []), check=True)
    return next(iter(result.variants.values()))


def conserved(variant: VariantResult) -> None:
    s = variant.summary
    failed = s.requests_failed or 0
    assert s.requests_completed + failed + s.requests_rejected + s.requests_in_flight == s.requests_arrived


# ----- diurnal load --------------------------------------------------------------------------------------


def test_diurnal_rate_peaks_and_troughs_where_asked() -> None:
    day = DiurnalArrival(trough_rps=1, peak_rps=9, peak_at_s=14 * 3600)
    assert day.rate_at(np.array([14 * 3600.0, 2 * 3600.0])).tolist() == pytest.approx([9, 1])
    times = arrival_times(day, np.random.default_rng(0), max_count=None, duration_s=86_400)
    per_hour = np.bincount((times // 3600).astype(int), minlength=24)
    assert per_hour[14] > 7 * per_hour[2]
    assert len(times) == pytest.approx(86_400 * 5, rel=0.02)  # the mean of the raised cosine


def test_a_burst_multiplies_the_rate_while_it_lasts() -> None:
    flat = {"trough_rps": 10, "peak_rps": 10}
    burst = DiurnalArrival(**flat, bursts=({"start_s": 100, "duration_s": 100, "factor": 4},))
    times = arrival_times(burst, np.random.default_rng(1), max_count=None, duration_s=300)
    counts = np.bincount((times // 100).astype(int), minlength=3)
    assert counts[1] > 3 * counts[0] and counts[1] > 3 * counts[2]


def test_rate_points_recover_a_trace_rate_stretched_to_a_day() -> None:
    rng = np.random.default_rng(2)
    times = np.sort(np.concatenate([rng.uniform(0, 600, 600), rng.uniform(600, 1200, 3000)]))
    points = rate_points(times, num_bins=4, span_s=86_400)
    rates = [r for _, r in points]
    assert points[-1][0] < 86_400
    assert rates[2] == pytest.approx(5 * rates[0], rel=0.25)
    assert np.mean(rates) == pytest.approx(3600 / 86_400, rel=0.05)


# ----- lifecycle -------------------------------------------------------------------------------------------


def test_cold_start_loads_the_profile_weights_at_the_bandwidth() -> None:
    config = LifecycleConfig(provision_s=60, load_bandwidth_gb_s=2, warmup_s=30)
    stages = cold_start(config, 35e9)
    assert stages.load_s == pytest.approx(17.5)
    assert stages.total_s == pytest.approx(107.5)


def test_a_started_replica_serves_only_once_ready() -> None:
    variant = simulate(["fleet.replicas=1", "autoscaling={policy: concurrency, target: 4, max_replicas: 6}"])
    assert variant.day is not None
    events = variant.day.log.events_frame()
    starts = events[events.kind == "start"].set_index("id").time_s
    readies = events[events.kind == "ready"].set_index("id").time_s
    assert len(starts) >= 2
    for replica, started in starts.items():
        if replica in readies:
            assert readies[replica] == pytest.approx(started + 30)  # 20 s + 5 s + 5 s
    frame = variant.requests.to_frame()
    for replica, ready in readies.items():
        served = frame[frame.replica == replica]
        assert (served.first_scheduled_s.dropna() >= ready - 1e-9).all()
    conserved(variant)
    assert variant.summary.requests_in_flight == 0


def test_a_dynamic_fleet_where_nothing_happens_serves_as_the_static_fleet() -> None:
    static = {k: v for k, v in BASE.items() if k != "lifecycle"}
    plain = simulate(data=static)
    dynamic = simulate()
    assert plain.day is None and dynamic.day is not None
    for column in ("replica", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(plain.requests.columns()[column], dynamic.requests.columns()[column])
    # The cost of a fleet that never changed is every GPU for the whole run.
    assert dynamic.summary.gpu_hours == pytest.approx(plain.summary.gpu_hours)


def test_scaling_down_drains_without_losing_a_request() -> None:
    variant = simulate(["fleet.replicas=6",
                        "autoscaling={policy: concurrency, target: 16, min_replicas: 1, scale_down_window_s: 0}"])
    assert variant.day is not None
    events = variant.day.log.events_frame()
    assert (events.kind == "drain").sum() >= 3
    assert (events.kind == "stop").sum() >= 3
    assert variant.summary.requests_completed == variant.summary.requests_arrived


# ----- autoscaler policies -------------------------------------------------------------------------------------


def observation(**fields: Any) -> Observation:
    base = {"time_s": 0.0, "num_ready": 4, "num_starting": 0, "held": 0, "waiting": 0, "arrival_rps": 0.0,
            "ttft_ms": math.nan, "tpot_ms": math.nan}
    return Observation(**{**base, **fields})


CONTEXT = ScalingContext(ttft_target_ms=500, tpot_target_ms=50, cold_start_s=100, future_arrivals_s=np.zeros(0))


def test_concurrency_policy_follows_the_hpa_formula() -> None:
    policy = ConcurrencyAutoscaler(metric="concurrency", target=10)
    assert policy.desired(observation(held=100), 4, 0)[0] == 10
    assert policy.desired(observation(held=42), 4, 0)[0] == 4  # within the 10 % tolerance
    queue = ConcurrencyAutoscaler(metric="queue", target=2)
    assert queue.desired(observation(waiting=20), 4, 0)[0] == 10


def test_scaler_bounds_and_holds_the_highest_recent_recommendation() -> None:
    config = AutoscalingConfig(policy="concurrency", target=10, min_replicas=2, max_replicas=8,
                               scale_down_window_s=60)
    scaler = Scaler(config, CONTEXT)
    assert scaler.decide(observation(held=1000), 4, 0).target == 8  # capped at max
    assert scaler.decide(observation(held=0), 8, 30).target == 8  # the window still remembers 8
    assert scaler.decide(observation(held=0), 8, 91).target == 2  # floor at min once the window passed


def test_scale_up_cooldown_spaces_scale_ups() -> None:
    config = AutoscalingConfig(policy="concurrency", target=10, scale_up_cooldown_s=60)
    scaler = Scaler(config, CONTEXT)
    assert scaler.decide(observation(held=80), 4, 0).target == 8
    assert scaler.decide(observation(num_ready=8, held=160), 8, 30).target == 8
    assert scaler.decide(observation(num_ready=8, held=160), 8, 60).target == 16


def test_oracle_sizes_for_the_load_one_cold_start_ahead() -> None:
    arrivals = np.arange(0, 1000, 0.1)  # 10 rps
    arrivals = np.concatenate([arrivals, np.arange(1000, 2000, 0.025)])  # then 40 rps
    oracle = OracleAutoscaler(arrivals_s=arrivals, rps_per_replica=4.5, lead_s=100, window_s=60, interval_s=15)
    assert oracle.desired(observation(), 1, 500)[0] == 3  # ceil(10 / 4.5)
    assert oracle.desired(observation(), 1, 900)[0] == 9  # the step is within a cold start: ceil(40 / 4.5)
    assert oracle.desired(observation(), 1, 800)[0] == 3
    # Going down: it holds the high load's replicas until the load ahead no longer needs them.
    falling = np.concatenate([np.arange(0, 1000, 0.025), np.arange(1000, 2000, 0.1)])
    oracle = OracleAutoscaler(arrivals_s=falling, rps_per_replica=4.5, lead_s=100, window_s=60, interval_s=15)
    assert oracle.desired(observation(), 9, 900)[0] == 9
    assert oracle.desired(observation(), 9, 1100)[0] == 3


@pytest.mark.parametrize("lead_s", [3e3, 5e16, 3.5e19])
def test_the_oracle_looks_no_further_than_the_last_arrival(lead_s: float) -> None:
    """A cold start longer than the workload (found by the scenario fuzzer: 5e16 s asked for 12 PiB, a mere
    1e9 s hung a run) sizes for the busiest window up to the last arrival; after it, one replica."""
    arrivals = np.concatenate([np.arange(0, 1000, 0.1), np.arange(1000, 2000, 0.025)])  # 10 then 40 rps
    oracle = OracleAutoscaler(arrivals_s=arrivals, rps_per_replica=4.5, lead_s=lead_s, window_s=60, interval_s=15)
    assert oracle.desired(observation(), 1, 0)[0] == 9
    assert oracle.desired(observation(), 1, 1990)[0] == 2  # 10 s of 40 rps left in a 60 s window: ceil(400 / 60 / 4.5)
    assert oracle.desired(observation(), 1, 5000)[0] == 1


def test_every_policy_runs_and_logs_its_decisions() -> None:
    policies = {
        "slo": ["autoscaling={policy: slo, max_replicas: 6, ttft_target_ms: 40}"],
        "schedule": ["autoscaling={policy: schedule, schedule: [[0, 1], [200, 4], [400, 2]]}"],
        "oracle": ["autoscaling={policy: oracle, rps_per_replica: 8, max_replicas: 6}"],
        "concurrency-queue": ["autoscaling={policy: concurrency, metric: queue, target: 2, max_replicas: 6}",
                              "engine.max_num_seqs=8"],  # a queue forms once 8 run
    }
    for name, overrides in policies.items():
        variant = simulate(["fleet.replicas=1", *overrides])
        assert variant.day is not None, name
        decisions = variant.day.log.decisions_frame()
        assert len(decisions) >= 600 / 15, name
        assert (decisions.target > decisions.current).any(), name
        conserved(variant)


# ----- failures ------------------------------------------------------------------------------------------------


def test_a_node_failure_retries_its_requests_elsewhere() -> None:
    variant = simulate(["fleet.replicas=4", "failures={node_failures: [{at_s: 300, node: 0}], detection_s: 5}"])
    assert variant.day is not None
    figures = variant.day.figures
    assert figures.num_crashes == 2  # two replicas per node
    assert figures.requests_retried > 0 and figures.requests_failed == 0
    assert figures.num_cold_starts == 2  # a static fleet replaces what it lost
    assert variant.summary.requests_completed == variant.summary.requests_arrived
    # The retried requests pay the lost work and the detection delay in TTFT.
    assert figures.retried_ttft_p50_ms > variant.summary.ttft_p50_ms + 5000 * 0.5


def test_retries_exhausted_are_counted_failed() -> None:
    variant = simulate(["fleet.replicas=2", "failures={crashes: [{at_s: 300, replica: 0}], max_retries: 0}"])
    assert variant.day is not None
    failed = variant.summary.requests_failed
    assert failed is not None and failed > 0
    assert failed == variant.day.figures.requests_failed == int(variant.day.log.failed.sum())
    conserved(variant)
    assert variant.summary.requests_completed == variant.summary.requests_arrived - failed


def test_a_fleet_that_lost_every_replica_fails_what_waits_instead_of_running_forever() -> None:
    variant = simulate(["fleet.replicas=2", "failures={node_failures: [{at_s: 200, node: 0}], replace: false}"])
    assert variant.day is not None
    failed = variant.summary.requests_failed
    assert failed is not None and failed > 0
    assert variant.summary.requests_completed + failed == variant.summary.requests_arrived


def test_spot_interruption_drains_first_and_loses_only_what_is_left() -> None:
    spot = "failures={spot_interruptions: [{at_s: 300, node: 0, notice_s: 120}]}"
    variant = simulate(["fleet.replicas=4", spot])
    assert variant.day is not None
    events = variant.day.log.events_frame()
    assert (events.kind == "drain").sum() == 2
    assert variant.day.figures.requests_retried == 0  # two minutes' notice is enough to finish
    assert variant.summary.requests_completed == variant.summary.requests_arrived


def test_soak_with_every_kind_of_failure_conserves_requests() -> None:
    """Half an hour of a diurnal load with crashes every few minutes, a node failure, a spot interruption and an
    autoscaler in the loop: every arrival ends completed, failed or rejected, exactly (the run check also
    verifies every replica's KV, crashed ones included)."""
    variant = simulate([
        "workload.duration_s=1800", "workload.arrival.period_s=900", "workload.arrival.peak_at_s=450",
        "workload.arrival.peak_rps=20", "fleet.replicas=3",
        "autoscaling={policy: concurrency, target: 6, max_replicas: 8}",
        "failures={mtbf_h: 0.05, max_retries: 1, detection_s: 20, node_failures: [{at_s: 450, node: 1}], "
        "spot_interruptions: [{at_s: 1000, node: 2, notice_s: 10}]}",
    ])
    assert variant.day is not None
    s = variant.summary
    figures = variant.day.figures
    assert figures.num_crashes >= 10 and figures.requests_retried > 0
    assert s.requests_in_flight == 0
    assert s.requests_completed + (s.requests_failed or 0) + s.requests_rejected == s.requests_arrived
    assert (s.requests_failed or 0) == int(variant.day.log.failed.sum())


def test_the_compiled_dispatch_routes_as_the_fleet_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ReadyRoute`` (the arrival feed's least-requests dispatch, compiled) and ``DynamicFleet.dispatch`` alone
    send every request to the same replica at the same time, through crashes noticed late (the fleet then
    decides each request itself), a node failure, scaling and retries: every column of the request log is equal.
    Fails with the compiled path picking differently (the last ready replica on ties, say) or left on while a
    crashed replica is still routable."""
    overrides = [
        "workload.duration_s=900", "workload.arrival.period_s=900", "workload.arrival.peak_at_s=450",
        "fleet.replicas=3", "autoscaling={policy: concurrency, target: 6, max_replicas: 6}",
        "failures={crashes: [{at_s: 200, replica: 1}, {at_s: 500, replica: 0}], max_retries: 1, detection_s: 30, "
        "node_failures: [{at_s: 450, node: 1}]}",
    ]
    fast = simulate(overrides)
    monkeypatch.setattr(dynamic, "ReadyRoute", lambda levels, log: None)
    slow = simulate(overrides)
    assert fast.day is not None and fast.day.figures.requests_retried > 0
    assert fast.summary.requests_arrived == slow.summary.requests_arrived > 1000
    for name in REQUEST_COLUMNS:
        np.testing.assert_array_equal(getattr(fast.requests, name), getattr(slow.requests, name), err_msg=name)


@pytest.mark.parametrize(("latency", "policy"), [
    (0.0, "{policy: slo, max_replicas: 6, ttft_target_ms: 60, interval_s: 5, window_s: 10}"),
    (0.05, "{policy: slo, max_replicas: 6, ttft_target_ms: 60, interval_s: 5, window_s: 10}"),
    (0.0, "{policy: concurrency, metric: queue, target: 0.05, max_replicas: 6, interval_s: 0.5}"),
], ids=["slo", "slo-latency", "queue"])
def test_an_autoscaler_sees_what_the_step_by_step_path_shows_it(latency: float, policy: str) -> None:
    """The SLO policy reads first tokens and finishes off the request log as the clock goes; a decode run logs
    its first step's first tokens as the step begins, so an observation must count only what has reached the
    clients by then (as with a network latency still to pass). The queue policy counts waiting requests, which
    a cut run's tail admits only when it settles: reading them settles it. Fast path and step by step: the
    same observations, decisions and request log. Fails when observations count times logged ahead of now,
    or read a replica's waiting requests without settling it."""
    overrides = [
        "workload.duration_s=900", "workload.arrival.period_s=900", "workload.arrival.peak_at_s=450",
        "fleet.replicas=1", f"network.latency_ms={latency * 1000:g}", f"autoscaling={policy}",
        "failures={crashes: [{at_s: 500, replica: 0}], max_retries: 1, detection_s: 5}",
    ]
    fast = simulate(overrides)
    slow = simulate([*overrides, "simulation.fast_path=false"])
    assert fast.day is not None and slow.day is not None
    assert fast.day.log.decisions == slow.day.log.decisions
    assert fast.day.log.counts == slow.day.log.counts
    assert len({decision[2] for decision in fast.day.log.decisions}) > 2  # it scaled, up and down
    for name in REQUEST_COLUMNS:
        np.testing.assert_array_equal(getattr(fast.requests, name), getattr(slow.requests, name), err_msg=name)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crash_times=st.lists(st.floats(0, 590), min_size=1, max_size=4), node_at=st.floats(0, 590),
       horizon=st.booleans(), retries=st.integers(0, 2), policy=st.sampled_from(["none", "concurrency", "slo"]))
def test_conservation_under_failures(crash_times: list[float], node_at: float, horizon: bool, retries: int,
                                     policy: str) -> None:
    crashes = ", ".join(f"{{at_s: {t}, replica: {i % 3}}}" for i, t in enumerate(crash_times))
    overrides = ["fleet.replicas=3", "workload.duration_s=300",
                 f"failures={{crashes: [{crashes}], node_failures: [{{at_s: {node_at}, node: 1}}], "
                 f"max_retries: {retries}, mtbf_h: 0.05}}"]
    if horizon:
        overrides.append("simulation.horizon_s=250")
    if policy != "none":
        overrides.append(f"autoscaling={{policy: {policy}, target: 8, max_replicas: 5}}")
    variant = simulate(overrides)  # the run check verifies every request's end and the KV of every replica
    conserved(variant)
    masks = variant.requests.outcomes()
    assert variant.day is not None
    failed = variant.day.log.failed[: len(masks[RequestOutcome.COMPLETED])]
    assert not (failed & masks[RequestOutcome.COMPLETED]).any()


# ----- bad input and the run folder ---------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "needles"), [
    ("autoscaling={policy: concurrency, min_replicas: 5, max_replicas: 2}", ("autoscaling", "min_replicas")),
    ("lifecycle.provision_s=-5", ("lifecycle.provision_s",)),
    ("workload.arrival={process: curve, points: [[0, 5], [60, -1]]}", ("workload.arrival", "rates")),
    ("workload.arrival={process: diurnal, trough_rps: -1, peak_rps: 5}", ("trough_rps",)),
    ("autoscaling={policy: oracle}", ("rps_per_replica",)),
    # no TTFT or TPOT target anywhere (found by test_scenario_fuzz: day.yaml without its slo section)
    ("autoscaling={policy: slo, max_replicas: 4}", ("slo autoscaler", "slo.ttft_ms")),
])
def test_bad_day_input_is_one_line(override: str, needles: tuple[str, ...], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(json.dumps(BASE))
    if "policy: slo" in override:
        del data["slo"]
    if override.startswith("workload.arrival="):  # a whole new arrival section, not merged into the old
        del data["workload"]["arrival"]
    with pytest.raises(ConfigError):
        load_mapping(data, [override])
    scenario = tmp_path / "day.json"
    scenario.write_text(json.dumps(data))
    code = main(["run", str(scenario), "--set", override, "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    for needle in needles:
        assert needle in err[0], err[0]


def test_run_folder_has_the_day_tables_and_summary_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "day.json"
    scenario.write_text(json.dumps(BASE))
    out = tmp_path / "out"
    code = main(["run", str(scenario), "--set", "fleet.replicas=1",
                 "--set", "autoscaling={policy: concurrency, target: 4}", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["day"]["base"]["policy"] == "concurrency"
    assert summary["day"]["base"]["num_cold_starts"] >= 1
    for table in ("decisions.csv", "lifecycle_events.csv", "replicas.csv"):
        assert (out / table).is_file(), table
    assert "Replicas over the day" in (out / "report.html").read_text()


def test_plan_compares_the_static_answer_with_each_autoscaler(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(json.dumps(BASE))
    data["workload"]["duration_s"] = 200
    data["variants"] = {"concurrency": {"autoscaling": {"policy": "concurrency", "target": 8}},
                        "oracle": {"autoscaling": {"policy": "oracle", "rps_per_replica": 10}}}
    scenario = tmp_path / "day.json"
    scenario.write_text(json.dumps(data))
    out = tmp_path / "plan"
    code = main(["plan", str(scenario), "--max-replicas", "3", "--seeds", "1", "--no-knee", "--autoscalers",
                 "--out", str(out), "--quiet"])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    table = (out / "autoscalers.csv").read_text().splitlines()
    assert table[0].startswith("variant,policy,replicas,gpu_hours,cost_per_day_usd")
    assert [row.split(",")[1] for row in table[1:]] == ["static", "concurrency", "oracle"]
    assert "static fleet against each autoscaler" in stdout


def test_the_warm_up_band_is_drawn_in_each_plot_s_own_x_unit() -> None:
    """The day's plots count hours on x; the others seconds: the warm-up band covers the same span in both."""
    from simulator.results.report import build_figures

    result = run(load_mapping(BASE, ["fleet.replicas=1", "autoscaling={policy: concurrency, target: 4}",
                                     "simulation.warmup_s=120"]))
    figures = build_figures(result)
    bands = {div_id: [s["x1"] for s in fig["layout"].get("shapes", []) if s["type"] == "rect"]
             for div_id, fig in figures.items()}
    assert bands["throughput"] == [120]
    assert bands["day-replicas"] == [pytest.approx(120 / 3600)]
    assert bands["day-slo-hourly"] == [pytest.approx(120 / 3600)]
    assert bands["ttft-cdf"] == []
