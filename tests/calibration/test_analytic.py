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
    # research §6: ~0.85-0.9 M tokens of KV on one H200 (139.8 GiB as CUDA reports it, vLLM's rule).
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
    with pytest.raises(ConfigError, match="not a measured or fitted-published profile"):
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
    # Weights as vLLM counts them: the rank's parameters plus its RoPE cos/sin cache.
    assert p4.memory.weight_bytes == shape.num_params * 2 + shape.max_position * shape.head_dim * 2


def test_memory_is_what_the_device_reports() -> None:
    hw = load_hardware()["H100"]
    p = analytic_profile("H100", "llama-3-8b")
    mem = p.memory
    assert mem.device_memory_bytes == hw.device_memory_bytes == 81091 * 2**20
    # vLLM v1's rule, whole blocks of 16: what the 0.9 share leaves after weights, activations, non-torch.
    left = int(mem.device_memory_bytes * mem.memory_fraction) - mem.weight_bytes - mem.activation_bytes \
        - mem.non_torch_bytes - mem.cuda_graph_bytes
    assert mem.kv_capacity_tokens == left // (16 * mem.kv_bytes_per_token) * 16
    assert mem.kv_capacity_tokens % 16 == 0
    assert "vLLM v1" in p.provenance.source and "81091 MiB" in p.provenance.source


def test_does_not_fit_names_model_tp_and_numbers() -> None:
    with pytest.raises(ConfigError, match=r"llama-3-70b at tp=1 does not fit: 131\.\d GiB of bfloat16 weights") as info:
        analytic_profile("H200", "llama-3-70b", 1)
    assert "NVIDIA H200" in info.value.message and "143155 MiB" in info.value.message
    # fp8 weights halve the linear layers: the same model then fits one H200.
    assert analytic_profile("H200", "llama-3-70b", 1, dtype="fp8").memory.kv_capacity_tokens > 0


def test_fp8_weights_on_fp8_tensor_cores() -> None:
    bf16 = analytic_profile("H100", "llama-3-8b")
    fp8 = analytic_profile("H100", "llama-3-8b", dtype="fp8")
    assert fp8.dtype == "fp8"
    linear = 6_979_321_856  # Llama-3.1-8B decoder linears; the LM head stays 16-bit
    assert bf16.memory.weight_bytes - fp8.memory.weight_bytes == linear
    assert fp8.device_s.weight_s < 0.6 * bf16.device_s.weight_s
    # W8A8 at the FP8 rate (2x BF16 on Hopper) for the linear layers, the LM head at the BF16 rate.
    assert fp8.device_s.per_token_s == pytest.approx(0.5 * bf16.device_s.per_token_s, rel=0.1)
    assert fp8.device_s.per_token_s > 0.5 * bf16.device_s.per_token_s
    assert fp8.memory.kv_capacity_tokens > bf16.memory.kv_capacity_tokens
    assert fp8.device_s.per_ctx_token_s == bf16.device_s.per_ctx_token_s


def test_fp8_without_fp8_tensor_cores_is_weight_only() -> None:
    bf16 = analytic_profile("A100", "llama-3-8b")
    fp8 = analytic_profile("A100", "llama-3-8b", dtype="fp8")
    assert fp8.device_s.weight_s < 0.6 * bf16.device_s.weight_s  # the bytes halve ...
    assert fp8.device_s.per_token_s == pytest.approx(bf16.device_s.per_token_s)  # ... the rate does not


def test_int4_weights_and_fp8_kv() -> None:
    bf16 = analytic_profile("L40S", "llama-3-8b")
    w4 = analytic_profile("L40S", "llama-3-8b", dtype="int4")
    assert w4.memory.weight_bytes < 0.4 * bf16.memory.weight_bytes
    assert w4.device_s.per_token_s == pytest.approx(bf16.device_s.per_token_s)  # W4A16: 16-bit GEMMs
    kv8 = analytic_profile("L40S", "llama-3-8b", kv_dtype="fp8")
    assert kv8.memory.kv_bytes_per_token == bf16.memory.kv_bytes_per_token // 2
    assert kv8.device_s.per_ctx_token_s == pytest.approx(bf16.device_s.per_ctx_token_s / 2)
    # Same pool, half the bytes per token: twice the tokens, to a block.
    assert abs(kv8.memory.kv_capacity_tokens - 2 * bf16.memory.kv_capacity_tokens) <= 16
    assert "KV fp8" in kv8.provenance.source
    with pytest.raises(ConfigError, match="kv_dtype"):
        analytic_profile("L40S", "llama-3-8b", kv_dtype="int4")
