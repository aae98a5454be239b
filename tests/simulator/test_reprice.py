"""Repricing a profile for other weight and KV dtypes (``fleet.weight_dtype``, ``engine.kv.dtype``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.dtypes import KvDtype, WeightDtype
from simulator.cost.profile import get_accelerator, load_profile
from simulator.cost.reprice import at_dtypes
from simulator.errors import ConfigError
from simulator.scenario import load_scenario, resolve_replica

FITTED = load_profile("h100-llama-3-70b-tp4-fitted-published")
ANALYTIC = load_profile("h200-llama-3-8b-tp1-analytic")
H100 = get_accelerator("H100")


def test_fp8_kv_halves_bytes_and_doubles_capacity() -> None:
    fp8 = at_dtypes(FITTED, H100, kv_dtype=KvDtype.FP8)
    assert fp8.memory.kv_bytes_per_token * 2 == FITTED.memory.kv_bytes_per_token
    assert fp8.memory.kv_capacity_tokens == 2 * FITTED.memory.kv_capacity_tokens
    assert fp8.device_s.per_ctx_token_s == pytest.approx(FITTED.device_s.per_ctx_token_s / 2)
    assert fp8.kv_dtype == "fp8" and fp8.dtype == "bfloat16" and "repriced" in fp8.label


def test_same_dtypes_are_the_same_profile() -> None:
    assert at_dtypes(FITTED, H100, weight_dtype=WeightDtype.BFLOAT16, kv_dtype=KvDtype.BFLOAT16) is FITTED


def test_a_curve_repriced_at_unit_ratios_is_the_curve() -> None:
    """Only the KV dtype (or bf16 -> fp16 weights) changes: the token curve stays exactly as fitted."""
    from simulator.cost.reprice import repriced_curve

    curve = FITTED.device_s.token_curve
    assert curve is not None
    assert repriced_curve(curve, 1.0, 1.0).y == pytest.approx(curve.y, rel=1e-12)
    fp8_kv = at_dtypes(FITTED, H100, kv_dtype=KvDtype.FP8)
    assert fp8_kv.device_s.token_curve is not None
    assert fp8_kv.device_s.token_curve.y == pytest.approx(curve.y, rel=1e-12)


@pytest.mark.parametrize("profile", [FITTED, ANALYTIC], ids=["curve", "analytic"])
def test_fp8_weights_halve_decode_and_speed_prefill_on_hopper(profile) -> None:
    hw = get_accelerator(profile.hardware)
    fp8 = at_dtypes(profile, hw, weight_dtype=WeightDtype.FP8)
    base, fast = CostModel(profile), CostModel(fp8)
    one = StepShape(1, 1, 1, 1000, 0, 0.0)
    big = StepShape(1, 4096, 0, 0, 4096, 4096 * 2048.0)
    assert fast.device_time(one) < 0.75 * base.device_time(one)  # weight stream halves
    assert fast.device_time(big) < 0.8 * base.device_time(big)  # fp8 tensor cores
    assert fp8.memory.kv_capacity_tokens > profile.memory.kv_capacity_tokens


def test_int4_is_weight_only_on_an_a100() -> None:
    a100 = load_profile("a100-llama-2-70b-tp4-fitted-published")
    int4 = at_dtypes(a100, get_accelerator("A100"), weight_dtype=WeightDtype.INT4)
    base, small = CostModel(a100), CostModel(int4)
    one = StepShape(1, 1, 1, 100, 0, 0.0)
    big = StepShape(1, 4096, 0, 0, 4096, 4096 * 2048.0)
    assert small.device_time(one) < 0.6 * base.device_time(one)
    assert small.device_time(big) == pytest.approx(base.device_time(big), rel=0.05)  # compute at 16-bit


@settings(max_examples=40, deadline=None)
@given(weight=st.sampled_from(list(WeightDtype)), kv=st.sampled_from(list(KvDtype)), a=st.integers(1, 8000),
       b=st.integers(1, 8000))
def test_repriced_curve_never_falls(weight: WeightDtype, kv: KvDtype, a: int, b: int) -> None:
    model = CostModel(at_dtypes(FITTED, H100, weight_dtype=weight, kv_dtype=kv))
    lo, hi = sorted((a, b))
    assert model.time_of(1, lo, 0, 0, lo, 0.0, 0) <= model.time_of(1, hi, 0, 0, hi, 0.0, 0)


def _scenario(tmp_path: Path, fleet: dict[str, object], kv: dict[str, object] | None = None) -> Path:
    workload = {"num_requests": 20, "arrival": {"process": "poisson", "rate_rps": 1},
                "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 10}}
    data = {"schema_version": 1, "name": "dtypes", "workload": workload,
            "fleet": fleet, "engine": {"kv": kv or {}}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_scenario_fields_reprice_the_replica(tmp_path: Path) -> None:
    fleet = {"hardware": "H100", "model": "llama-3-70b", "tp": 4, "weight_dtype": "fp8"}
    loaded = load_scenario(_scenario(tmp_path, fleet, {"dtype": "fp8"}))
    setup = resolve_replica(loaded.scenario)
    assert setup.profile.dtype == "fp8" and setup.profile.kv_dtype is None and setup.profile.repriced


def test_unknown_dtype_names_the_field_and_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_scenario(_scenario(tmp_path, {"hardware": "H100", "model": "llama-3-70b", "tp": 4,
                                           "weight_dtype": "fp4"}))
    assert err.value.field == "fleet.weight_dtype" and "fp8" in str(err.value)


@pytest.mark.parametrize("hardware,expected", [("H200", (8192, 1024)), ("H100", (8192, 1024)),
                                               ("A100", (2048, 256)), ("L40S", (2048, 256))])
def test_vllm_preset_takes_the_gpus_serve_defaults(tmp_path: Path, hardware: str, expected: tuple[int, int]) -> None:
    """vLLM's get_batch_defaults (vllm/engine/arg_utils.py) for the API server: 8192 / 1024 on >= 70 GiB
    GPUs that are not A100s, else 2048 / 256; mirrored from vLLM's test_defaults_with_usage_context."""
    path = _scenario(tmp_path, {"hardware": hardware, "model": "llama-3-8b", "tp": 1})
    data = yaml.safe_load(path.read_text())
    data["engine"]["preset"] = "vllm"
    path.write_text(yaml.safe_dump(data))
    config = resolve_replica(load_scenario(path).scenario).scheduler
    assert (config.max_num_batched_tokens, config.max_num_seqs) == expected
    data["engine"]["max_num_seqs"] = 64  # a field the scenario sets wins, and the GPU defaults stand aside
    path.write_text(yaml.safe_dump(data))
    config = resolve_replica(load_scenario(path).scenario).scheduler
    assert config.max_num_seqs == 64 and config.max_num_batched_tokens == 8192  # the preset's own


def test_a_tp_that_cannot_split_the_heads_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:  # loading validates every variant's replica setup
        load_scenario(_scenario(tmp_path, {"hardware": "H200", "model": "llama-3-8b", "tp": 3}))
    message = str(err.value)
    assert err.value.field == "fleet.tp" and "cannot split" in message and "on other GPUs also 2, 4, 8" in message
    with pytest.raises(ConfigError) as err:
        load_scenario(_scenario(tmp_path, {"hardware": "H200", "model": "llama-3-8b", "tp": 2}))
    assert "no shipped profile for H200 / llama-3-8b / tp 2" in str(err.value) and "on H200: 1" in str(err.value)
