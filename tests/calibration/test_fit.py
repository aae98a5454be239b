"""Fitter: recovers known coefficients from synthetic timings with 3 % multiplicative noise.

Tolerances (stated, not tuned per run): the dominant coefficients W (weight read), f (per token),
k (per context token) and q (per attention pair) within 10 % of truth; a0 + W (the batch-1 floor) within
3 %; s (per sequence) within 30 % (its term is < 3 % of any step, so noise hides it); held-out MAPE ≤ 5 %.
a0 alone is not asserted: on a grid like this it trades against W through the knee.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.fit import (
    LINEAR_PARAMS,
    figure_measured_vs_predicted,
    fit_device,
    fit_host,
    fit_timings,
    predict_device,
    save_figure,
)
from simulator.cost.profile import DeviceCoefficients, MemoryFigures, ProfileKind, Provenance
from simulator.errors import ConfigError

TRUE = DeviceCoefficients(
    a0_s=256e-6, weight_s=3.9e-3, per_token_s=2.5e-5, knee_p=4.0, per_ctx_token_s=3.4e-8,
    per_attn_pair_s=8.8e-10, per_seq_s=8e-6,
)
TRUE_HOST = (300e-6, 5e-6, 20e-9)


def _row(b: int, n: int, d: int, ctx: int, prefill_tokens: int, pairs: float) -> dict[str, float]:
    return {"num_seqs": b, "num_new_tokens": n, "num_decode_seqs": d, "decode_context_sum": ctx,
            "num_prefill_tokens": prefill_tokens, "prefill_attention_pairs": pairs}


def synthetic_grid(seed: int = 0, noise: float = 0.03) -> pd.DataFrame:
    """The research §7.3 grid for an 8B model on one H200, timed by the true coefficients plus noise."""
    rows = []
    for b in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256):
        for c in (256, 1024, 4096, 16384):
            if b * c <= 800_000:  # within KV capacity
                rows.append(_row(b, b, b, b * c, 0, 0.0))
    for n in (16, 64, 256, 512, 1024, 2048, 4096, 8192):
        for p in (0, 2048, 16384):
            rows.append(_row(1, n, 0, 0, n, n * (p + n / 2)))
    for k in (4, 16):
        n = 2048 // k
        rows.append(_row(k, 2048, 0, 0, 2048, k * n * n / 2))
    for b in (32, 128):
        for n in (256, 2048):
            rows.append(_row(b + 1, b + n, b, b * 1024, n, n * n / 2))
    df = pd.DataFrame(rows)
    rng = np.random.default_rng(seed)
    df["device_s"] = predict_device(TRUE, df) * np.exp(rng.normal(0.0, noise, len(df)))
    h0, hs, hn = TRUE_HOST
    host = h0 + hs * df["num_seqs"] + hn * df["num_new_tokens"]
    df["cycle_s"] = df["device_s"] + host * np.exp(rng.normal(0.0, noise, len(df)))
    return df


@pytest.fixture(scope="module")
def grid() -> pd.DataFrame:
    return synthetic_grid()


@pytest.fixture(scope="module")
def result(grid: pd.DataFrame):
    return fit_timings(grid, num_folds=5, seed=0)


def test_recovers_dominant_coefficients(result) -> None:
    d = result.device
    for name in ("weight_s", "per_token_s", "per_ctx_token_s", "per_attn_pair_s"):
        assert getattr(d, name) == pytest.approx(getattr(TRUE, name), rel=0.10), name
    assert d.a0_s + d.weight_s == pytest.approx(TRUE.a0_s + TRUE.weight_s, rel=0.03)
    assert d.per_seq_s == pytest.approx(TRUE.per_seq_s, rel=0.30)


def test_held_out_error(result, grid: pd.DataFrame) -> None:
    err = result.error
    assert err.mape <= 0.05
    assert err.r2 > 0.99
    assert err.num_points == len(grid) and err.num_folds == 5
    assert err.max_error < 0.25
    assert np.all(np.isfinite(result.held_out_s))


def test_coefficients_non_negative_and_finite(result) -> None:
    values = [getattr(result.device, name) for name in LINEAR_PARAMS]
    assert all(np.isfinite(v) and v >= 0 for v in values)


def test_roofline_start_gives_same_answer(grid: pd.DataFrame) -> None:
    # A start 50 % off (as a datasheet guess may be) lands on the same optimum.
    off = TRUE.model_copy(update={k: 1.5 * getattr(TRUE, k) for k in LINEAR_PARAMS})
    a = fit_device(grid)
    b = fit_device(grid, initial=off)
    for name in ("weight_s", "per_token_s", "per_ctx_token_s", "per_attn_pair_s"):
        assert getattr(b, name) == pytest.approx(getattr(a, name), rel=0.02)


def test_fit_knee(grid: pd.DataFrame) -> None:
    d = fit_device(grid, fit_knee=True)
    assert 1.0 <= d.knee_p <= 16.0
    assert d.weight_s == pytest.approx(TRUE.weight_s, rel=0.15)


def test_no_prefill_rows_keeps_prefill_terms_at_start(grid: pd.DataFrame) -> None:
    decode_only = grid[grid["num_prefill_tokens"] == 0]
    d = fit_device(decode_only)
    assert d.per_ctx_token_s == pytest.approx(TRUE.per_ctx_token_s, rel=0.10)
    assert d.per_attn_pair_s == 0.0  # the linear guess has nothing to go on
    # With a roofline start, the unfittable term keeps the roofline value.
    assert fit_device(decode_only, initial=TRUE).per_attn_pair_s == TRUE.per_attn_pair_s


def test_host_terms(result) -> None:
    h = result.host
    assert h.h0_s == pytest.approx(TRUE_HOST[0], rel=0.15)
    assert h.per_seq_s == pytest.approx(TRUE_HOST[1], rel=0.25)
    assert h.per_seq_s >= 0 and h.per_token_s >= 0


def test_host_without_cycle_column(grid: pd.DataFrame) -> None:
    assert fit_host(grid.drop(columns="cycle_s")).h0_s == 0.0


def test_to_profile(result) -> None:
    profile = result.to_profile(
        name="h200-llama-3-8b-tp1-measured", hardware="H200", model="llama-3-8b", tp=1,
        memory=MemoryFigures(kv_bytes_per_token=131072, kv_capacity_tokens=800_000, weight_bytes=16 * 10**9,
                             device_memory_bytes=141 * 10**9),
        host_link_Bps=50e9,
        provenance=Provenance(device_name="synthetic", date="2025-01-01", source="test"),
    )
    assert profile.kind is ProfileKind.MEASURED
    assert profile.fit_error == result.error
    assert profile.valid_range is not None and profile.valid_range.max_batch == 256
    assert profile.valid_range.max_chunk == 8192


def test_bad_table_is_config_error(grid: pd.DataFrame) -> None:
    with pytest.raises(ConfigError) as info:
        fit_device(grid.drop(columns="decode_context_sum"))
    assert info.value.field == "decode_context_sum"
    bad = grid.copy()
    bad.loc[0, "device_s"] = np.nan
    with pytest.raises(ConfigError, match="finite"):
        fit_device(bad)


def test_figure(result, grid: pd.DataFrame, tmp_path: Path) -> None:
    fig = figure_measured_vs_predicted(grid, result.held_out_s)
    names = {trace.name for trace in fig.data}
    assert {"decode", "prefill", "mixed", "y = x"} <= names
    path = save_figure(fig, tmp_path / "fit.html")
    text = path.read_text()
    assert "<html>" in text
    assert 'src="https://cdn.plot.ly' not in text and len(text) > 1_000_000  # offline: plotly.js inlined


def test_multi_token_term_recovered_and_off_by_default(grid: pd.DataFrame) -> None:
    # CPU-like: one-token steps skip a fixed cost that every multi-token step pays.
    true = TRUE.model_copy(update={"multi_token_s": 2e-3})
    rng = np.random.default_rng(1)
    df = grid.assign(device_s=predict_device(true, grid) * np.exp(rng.normal(0.0, 0.01, len(grid))))
    with_term = fit_timings(df, num_folds=5, seed=0, multi_token=True)
    assert with_term.device.multi_token_s == pytest.approx(2e-3, rel=0.25)
    assert with_term.error.mape < 0.03
    without = fit_timings(df, num_folds=5, seed=0)
    assert without.device.multi_token_s == 0.0
    assert without.error.mape > with_term.error.mape


def test_multi_token_term_needs_both_kinds_of_step(grid: pd.DataFrame) -> None:
    # No one-token rows: m is indistinguishable from a0, so it is not fitted (stays 0).
    multi_only = grid[grid["num_new_tokens"] > 1]
    assert fit_device(multi_only, multi_token=True).multi_token_s == 0.0


def test_eager_floor_recovered_and_off_without_graphs(grid: pd.DataFrame) -> None:
    """GPU with CUDA graphs: steps run eagerly (every prefill and mixed step here) take at least E, the
    host launching their kernels one by one; graph-replayed decode steps follow the form. Fitted from rows
    on both sides, it comes back within 10 %; without graphs (graph_max 0) nothing is flagged and it stays 0."""
    true = TRUE.model_copy(update={"eager_floor_s": 0.03})
    rng = np.random.default_rng(2)
    df = grid.assign(device_s=predict_device(true, grid, graph_max=256) * np.exp(rng.normal(0.0, 0.02, len(grid))))
    eager = (df["num_new_tokens"] != df["num_seqs"]).to_numpy()
    held = eager & (predict_device(TRUE, grid) < 0.03)
    assert held.sum() >= 8 and (eager & ~held).sum() >= 8  # the floor binds on some eager rows, not all
    with_floor = fit_timings(df, num_folds=5, seed=0, graph_max=256)
    assert with_floor.device.eager_floor_s == pytest.approx(0.03, rel=0.10)
    assert with_floor.error.mape < 0.05
    without = fit_timings(df, num_folds=5, seed=0)
    assert without.device.eager_floor_s == 0.0
    assert without.error.mape > 2 * with_floor.error.mape
    # Only eager rows (no graph-replayed step to tell E from the form): E is not fitted.
    assert fit_device(df[eager], graph_max=256).eager_floor_s == 0.0


SHIPPED_CSV = Path(__file__).resolve().parents[2] / "calibration" / "profiles" / "h200-llama-3-8b-tp1-measured.csv"


def test_shipped_h200_profile_is_the_refit_of_its_raw_timings() -> None:
    """The shipped H200 profile's device terms and held-out error are what ``python -m calibration.fit
    --refit`` makes of its raw timings today: the profile is reproducible from the measurement it ships
    with (and its provenance hashes that file)."""
    from calibration.fit import refit_profile, sha256_file
    from simulator.cost.profile import load_profile

    shipped = load_profile("h200-llama-3-8b-tp1-measured")
    assert shipped.provenance.raw_timings_sha256 == sha256_file(SHIPPED_CSV)
    again, _ = refit_profile(shipped, pd.read_csv(SHIPPED_CSV), timings_name=SHIPPED_CSV.name,
                          timings_sha256=sha256_file(SHIPPED_CSV),
                          initial=load_profile("h200-llama-3-8b-tp1-analytic").device_s)
    for name in (*LINEAR_PARAMS, "knee_p"):
        expected = getattr(shipped.device_s, name)
        assert getattr(again.device_s, name) == pytest.approx(expected, rel=1e-3, abs=1e-12), name
    assert shipped.fit_error is not None and again.fit_error is not None
    assert again.fit_error.mape == pytest.approx(shipped.fit_error.mape, rel=1e-3)
    assert shipped.device_s.eager_floor_s > 0.01 and shipped.fit_error.mape < 0.10
