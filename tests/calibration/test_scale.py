"""Per-layer scaling: lines in the layer count are recovered and composed; the all-reduce model."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.engine.configs import get_model
from calibration.scale import (
    allreduce_time_s,
    comm_model,
    fit_layer_scaling,
    fit_layer_times,
    full_model_profile,
    step_time_at_layers,
)
from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import DeviceCoefficients, MemoryFigures, ProfileKind, Provenance

FIXED = DeviceCoefficients(a0_s=50e-6, weight_s=0.27e-3, per_token_s=1.7e-6, per_ctx_token_s=0.0,
                           per_attn_pair_s=0.0, per_seq_s=2e-6)
PER_LAYER = DeviceCoefficients(a0_s=8e-6, weight_s=0.11e-3, per_token_s=0.35e-6, per_ctx_token_s=5e-10,
                               per_attn_pair_s=1.6e-12, per_seq_s=0.0)
NAMES = ("a0_s", "weight_s", "per_token_s", "per_ctx_token_s", "per_attn_pair_s", "per_seq_s")


def _at(k: int, noise: float, rng: np.random.Generator) -> DeviceCoefficients:
    values = {n: (getattr(FIXED, n) + k * getattr(PER_LAYER, n)) * (1 + rng.normal(0, noise)) for n in NAMES}
    return DeviceCoefficients(**values)


def test_layer_times_line() -> None:
    ks = [2, 4, 8, 16, 32]
    fit = fit_layer_times(ks, [1e-3 + k * 0.1e-3 for k in ks])
    assert fit.fixed_s == pytest.approx(1e-3)
    assert fit.per_layer_s == pytest.approx(0.1e-3)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.at(80) == pytest.approx(1e-3 + 80 * 0.1e-3)
    # Curvature (cross-layer effects) shows up as R² below 1.
    assert fit_layer_times(ks, [1e-3 + 1e-6 * k**2 for k in ks]).r2 < 0.999


def test_layer_times_needs_two_counts() -> None:
    with pytest.raises(ValueError):
        fit_layer_times([4, 4], [1.0, 1.1])


def test_scaling_recovers_full_model_with_noise() -> None:
    rng = np.random.default_rng(0)
    runs = {k: _at(k, 0.01, rng) for k in (2, 3, 4)}
    scaling = fit_layer_scaling(runs)
    full = scaling.at(80)
    for n in ("weight_s", "per_token_s", "per_ctx_token_s", "per_attn_pair_s"):
        truth = getattr(FIXED, n) + 80 * getattr(PER_LAYER, n)
        # Extrapolating from k ≤ 4 to 80 multiplies slope noise; 1 % noise stays within 10 %.
        assert getattr(full, n) == pytest.approx(truth, rel=0.10), n
    assert all(getattr(full, n) >= 0 for n in NAMES)


def test_scaling_exact_without_noise() -> None:
    rng = np.random.default_rng(0)
    scaling = fit_layer_scaling({k: _at(k, 0.0, rng) for k in (1, 2, 4)})
    full = scaling.at(80)
    for n in NAMES:
        assert getattr(full, n) == pytest.approx(getattr(FIXED, n) + 80 * getattr(PER_LAYER, n), rel=1e-6, abs=1e-15)
    assert scaling.min_r2 == pytest.approx(1.0)


def test_allreduce_and_step_composition() -> None:
    # research §5: 70B TP 8, decode B 32: 512 KiB per all-reduce, ~10 µs with α = 8 µs.
    t_ar = allreduce_time_s(32 * 8192 * 2, 8, 8e-6, 450e9)
    assert 9e-6 < t_ar < 11e-6
    total = step_time_at_layers(1e-3, 0.05e-3, 80, allreduce_s=t_ar)
    assert total == pytest.approx(1e-3 + 80 * 0.05e-3 + 160 * t_ar)


def test_full_model_profile_prices_comm() -> None:
    rng = np.random.default_rng(0)
    scaling = fit_layer_scaling({k: _at(k, 0.0, rng) for k in (2, 4)})
    model = get_model("llama-3-70b")
    comm = comm_model(model, 8, alpha_s=8e-6, bus_bandwidth_Bps=450e9)
    profile = full_model_profile(
        scaling, name="h200-llama-3-70b-tp8-scaled", hardware="H200", model=model, tp=8, comm=comm,
        memory=MemoryFigures(kv_bytes_per_token=40960, kv_capacity_tokens=1_000_000,
                             weight_bytes=18 * 10**9, device_memory_bytes=141 * 10**9),
        host_link_Bps=50e9,
        provenance=Provenance(device_name="synthetic", date="2025-01-01", source="k-layer runs"),
    )
    assert profile.kind is ProfileKind.MEASURED and profile.tp == 8
    assert "scaled from runs of k = 2, 4 layers" in profile.provenance.source
    shape = StepShape(32, 32, 32, 32 * 1024, 0, 0.0)
    with_comm = CostModel(profile).device_time(shape)
    without = CostModel(profile.model_copy(update={"comm": None})).device_time(shape)
    assert with_comm - without == pytest.approx(160 * allreduce_time_s(32 * 8192 * 2, 8, 8e-6, 450e9))
