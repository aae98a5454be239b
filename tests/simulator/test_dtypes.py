"""Dtype pricing: bytes per weight and KV element, which layers quantize, and the GEMM rate by dtype."""

from __future__ import annotations

import pytest

from simulator.cost import dtypes
from simulator.cost.dtypes import KvDtype, WeightDtype
from simulator.cost.profile import load_hardware
from simulator.errors import ConfigError


def test_bytes_per_element() -> None:
    for sixteen_bit in (WeightDtype.BFLOAT16, WeightDtype.FLOAT16):
        assert dtypes.weight_bytes_per_param(sixteen_bit) == 2
    assert dtypes.weight_bytes_per_param(WeightDtype.FP8) == 1
    # W4A16: half a byte plus one fp16 scale per group of 128 weights.
    assert dtypes.weight_bytes_per_param(WeightDtype.INT4) == pytest.approx(0.5 + 2 / 128)
    assert [dtypes.kv_bytes_per_element(k) for k in KvDtype] == [2, 2, 1]


def test_only_linear_layers_quantize() -> None:
    linear, other = 6_979_321_856, 1_050_939_392  # Llama-3.1-8B: decoder linears; embedding + LM head + norms
    assert dtypes.weight_bytes(linear, other, WeightDtype.BFLOAT16) == 2 * (linear + other)
    fp8 = dtypes.weight_bytes(linear, other, WeightDtype.FP8)
    assert fp8 == linear + 2 * other
    # vLLM v0.19.0 logs 8.49 GiB for this model with --quantization fp8, 0.03 GiB of it the RoPE cache.
    assert fp8 / 2**30 == pytest.approx(8.49 - 0.03, abs=0.01)
    assert dtypes.weight_bytes(linear, other, WeightDtype.INT4) < fp8


def test_default_kv_dtype_is_vllm_auto() -> None:
    assert dtypes.default_kv_dtype(WeightDtype.FLOAT16) is KvDtype.FLOAT16
    for weights in (WeightDtype.BFLOAT16, WeightDtype.FP8, WeightDtype.INT4):
        assert dtypes.default_kv_dtype(weights) is KvDtype.BFLOAT16


def test_gemm_rate_ratio() -> None:
    table = load_hardware()
    for name in ("H100", "H200", "L40S", "B200"):
        hw = table[name]
        assert hw.dense_fp8_flops is not None
        assert dtypes.gemm_rate_ratio(hw, WeightDtype.FP8) == pytest.approx(hw.dense_fp8_flops / hw.dense_bf16_flops)
        assert 1.9 < dtypes.gemm_rate_ratio(hw, WeightDtype.FP8) < 2.1
    # Ampere has no FP8 tensor cores: FP8 weights run W8A16 at the BF16 rate.
    assert table["A100"].dense_fp8_flops is None
    assert dtypes.gemm_rate_ratio(table["A100"], WeightDtype.FP8) == 1.0
    for hw in table.values():
        for weights in (WeightDtype.BFLOAT16, WeightDtype.FLOAT16, WeightDtype.INT4):
            assert dtypes.gemm_rate_ratio(hw, weights) == 1.0


def test_unknown_dtypes_are_config_errors() -> None:
    assert dtypes.parse_weight_dtype("fp8") is WeightDtype.FP8
    with pytest.raises(ConfigError, match=r"'int3'; known: bfloat16, float16, fp8, int4") as info:
        dtypes.parse_weight_dtype("int3")
    assert info.value.field == "dtype"
    with pytest.raises(ConfigError, match="known: bfloat16, float16, fp8") as kv_info:
        dtypes.parse_kv_dtype("int4")
    assert kv_info.value.field == "kv_dtype"


def test_hardware_reports_memory_near_the_datasheet() -> None:
    for name, hw in load_hardware().items():
        # CUDA reports a total within a few % of the marketed size, below it when "80GB" is read as GiB
        # (HBM parts report more than 80e9 bytes: H100 81,091 MiB = 85.0e9).
        marketed_gb = hw.hbm_bytes / 1e9
        assert 0.9 * hw.hbm_bytes / 2**20 < hw.device_memory_mib < marketed_gb * 1024, name
        assert hw.device_memory_bytes == hw.device_memory_mib * 2**20
        assert {"device_memory_mib", "dense_fp8_flops", "dense_int8_ops"} <= set(hw.sources), name
