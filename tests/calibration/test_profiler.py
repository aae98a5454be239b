"""Profiler and timing: grid shapes agree with the core's StepShape, rows are written as measured, an
interrupted run resumes without re-measuring, a changed setup is refused, and timing statistics are right.

A fake runner stands in for the model where only bookkeeping is under test (deterministic "times" derived
from the step's shape); one test drives the real runner on the tiny model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

pytest.importorskip("torch")

from fake_runner import FakeRunner

from calibration.grid import (
    Grid,
    GridPoint,
    PointKind,
    decode_point,
    get_grid,
    mixed_point,
    prefill_point,
    shape_of,
    skewed_point,
)
from calibration.profiler import (
    CSV_COLUMNS,
    EXTRA_TIMING_KEYS,
    SHAPE_COLUMNS,
    TIMING_KEYS,
    RunInfo,
    read_timings,
    run_grid,
    sidecar_path,
)
from calibration.timing import RepeatPolicy, WallTimer, repeat, summarize, time_call
from simulator.errors import ConfigError


def _info(grid: str = "t", model: str = "tiny") -> RunInfo:
    return RunInfo(model=model, dtype="float32", backend="fake", device_type="cpu", grid=grid, block_size=16,
                   num_layers=2, cuda_graphs=False, device_name="test")


def _grid(points: tuple[GridPoint, ...] | None = None, passes: int = 1) -> Grid:
    points = points or (decode_point(4, 100), prefill_point(64, 32), mixed_point(2, 50, 16), skewed_point(4, 40))
    return Grid("t", "tiny", points, RepeatPolicy(num_warmup=1, num_repeats=3, min_repeats=2), num_passes=passes)


def test_point_shapes_match_the_core() -> None:
    d = decode_point(8, 100)
    assert d.kind is PointKind.DECODE
    assert (d.shape.num_seqs, d.shape.num_new_tokens, d.shape.decode_context_sum) == (8, 8, 800)
    p = prefill_point(64, 32)
    assert p.kind is PointKind.PREFILL
    assert p.shape.prefill_attention_pairs == 64 * (32 + 64 / 2)
    assert (p.max_context, p.max_chunk) == (96, 64)
    m = mixed_point(4, 10, 16, 8)
    assert m.kind is PointKind.MIXED
    assert (m.shape.num_decode_seqs, m.shape.num_prefill_tokens, m.shape.num_new_tokens) == (4, 16, 20)
    s = skewed_point(8, 100)
    assert s.shape.decode_context_sum == d.shape.decode_context_sum and s.max_context > d.max_context
    assert shape_of([(1, 9), (5, 0)]).decode_context_sum == 10
    with pytest.raises(ValueError):
        GridPoint("empty")


def test_presets_are_well_formed() -> None:
    for name in ("ci", "cpu", "gpu"):
        grid = get_grid(name)
        kinds = {p.kind for p in grid.points}
        assert kinds == set(PointKind), name
    assert get_grid("ci").model == "tiny" and get_grid("cpu").model == "small" and get_grid("gpu").model == "llama-3-8b"
    with pytest.raises(ConfigError, match="unknown grid"):
        get_grid("huge")


def test_rows_sidecar_and_resume(tmp_path: Path) -> None:
    runner = FakeRunner()
    grid = _grid(passes=2)
    path = tmp_path / "t.csv"
    first = run_grid(runner, grid, path, _info(), vocab_size=256, progress=False, max_points=3)
    assert (first.measured, first.resumed) == (3, 0)
    df = read_timings(path)
    assert list(df.columns) == list(CSV_COLUMNS) and len(df) == 3
    sidecar = json.loads(sidecar_path(path).read_text())
    assert sidecar["model"] == "tiny" and sidecar["date"]

    # A run killed mid-row leaves a partial line: it is dropped, the rest is kept and not re-measured.
    with path.open("a") as fh:
        fh.write("decode_b4_c100,decode,1,4,4")
    calls_before = len(runner.calls)
    second = run_grid(runner, grid, path, _info(), vocab_size=256, progress=False)
    assert (second.measured, second.resumed) == (5, 3)
    df = read_timings(path)
    assert len(df) == 8 and not df[list(SHAPE_COLUMNS)].isna().any().any()
    assert set(zip(df["point"], df["pass_index"], strict=True)) == {(p.name, k) for p in grid.points for k in (0, 1)}
    # Each measured point = warm-ups + repeats; nothing for the resumed ones.
    assert len(runner.calls) - calls_before == 5 * (1 + 3)
    third = run_grid(runner, grid, path, _info(), vocab_size=256, progress=False)
    assert third.measured == 0 and third.resumed == 8


def test_shape_columns_and_medians(tmp_path: Path) -> None:
    runner = FakeRunner()
    path = tmp_path / "t.csv"
    run_grid(runner, _grid(), path, _info(), vocab_size=256, progress=False)
    df = read_timings(path).set_index("point")
    row = df.loc["prefill_n64_p32"]
    assert row["prefill_attention_pairs"] == 64 * (32 + 32) and row["num_new_tokens"] == 64
    assert row["device_s"] == pytest.approx(1e-3 + 64e-5 + 96e-7)
    assert row["cycle_s"] - row["device_s"] == pytest.approx(2e-4)
    assert row["max_context"] == 96 and row["max_chunk"] == 64 and row["num_repeats"] == 3


def test_refuses_another_setup(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    run_grid(FakeRunner(), _grid(), path, _info(), vocab_size=256, progress=False, max_points=1)
    with pytest.raises(ConfigError, match="other settings"):
        run_grid(FakeRunner(), _grid(), path, _info(model="small"), vocab_size=256, progress=False)


CHANGED: dict[str, Any] = {
    "device_type": "cuda", "device_name": "NVIDIA H200", "dtype": "bfloat16", "backend": "flex",
    "cuda_graphs": True, "clock": "thread_cpu", "torch_threads": 4, "model": "small", "num_layers": 3,
    "block_size": 32, "grid": "other", "engine_version": "engine 0123; torch 9.9", "seed": 7,
}
"""One other value for every setting that changes a timing."""


@pytest.mark.parametrize("setting", [*TIMING_KEYS, *EXTRA_TIMING_KEYS])
def test_resume_refuses_a_csv_measured_with_any_other_timing_setting(setting: str, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    measured = dataclasses.replace(_info(), torch_threads=1, seed=0, engine_version="engine 1; torch 2.13",
                                   extra={"tp": 1, "hardware": "CPU"})
    run_grid(FakeRunner(), _grid(), path, measured, vocab_size=256, progress=False, max_points=2)
    before = path.read_bytes(), sidecar_path(path).read_bytes()
    if setting in EXTRA_TIMING_KEYS:
        other = dataclasses.replace(measured, extra={**measured.extra, setting: {"tp": 2, "hardware": "H200"}[setting]})
    else:
        other = dataclasses.replace(measured, **{setting: CHANGED[setting]})
    runner = FakeRunner()
    with pytest.raises(ConfigError) as caught:
        run_grid(runner, _grid(), path, other, vocab_size=256, progress=False)
    message = str(caught.value)
    assert f"({setting} " in message or f"; {setting} " in message, message
    assert "there" in message and "now" in message and "\n" not in message
    assert runner.calls == [] and (path.read_bytes(), sidecar_path(path).read_bytes()) == before
    assert len(TIMING_KEYS) == len(CHANGED) and set(TIMING_KEYS) == set(CHANGED)


def test_resume_keeps_the_sidecar_until_a_new_row_is_measured(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    first = dataclasses.replace(_info(), date="2026-01-01T00:00:00+00:00", git_revision="aaa")
    run_grid(FakeRunner(), _grid(), path, first, vocab_size=256, progress=False, max_points=2)
    original = sidecar_path(path).read_bytes()
    later = dataclasses.replace(first, date="2026-02-02T00:00:00+00:00", git_revision="bbb")
    run_grid(FakeRunner(), _grid(), path, later, vocab_size=256, progress=False, max_points=0)
    assert sidecar_path(path).read_bytes() == original, "nothing measured: the sidecar is as it was"
    run_grid(FakeRunner(), _grid(), path, later, vocab_size=256, progress=False, max_points=1)
    sidecar = json.loads(sidecar_path(path).read_text())
    assert (sidecar["date"], sidecar["git_revision"]) == (first.date, "aaa"), "the first session's record stays"
    assert sidecar["resumed"] == [{"date": later.date, "git_revision": "bbb", "rows_before": 2}]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary left"


def test_resume_refuses_a_csv_without_or_with_a_broken_sidecar(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    run_grid(FakeRunner(), _grid(), path, _info(), vocab_size=256, progress=False, max_points=1)
    rows = path.read_bytes()
    sidecar_path(path).write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable provenance sidecar"):
        run_grid(FakeRunner(), _grid(), path, _info(), vocab_size=256, progress=False)
    sidecar_path(path).unlink()
    with pytest.raises(ConfigError, match=r"no t\.provenance\.json saying how they were measured"):
        run_grid(FakeRunner(), _grid(), path, _info(), vocab_size=256, progress=False)
    assert path.read_bytes() == rows and not sidecar_path(path).exists()


def test_points_beyond_the_pool_are_skipped(tmp_path: Path) -> None:
    runner = FakeRunner(num_blocks=8)
    result = run_grid(runner, _grid((decode_point(2, 16), decode_point(64, 1024))), tmp_path / "t.csv", _info(),
                      vocab_size=256, progress=False)
    assert result.measured == 1 and len(result.skipped) == 1 and "decode_b64_c1024" in result.skipped[0]


def test_timing_statistics() -> None:
    stats = summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (stats.median_s, stats.q1_s, stats.q3_s, stats.min_s, stats.num_samples) == (3.0, 2.0, 4.0, 1.0, 5)
    assert stats.iqr_s == 2.0 and stats.rel_iqr == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        summarize([])
    calls: list[int] = []
    results = repeat(lambda: calls.append(1) or len(calls), RepeatPolicy(num_warmup=2, num_repeats=4, min_repeats=1))
    assert results == [3, 4, 5, 6]
    # A zero budget stops at min_repeats.
    assert len(repeat(lambda: 0, RepeatPolicy(num_warmup=0, num_repeats=9, min_repeats=2, budget_s=0.0))) == 2
    value, elapsed = time_call(WallTimer(), lambda: 7)
    assert value == 7 and elapsed >= 0
    with pytest.raises(ValueError):
        RepeatPolicy(num_repeats=1, min_repeats=2)


def test_real_runner_tiny(tmp_path: Path) -> None:
    """The real runner on the tiny model: every row positive and finite."""
    import torch

    from calibration.engine.configs import get_model
    from calibration.engine.runner import ModelRunner

    torch.set_num_threads(1)
    grid = _grid()
    runner = ModelRunner(get_model("tiny"), num_blocks=grid.max_blocks(16), dtype=torch.float32)
    path = tmp_path / "real.csv"
    run_grid(runner, grid, path, _info(), vocab_size=runner.shape.vocab_size, progress=False)
    df = pd.read_csv(path)
    assert len(df) == len(grid.points)
    assert (df["device_s"] > 0).all() and (df["cycle_s"] >= df["device_s"]).all()


def test_aggregate_passes_keeps_the_least_disturbed_pass() -> None:
    from calibration.profiler import aggregate_passes

    df = pd.DataFrame({"point": ["a", "b", "a", "b"], "pass_index": [0, 0, 1, 1],
                       "device_s": [2.0, 1.0, 1.5, 3.0], "cycle_s": [2.1, 1.1, 1.6, 3.1]})
    out = aggregate_passes(df).set_index("point")
    assert out.loc["a", "device_s"] == 1.5 and out.loc["a", "cycle_s"] == 1.6
    assert out.loc["b", "device_s"] == 1.0 and len(out) == 2
    single = df[df["pass_index"] == 0]
    assert aggregate_passes(single).equals(single.reset_index(drop=True))


def test_thread_cpu_clock_splits_by_the_runner_share() -> None:
    from calibration.engine.attention import ScheduledSeq
    from calibration.profiler import Clock, timed_call
    from calibration.timing import ThreadCpuTimer

    seqs = [ScheduledSeq(num_new_tokens=4, num_computed_tokens=0, block_table=(0,))]
    call = timed_call(FakeRunner(), seqs, [1, 2, 3, 4], Clock.THREAD_CPU)
    assert call.wall_device_s == pytest.approx(1e-3 + 4e-5 + 4e-7)
    assert call.wall_cycle_s == pytest.approx(call.wall_device_s + 2e-4)
    assert 0 <= call.device_s <= call.cycle_s
    assert call.device_s == pytest.approx(call.cycle_s * call.wall_device_s / call.wall_cycle_s)
    runner_clock = timed_call(FakeRunner(), seqs, [1, 2, 3, 4], Clock.RUNNER)
    assert runner_clock.device_s == runner_clock.wall_device_s
    timer = ThreadCpuTimer()
    timer.start()
    sum(i * i for i in range(10000))
    assert timer.stop() >= 0


def test_aggregate_passes_mean_for_a_quiet_host() -> None:
    from calibration.profiler import aggregate_passes

    df = pd.DataFrame({"point": ["a", "b", "a", "b"], "kind": ["decode"] * 4, "pass_index": [0, 0, 1, 1],
                       "device_s": [2.0, 1.0, 1.5, 3.0], "cycle_s": [2.1, 1.1, 1.6, 3.1], "num_seqs": [1, 2, 1, 2]})
    out = aggregate_passes(df, how="mean").set_index("point")
    assert out.loc["a", "device_s"] == pytest.approx(1.75) and out.loc["a", "cycle_s"] == pytest.approx(1.85)
    assert out.loc["b", "device_s"] == pytest.approx(2.0) and out.loc["b", "num_seqs"] == 2 and len(out) == 2
    with pytest.raises(ValueError, match="pass aggregate"):
        aggregate_passes(df, how="max")
