"""Analytic profiles: roofline numbers match research §6, memory checks, carried-over efficiencies."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.analytic import (
    Efficiencies,
    analytic_profile,
    efficiencies_from,
    generate_shipped,
)
from calibration.engine.configs import get_model
from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import ProfileKind, Provenance, list_profiles, load_hardware, load_profile
from simulator.errors import ConfigError


def test_h200_8b_matches_first_principles() -> None:
    p = analytic_profile("H200", "llama-3-8b", 1, date="2025-01-01")
    hw = load_hardware()["H200"]
    # research §6: 15.01 GB of weights read per decode step; 128 KiB of KV per token.
    assert p.device_s.weight_s * hw.memory_bandwidth_Bps * 0.8 == pytest.approx(15.01e9, rel=0.01)
    assert p.memory.kv_bytes_per_token == 128 * 1024
    # research §6: ~0.85-0.9 M tokens of KV on one H200 (theirs counts 139 GiB; datasheet 141 GB here).
    assert 0.75e6 < p.memory.kv_capacity_tokens < 0.95e6
    assert p.kind is ProfileKind.ANALYTIC and p.comm is None
    assert "not measured" in p.label.lower()
    # Batch-1 decode between the 4.8 TB/s floor and 1.5x it.
    t = CostModel(p).step_time(StepShape(1, 1, 1, 1024, 0, 0.0))
    assert 3.1e-3 < t < 1.5 * 3.13e-3 + 1e-3


def test_prefill_2048_in_expected_band() -> None:
    # research §6: ~31 TFLOP for a 2,048-token prefill, 40 ms at peak; 55-65 ms at 60-70 % MFU.
    p = analytic_profile("H200", "llama-3-8b", 1)
    t = CostModel(p).device_time(StepShape(1, 2048, 0, 0, 2048, 2048 * 1024.0))
    assert 0.045 < t < 0.075


def test_tp_profiles_have_comm_and_sharded_kv() -> None:
    p = analytic_profile("H200", "llama-3-70b", 8)
    assert p.comm is not None and p.comm.num_layers == 80 and p.comm.hidden_size == 8192
    # research §5: 40 KiB of KV per token per GPU at TP 8 (one KV head per rank).
    assert p.memory.kv_bytes_per_token == 40 * 1024


def test_l40s_comm_falls_back_to_pcie() -> None:
    p = analytic_profile("L40S", "llama-3-70b", 4)
    hw = load_hardware()["L40S"]
    assert p.comm is not None
    assert p.comm.bus_bandwidth_Bps <= hw.host_link_bidirectional_Bps / 2


def test_model_that_does_not_fit() -> None:
    with pytest.raises(ConfigError, match="does not fit") as info:
        analytic_profile("H100", "llama-3-405b", 8)
    assert info.value.field == "model"
    with pytest.raises(ConfigError, match="does not fit"):
        analytic_profile("H200", "llama-3-70b", 1)


def test_unknown_inputs() -> None:
    with pytest.raises(ConfigError, match="did you mean 'H100'"):
        analytic_profile("H1000", "llama-3-8b")
    with pytest.raises(ConfigError, match="dtype"):
        analytic_profile("H200", "llama-3-8b", dtype="int3")
    with pytest.raises(ConfigError, match="unknown model"):
        analytic_profile("H200", "llama-9")


def test_carried_over_efficiencies_round_trip() -> None:
    eff = Efficiencies(bandwidth=0.7, flops=0.5, kv_bandwidth=0.65, attention_flops=0.4)
    fake = analytic_profile("H200", "llama-3-8b", efficiencies=eff).model_copy(
        update={"kind": ProfileKind.MEASURED, "name": "h200-llama-3-8b-tp1-measured",
                "provenance": Provenance(device_name="NVIDIA H200", date="2025-01-01", source="test")}
    )
    carried = efficiencies_from(fake)
    assert carried.bandwidth == pytest.approx(0.7)
    assert carried.flops == pytest.approx(0.5)
    assert carried.kv_bandwidth == pytest.approx(0.65)
    assert carried.attention_flops == pytest.approx(0.4)
    b200 = analytic_profile("B200", "llama-3-8b", efficiencies=carried)
    assert b200.derived_from == "h200-llama-3-8b-tp1-measured"
    assert "carried over" in b200.provenance.source
    assert "efficiencies from h200-llama-3-8b-tp1-measured" in b200.label
    with pytest.raises(ConfigError, match="not a measured profile"):
        efficiencies_from(analytic_profile("H200", "llama-3-8b"))


def test_shipped_profiles_are_current(tmp_path: Path) -> None:
    # The shipped files equal what the generator writes now (apart from the date): regenerate to update.
    written, skipped = generate_shipped(tmp_path, date="2000-01-01")
    assert {p.stem for p in written} <= set(list_profiles())
    assert any("llama-3-405b" in s for s in skipped)
    for path in written:
        fresh = load_profile(path)
        shipped = load_profile(path.stem)
        same_date = fresh.model_copy(update={"provenance": shipped.provenance})
        assert same_date == shipped, path.stem


def test_shard_shapes_used() -> None:
    p4 = analytic_profile("H100", "llama-3-70b", 4)
    shape = get_model("llama-3-70b", 4)
    assert p4.memory.weight_bytes == shape.num_params * 2
