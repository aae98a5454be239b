"""Metrics: the §5 definitions on hand-computed examples, the time-series grid, the RunResult on disk."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from simulator.errors import ConfigError
from simulator.results import run_folder
from simulator.results.intervals import metric_interval, summaries_with_ci
from simulator.results.request_log import RequestLog
from simulator.results.run_folder import save_run
from simulator.results.run_result import ProfileInfo, RunResult, VariantResult
from simulator.results.series import ReplicaSeries, fleet_kv_util_mean
from simulator.results.summary import SLO, CostConfig, Summary, round_sig, summarize


def hand_log() -> RequestLog:
    """Five requests whose metrics are worked out by hand in the tests below.

    r0: ttft 200 ms, e2e 1200 ms, 11 tokens → tpot 1000/10 = 100 ms, queue 100 ms
    r1: ttft 500 ms, e2e 500 ms, 1 token → no tpot, queue 0 ms
    r2: ttft 1000 ms, e2e 3000 ms, 5 tokens → tpot 2000/4 = 500 ms, queue 500 ms
    r3: started but unfinished at the end → in flight
    r4: rejected
    """
    log = RequestLog(2)  # smaller than the number of requests: exercises growth
    log.on_arrival(0, 0.0, 100, 11, None)
    log.on_routed(0, 0)
    log.on_scheduled(0, 0.1)
    log.on_first_token(0, 0.2)
    log.on_finish(0, 1.2, 32, 0)
    log.on_arrival(1, 1.0, 50, 1, 7)
    log.on_routed(1, 1)
    log.on_scheduled(1, 1.0)
    log.on_first_token(1, 1.5)
    log.on_finish(1, 1.5, 0, 0)
    log.on_arrival(2, 2.0, 80, 5, 7)
    log.on_routed(2, 0)
    log.on_scheduled(2, 2.5)
    log.on_scheduled(2, 2.9)  # after a preemption: ignored
    log.on_first_token(2, 3.0)
    log.on_first_token(2, 3.8)  # recompute after preemption: the client already had its first token
    log.on_finish(2, 5.0, 16, 1)
    log.on_arrival(3, 3.0, 10, 10, None)
    log.on_routed(3, 1)
    log.on_scheduled(3, 3.2)
    log.on_first_token(3, 3.4)
    log.on_arrival(4, 4.0, 100_000, 10, None)
    log.on_rejected(4, 4.0)
    return log


def hand_summary(slo: SLO | None = None, **kwargs: float | None) -> Summary:
    args: dict[str, Any] = {
        "duration_s": 10.0,
        "slo": slo,
        "num_gpus": 2,
        "usd_per_gpu_hour": 3.0,
        "kv_util_mean": 0.5,
        "prefix_hit_rate": 0.25,
        "preemptions": 1,
    }
    args.update(kwargs)
    return summarize(hand_log(), **args)


def test_counts_and_percentiles_match_hand_computation() -> None:
    s = hand_summary()
    assert (s.requests_arrived, s.requests_completed, s.requests_in_flight, s.requests_rejected) == (5, 3, 1, 1)
    # TTFT over completed requests [200, 500, 1000]; numpy's linear interpolation, as vLLM.
    assert s.ttft_p50_ms == pytest.approx(500)
    assert s.ttft_p90_ms == pytest.approx(500 + 0.8 * 500)
    assert s.ttft_p99_ms == pytest.approx(500 + 0.98 * 500)
    # TPOT leaves out the one-token answer: [100, 500].
    assert s.tpot_p50_ms == pytest.approx(300)
    assert s.tpot_p90_ms == pytest.approx(100 + 0.9 * 400)
    assert s.tpot_mean_ms == pytest.approx(300)
    assert s.e2e_p50_ms == pytest.approx(1200)
    assert s.e2e_mean_ms == pytest.approx((1200 + 500 + 3000) / 3)
    # Queue delay uses the first scheduling only (r2: 500 ms, not 900).
    assert s.queue_p50_ms == pytest.approx(100)
    assert s.queue_p99_ms == pytest.approx(100 + 0.98 * 400)
    assert s.throughput_rps == pytest.approx(0.3)
    assert s.throughput_tok_s == pytest.approx((11 + 1 + 5) / 10)
    assert s.output_tokens == 17


def test_goodput_and_attainment_count_unfinished_as_failures() -> None:
    slo = SLO(ttft_ms=600, tpot_ms=200, target_attainment=0.4)
    s = hand_summary(slo)
    # r0 meets both; r1 meets (no TPOT to miss); r2 misses both; r3, r4 never completed.
    assert s.goodput_rps == pytest.approx(2 / 10)
    assert s.slo_attainment == pytest.approx(2 / 5)
    assert s.slo_met
    assert not hand_summary(slo.model_copy(update={"target_attainment": 0.5})).slo_met


def test_e2e_threshold_and_no_threshold() -> None:
    assert hand_summary(SLO(e2e_ms=1200)).goodput_rps == pytest.approx(0.2)  # at the limit meets it
    everything = hand_summary(SLO(target_attainment=0.6))
    assert everything.slo_attainment == pytest.approx(3 / 5)  # completed / arrived
    assert everything.slo_met


def test_percentile_thresholds_decide_the_verdict() -> None:
    assert hand_summary(SLO(ttft_p99_ms=1000, target_attainment=0.0)).slo_met
    assert not hand_summary(SLO(ttft_p99_ms=980, target_attainment=0.0)).slo_met
    assert not hand_summary(SLO(tpot_p99_ms=400, target_attainment=0.0)).slo_met


def test_cost_per_million_output_tokens() -> None:
    s = hand_summary()
    gpu_hours = 2 * 10 / 3600
    assert s.gpu_hours == pytest.approx(gpu_hours)
    assert s.cost_per_mtok_usd == pytest.approx(gpu_hours * 3.0 / (17 / 1e6))
    unpriced = hand_summary(usd_per_gpu_hour=None)
    assert math.isnan(unpriced.cost_per_mtok_usd)
    assert unpriced.to_dict()["cost_per_mtok_usd"] is None


def test_warmup_excludes_early_arrivals() -> None:
    s = hand_summary(warmup_s=1.5)
    assert (s.requests_arrived, s.requests_completed, s.requests_in_flight, s.requests_rejected) == (3, 1, 1, 1)
    assert s.duration_s == pytest.approx(8.5)
    assert s.ttft_p50_ms == pytest.approx(1000)
    with pytest.raises(ValueError, match="warmup"):
        hand_summary(warmup_s=10.0)


def test_empty_run_is_json_safe() -> None:
    s = summarize(
        RequestLog(0),
        duration_s=1.0,
        slo=SLO(),
        num_gpus=1,
        usd_per_gpu_hour=1.0,
        kv_util_mean=math.nan,
        prefix_hit_rate=math.nan,
        preemptions=0,
    )
    d = s.to_dict()
    assert d["requests_arrived"] == 0 and d["ttft_p50_ms"] is None and d["slo_attainment"] is None
    assert d["slo_met"] is False
    json.dumps(d, allow_nan=False)


def test_summary_dict_has_the_contract_keys_and_round_trips() -> None:
    d = hand_summary(SLO(ttft_ms=600)).to_dict()
    required = {
        "requests_arrived", "requests_completed", "requests_in_flight", "requests_rejected",
        "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
        "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms", "queue_p50_ms", "throughput_rps", "throughput_tok_s",
        "goodput_rps", "slo_attainment", "slo_met", "kv_util_mean", "prefix_hit_rate", "preemptions",
        "cost_per_mtok_usd", "duration_s",
    }  # fmt: skip
    assert required <= d.keys()
    assert Summary.from_dict(d).to_dict() == d


def test_round_sig_is_six_significant_digits() -> None:
    assert round_sig(1234567.89) == 1234570.0
    assert round_sig(0.000123456789) == 0.000123457
    assert round_sig(math.nan) is None and round_sig(math.inf) is None


def test_requests_frame_derives_latencies_and_missing_values() -> None:
    frame = make_result().requests_df("base")
    assert list(frame["outcome"]) == ["completed", "completed", "completed", "in_flight", "rejected"]
    assert frame.loc[0, "ttft_ms"] == pytest.approx(200)
    assert frame.loc[0, "tpot_ms"] == pytest.approx(100)
    assert np.isnan(frame["tpot_ms"][1])
    assert frame.loc[2, "queue_ms"] == pytest.approx(500)
    assert np.isnan(frame["e2e_ms"][3])
    assert frame["replica"].isna().tolist() == [False, False, False, False, True]
    assert frame["session_id"].isna().tolist() == [True, False, False, True, True]
    assert frame.loc[2, "preemptions"] == 1 and frame.loc[0, "cached_tokens"] == 32


def test_finish_without_first_token_sets_it() -> None:
    log = RequestLog(1)
    log.on_arrival(0, 1.0, 5, 1, None)
    log.on_finish(0, 1.25, 0, 0)
    assert log.latencies_ms()["ttft_ms"][0] == pytest.approx(250)


def test_log_grows_and_trims() -> None:
    log = RequestLog(1)
    log.on_arrival(1000, 5.0, 1, 1, None)
    assert len(log) == 1001
    assert log.trimmed().arrival_s.shape == (1001,)
    assert log.to_frame()["request_id"].tolist() == [1000]  # ids that never arrived are not rows


# --------------------------------------------------------------------------------------------------------
# ReplicaSeries
# --------------------------------------------------------------------------------------------------------


def test_series_samples_on_the_grid_only() -> None:
    s = ReplicaSeries(3, sample_interval_s=1.0)
    s.maybe_sample(0.5, 1, 0, 10, 100, 0, 100)
    s.maybe_sample(0.7, 2, 1, 20, 100, 50, 200)  # the state that holds over (0.7, 2.5)
    s.maybe_sample(0.9, 2, 1, 20, 100, 50, 200)
    s.maybe_sample(2.5, 3, 0, 30, 100, 50, 300)
    s.maybe_sample(3.0, 4, 2, 40, 100, 150, 400)  # exactly on a grid point: recorded as is
    s.close(4.5)
    frame = s.to_frame()
    assert frame["time_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert frame["running"].tolist() == [0, 2, 2, 4, 4]
    assert frame["waiting"].tolist() == [0, 1, 1, 2, 2]
    assert frame["kv_util"].tolist() == pytest.approx([0.0, 0.2, 0.2, 0.4, 0.4])
    assert (frame["replica"] == 3).all()
    # Windowed: hit tokens / prompt tokens since the previous grid point; cumulative since the start.
    assert np.isnan(frame["prefix_hit_rate"][0])
    assert frame["prefix_hit_rate"][1] == pytest.approx(50 / 200)
    assert np.isnan(frame["prefix_hit_rate"][2])
    assert frame["prefix_hit_rate"][3] == pytest.approx(100 / 200)
    assert frame["prefix_hit_rate_cum"][3] == pytest.approx(150 / 400)


def test_log_and_series_pickle_round_trip() -> None:
    """Results cross process boundaries (sweeps, notebooks): the recorders pickle, compiled or not."""
    log = hand_log()
    back = pickle.loads(pickle.dumps(log))
    assert len(back) == len(log)
    for name, column in log.columns().items():
        np.testing.assert_array_equal(back.columns()[name], column)
    s = ReplicaSeries(3, sample_interval_s=1.0)
    s.maybe_sample(0.5, 1, 0, 10, 100, 0, 100)
    s.maybe_sample(2.5, 3, 0, 30, 100, 50, 300)
    copy = pickle.loads(pickle.dumps(s))  # open: it goes on sampling where the original would
    for series in (s, copy):
        series.maybe_sample(3.5, 4, 1, 40, 100, 60, 400)
        series.close(5.0)
    assert copy.to_frame().equals(s.to_frame())
    assert copy.peak_running == s.peak_running == 4


def test_series_memory_is_bounded_by_duration_over_interval() -> None:
    s = ReplicaSeries(0, sample_interval_s=0.5)
    for step in range(10_000):
        s.maybe_sample(step * 0.001, 1, 0, 1, 2, 0, 0)
    assert len(s) == 20  # grid points 0.0 .. 9.5 over 10 s of steps, not 10 000 rows
    assert fleet_kv_util_mean([s], warmup_s=1.0) == pytest.approx(0.5)


def test_series_grid_is_identical_across_replicas() -> None:
    a, b = ReplicaSeries(0, 0.1), ReplicaSeries(1, 0.1)
    for t in np.arange(0.0, 3.0, 0.037):
        a.maybe_sample(float(t), 0, 0, 0, 1, 0, 0)
    for t in np.arange(0.0, 3.0, 0.051):
        b.maybe_sample(float(t), 0, 0, 0, 1, 0, 0)
    a.close(3.0)
    b.close(3.0)
    assert np.array_equal(a.columns()["time_s"], b.columns()["time_s"])


# --------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------


def test_slo_and_cost_are_frozen_and_strict() -> None:
    with pytest.raises(ValidationError):
        SLO(ttft=100)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        SLO(target_attainment=1.5)
    slo = SLO(ttft_ms=100)
    with pytest.raises(ValidationError):
        slo.ttft_ms = 5  # type: ignore[misc]
    assert CostConfig().resolve_price(4.5) == 4.5
    assert CostConfig(usd_per_gpu_hour=2.0).resolve_price(4.5) == 2.0


# --------------------------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------------------------


def test_seed_intervals_bootstrap_three_seeds_and_give_two_seeds_their_range() -> None:
    runs = [hand_summary(kv_util_mean=v) for v in (0.1, 0.2, 0.3)]
    ci = summaries_with_ci(runs)["kv_util_mean"]
    assert ci.mean == pytest.approx(0.2) and ci.num_samples == 3 and ci.kind == "bootstrap"
    # Three seeds: drawing the smallest three times has probability 1/27 > 2.5 %, so the 95 % ends are the
    # smallest and the largest seed.
    assert (ci.low, ci.high) == pytest.approx((0.1, 0.3))
    four = metric_interval(np.array([0.1, 0.2, 0.3, 0.4]))  # 1/256 < 2.5 %: the ends move inside the range
    assert 0.1 < four.low < 0.25 < four.high < 0.4
    assert summaries_with_ci(runs)["kv_util_mean"] == ci, "the same seeds give the same interval"
    assert ci.to_dict()["interval"] == "bootstrap"
    single = summaries_with_ci(runs[:1])["kv_util_mean"]
    assert math.isnan(single.low) and single.to_dict()["high"] is None and single.kind == "none"
    pair = summaries_with_ci(runs[:2])["kv_util_mean"]
    assert (pair.kind, pair.low, pair.high) == ("range", 0.1, 0.2) and pair.describe() == "the range of the 2 seeds"
    with pytest.raises(ValueError):
        summaries_with_ci([])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False), min_size=1, max_size=12),
       st.booleans())
@example([699051.0, 699051.0, 699050.9750399364], False)  # a mean of three draws rounded 1 ulp below the least
def test_seed_intervals_stay_within_the_values_a_figure_can_take(values: list[float], share: bool) -> None:
    """Never negative for a latency (the t-interval printed "TPOT p99 82.2 [-6.5, 170.8] ms" from two seeds),
    never outside [0, 1] for a share: every end lies within the seeds' own values."""
    data = np.array([v / 1e6 for v in values] if share else values)
    ci = metric_interval(data)
    if len(values) >= 2:
        assert data.min() <= ci.low <= ci.high <= data.max()
        assert ci.low <= ci.mean * (1 + 1e-12) and ci.mean <= ci.high * (1 + 1e-12)
        assert ci.kind == ("range" if len(values) == 2 else "bootstrap")
    else:
        assert ci.kind == "none" and math.isnan(ci.low)


def test_a_bootstrap_interval_shrinks_as_seeds_agree() -> None:
    spread = metric_interval(np.array([10.0, 40.0, 20.0, 30.0]))
    tight = metric_interval(np.array([24.0, 26.0, 25.0, 25.0]))
    assert spread.high - spread.low > 5 * (tight.high - tight.low) > 0


# --------------------------------------------------------------------------------------------------------
# RunResult
# --------------------------------------------------------------------------------------------------------


def make_result(kind: str = "measured") -> RunResult:
    series = []
    for r in range(2):
        s = ReplicaSeries(r, 1.0)
        for t in np.arange(0.0, 6.0, 0.25):
            s.maybe_sample(float(t), 1, r, int(10 * t), 100, int(t * 10), int(t * 40))
        s.close(6.0)
        series.append(s)
    profile = ProfileInfo(name="h200-llama3-8b", kind=kind)  # type: ignore[arg-type]
    variants = {
        name: VariantResult(name=name, requests=hand_log(), series=series, summary=hand_summary(slo),
                            profile=profile)
        for name, slo in (("base", SLO(ttft_ms=600)), ("strict", SLO(ttft_ms=300)))
    }  # fmt: skip
    return RunResult(
        scenario_name="chat-smoke",
        variants=variants,
        scenario={"seed": np.int64(3), "rate": np.float64(2.5), "file": Path("a.yaml"), "ks": (1, 2)},
    )


def test_result_frames() -> None:
    result = make_result()
    assert result.to_pandas()["variant"].value_counts().to_dict() == {"base": 5, "strict": 5}
    assert list(result.summary_df().index) == ["base", "strict"]
    assert result.summary_df().loc["strict", "goodput_rps"] == pytest.approx(0.1)
    series = result.series_df("base")
    assert set(series["replica"]) == {0, 1} and len(series) == 14
    with pytest.raises(KeyError, match="base"):
        result.requests_df("nope")


def test_summary_json_is_byte_identical_and_sorted() -> None:
    a, b = make_result().summary_json(), make_result().summary_json()
    assert a == b
    doc = json.loads(a)
    assert list(doc) == sorted(doc)
    assert doc["variants"]["base"]["requests_arrived"] == 5
    # The label falls back to the name when the run did not record one.
    assert doc["profile"] == {"kind": "measured", "label": "h200-llama3-8b", "name": "h200-llama3-8b"}
    assert doc["scenario"] == {"file": "a.yaml", "ks": [1, 2], "rate": 2.5, "seed": 3}
    # Last-bit noise (another platform's libm) does not change the file.
    noisy = hand_summary(kv_util_mean=0.5 + 1e-13).to_dict()
    assert json.dumps(noisy, sort_keys=True) == json.dumps(hand_summary().to_dict(), sort_keys=True)


def test_save_writes_all_files(tmp_path: Path) -> None:
    out = save_run(make_result(), tmp_path / "runs" / "first")
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "requests.parquet", "series.parquet",
                                                     "summary.json"]  # fmt: skip
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["first"]  # no temporary folder left
    import pandas as pd

    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == 10 and "ttft_ms" in requests


def test_save_refuses_a_non_empty_directory_and_leaves_it_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        save_run(make_result(), out)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    # With overwrite, our files land beside the user's, which survives.
    save_run(make_result(), out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "summary.json").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        save_run(make_result(), tmp_path / "file", overwrite=True)


def test_save_into_an_existing_empty_directory(tmp_path: Path) -> None:
    save_run(make_result(), tmp_path)
    assert (tmp_path / "report.html").exists()


def test_save_falls_back_to_csv_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the writer is told pyarrow is missing: hiding the module itself breaks pandas, whose string
    # columns may be backed by it (and whether they are depends on what ran before in the process).
    monkeypatch.setattr(run_folder, "_has_pyarrow", lambda: False)
    out = save_run(make_result(), tmp_path / "csv")
    assert (out / "requests.csv").exists() and (out / "series.csv").exists()


# --------------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------------

request_events = st.lists(
    st.tuples(
        st.floats(0.0, 50.0),  # arrival
        st.integers(1, 50),  # output tokens
        st.sampled_from(["unrouted", "queued", "started", "finished", "rejected"]),
        st.floats(0.0, 5.0),  # delays
        st.floats(0.0, 5.0),
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(
    events=request_events,
    ttft_ms=st.none() | st.floats(1.0, 10_000.0),
    tpot_ms=st.none() | st.floats(1.0, 5_000.0),
    warmup_s=st.sampled_from([0.0, 10.0]),
)
def test_outcomes_partition_arrivals_and_attainment_is_a_share(
    events: list[tuple[float, int, str, float, float]],
    ttft_ms: float | None,
    tpot_ms: float | None,
    warmup_s: float,
) -> None:
    log = RequestLog(4)
    for rid, (arrival, output, fate, d1, d2) in enumerate(events):
        log.on_arrival(rid, arrival, 10, output, None)
        if fate == "rejected":
            log.on_rejected(rid, arrival)
            continue
        if fate == "unrouted":
            continue
        log.on_routed(rid, rid % 3)
        if fate == "queued":
            continue
        log.on_scheduled(rid, arrival + d1)
        log.on_first_token(rid, arrival + d1 + d2)
        if fate == "finished":
            log.on_finish(rid, arrival + d1 + d2 + d2 * output, 0, 0)
    s = summarize(
        log,
        duration_s=120.0,
        slo=SLO(ttft_ms=ttft_ms, tpot_ms=tpot_ms),
        num_gpus=1,
        usd_per_gpu_hour=2.0,
        kv_util_mean=0.0,
        prefix_hit_rate=0.0,
        preemptions=0,
        warmup_s=warmup_s,
    )
    assert s.requests_completed + s.requests_in_flight + s.requests_rejected == s.requests_arrived
    assert s.requests_arrived == sum(1 for e in events if e[0] >= warmup_s)
    if s.requests_arrived:
        assert 0.0 <= s.slo_attainment <= 1.0
    else:
        assert math.isnan(s.slo_attainment)
    assert 0.0 <= s.goodput_rps <= s.throughput_rps
    frame = log.to_frame()
    assert frame["outcome"].value_counts().sum() == len(frame) == len(events)


def test_overwrite_swaps_the_whole_folder_and_keeps_the_users_files(tmp_path: Path) -> None:
    out = save_run(make_result(), tmp_path / "out")
    (out / "notes.txt").write_text("mine")
    (out / "mine").mkdir()
    (out / "mine" / "deep.txt").write_text("also mine")
    before = (out / "summary.json").stat().st_ino
    save_run(make_result(), out, overwrite=True)
    assert (out / "summary.json").stat().st_ino != before  # a new file, not the old one rewritten
    assert (out / "notes.txt").read_text() == "mine" and (out / "mine" / "deep.txt").read_text() == "also mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left beside it


def test_a_failed_save_leaves_the_previous_run_and_no_temporaries(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    out = save_run(make_result(), tmp_path / "out")
    old = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_folder, "render_report", disk_full)
    with pytest.raises(ConfigError, match="No space left on device; nothing was written"):
        save_run(make_result(), out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_unwritable_output_is_refused_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import tempfile

    def read_only(*args: Any, **kwargs: Any) -> str:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(ConfigError, match="Read-only file system"):
        run_folder.check_writable(tmp_path / "out")


def test_a_killed_save_is_cleaned_up_by_the_next(tmp_path: Path) -> None:
    """A save killed with SIGKILL leaves its temporary folder (its process is gone); a killed exchange may
    leave the previous run set aside. The next save beside them removes the one and puts back the other."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    pid = int(dead.stdout)
    stale = tmp_path / f".out.tmp-{pid}-abc"
    stale.mkdir()
    (stale / "requests.parquet").write_bytes(b"half")
    aside = tmp_path / f".out.old-{pid}-def"
    aside.mkdir()
    (aside / "summary.json").write_text("the previous run")
    assert sorted(p.name for p in run_folder.remove_stale_temporaries(tmp_path / "out")) == sorted(
        [stale.name, aside.name])
    assert (tmp_path / "out" / "summary.json").read_text() == "the previous run"  # put back, not lost
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_overwrite_without_an_atomic_exchange_still_keeps_everything(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes.util

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)  # no renameat2: the two-rename path
    out = save_run(make_result(), tmp_path / "out")
    (out / "notes.txt").write_text("mine")
    save_run(make_result(), out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "report.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


SLOW_SAVE = """
import sys, time
sys.path.insert(0, sys.argv[1])
import test_metrics
from simulator.results import run_folder
def slow(*args, **kwargs):
    print("writing", flush=True)
    time.sleep(60)
run_folder.render_report = slow
run_folder.save_run(test_metrics.make_result(), __import__("pathlib").Path(sys.argv[2]), overwrite=True)
"""


def test_kill_9_during_an_overwrite_keeps_the_previous_run(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    out = save_run(make_result(), tmp_path / "out")
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    child = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, str(Path(__file__).parent), str(out)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "writing"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old  # the previous run, intact
    assert any(p.name.startswith(".out.tmp-") for p in tmp_path.iterdir())  # what the killed save left
    save_run(make_result(), out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the next save cleaned it up
