"""MoE and MLA model shapes in the catalogue, and the analytic MoE profiles built from them: published
parameter counts, every expert in memory, active experts in a batch-1 step, MLA's replicated latent KV."""

from __future__ import annotations

import pytest

from calibration.analytic import SHIPPED_MOE, MoeLayout, analytic_profile, generate_shipped, moe_profile
from calibration.engine.configs import MODELS, get_model
from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.kv_pool import rope_cache_bytes
from simulator.cost.profile import load_hardware, load_profile
from simulator.errors import ConfigError


@pytest.mark.parametrize("model,total,active", [
    # Published totals: Mixtral of experts (Mistral AI, 2023): 46.7 B, 12.9 B active; Qwen3-30B-A3B model card:
    # 30.5 B, 3.3 B active; DeepSeek-V3 technical report (arXiv 2412.19437): 671 B, 37 B active.
    ("mixtral-8x7b", 46.7e9, 12.9e9),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),
    ("deepseek-v3", 671e9, 37e9),
])
def test_parameter_counts_match_the_published_ones(model: str, total: float, active: float) -> None:
    shape = get_model(model)
    assert shape.num_params == pytest.approx(total, rel=0.01)
    embedding = shape.vocab_size * shape.hidden_size  # counted in the published active figures
    assert shape.num_active_params + embedding == pytest.approx(active, rel=0.02)
    assert shape.source.startswith("https://huggingface.co/")


def test_dense_shapes_keep_their_counts() -> None:
    for shape in MODELS.values():
        if shape.moe is None and shape.mla is None:
            assert shape.num_linear_params == shape.num_layers * (shape.params_per_layer - 2 * shape.hidden_size)
            assert shape.num_params_read_per_step == shape.num_layers * shape.params_per_layer \
                + shape.vocab_size * shape.hidden_size + shape.hidden_size
            assert shape.num_active_params == shape.num_params_read_per_step


def test_sharding_keeps_every_expert_somewhere() -> None:
    whole = get_model("qwen3-30b-a3b")
    for tp, ep in ((2, 1), (2, 2), (4, 2), (8, 8)):
        rank = get_model("qwen3-30b-a3b", tp, ep)
        assert rank.moe is not None and whole.moe is not None
        assert tp * rank.num_routed_expert_params == whole.num_routed_expert_params
        assert rank.moe.num_local_experts == 128 // ep
    with pytest.raises(ValueError, match="ep=3 must divide tp=4"):
        get_model("qwen3-30b-a3b", 4, 3)
    with pytest.raises(ValueError, match="no experts to split"):
        get_model("llama-3-8b", 2, 2)


def test_mla_cache_is_the_latent_and_replicated() -> None:
    # DeepSeek-V3: 61 layers x (kv_lora_rank 512 + rope 64) elements, on every GPU whatever the tp.
    for tp in (1, 8):
        assert get_model("deepseek-v3", tp).kv_bytes_per_token(2) == 61 * 576 * 2
    # GQA's would be 2 x 61 x 128 heads x 128: MLA caches 28x less per token.
    assert 2 * 61 * 128 * 128 * 2 / (61 * 576 * 2) > 28


def test_memory_holds_every_expert_and_the_pool_gets_the_rest() -> None:
    profile = load_profile("h200-qwen3-30b-a3b-tp1-analytic")
    shape = get_model("qwen3-30b-a3b")
    mem = profile.memory
    assert mem.weight_bytes == shape.num_params * 2 + rope_cache_bytes_of(shape)
    assert profile.moe is not None
    assert mem.weight_bytes > profile.moe.num_experts * profile.moe.expert_bytes  # all 128 experts resident
    left = int(mem.device_memory_bytes * mem.memory_fraction) - mem.weight_bytes - mem.activation_bytes \
        - mem.non_torch_bytes
    assert mem.kv_capacity_tokens == left // (16 * mem.kv_bytes_per_token) * 16


def rope_cache_bytes_of(shape) -> int:  # type: ignore[no-untyped-def]
    from calibration.analytic import rank_memory_shape
    from simulator.cost.dtypes import KvDtype, WeightDtype

    return rope_cache_bytes(rank_memory_shape(shape, WeightDtype.BFLOAT16, KvDtype.BFLOAT16))


def test_batch_one_decode_reads_the_active_weights() -> None:
    profile = load_profile("h200-qwen3-30b-a3b-tp1-analytic")
    shape = get_model("qwen3-30b-a3b")
    moe = profile.moe
    assert moe is not None
    dense_bytes = 2 * shape.num_params_read_per_step
    active_bytes = dense_bytes + 2 * shape.num_moe_layers * moe.experts_per_token * shape.expert_params
    all_bytes = dense_bytes + 2 * shape.num_routed_expert_params
    per_byte = profile.device_s.weight_s / dense_bytes  # seconds per byte of the weight stream
    model = CostModel(profile)
    dense = CostModel(profile.model_copy(update={"moe": None}))
    one = StepShape(1, 1, 1, 0, 0, 0.0)
    # The step's bandwidth term grows by the k active experts' bytes, not all 128.
    assert model.device_time(one) - dense.device_time(one) == pytest.approx((active_bytes - dense_bytes) * per_byte,
                                                                            rel=1e-3)
    assert moe.num_experts * moe.expert_weight_s == pytest.approx((all_bytes - dense_bytes) * per_byte, rel=1e-9)
    assert active_bytes < 0.15 * all_bytes
    reads = model._experts
    assert reads is not None and reads.read_by_busiest(256) == pytest.approx(128, abs=0.5)


def test_deepseek_v3_fits_8_h200_in_fp8_not_8_h100() -> None:
    profile = load_profile("h200-deepseek-v3-tp8-analytic")
    assert profile.dtype == "fp8" and profile.tp == 8
    hw = load_hardware()["H200"]
    assert profile.memory.weight_bytes < hw.device_memory_bytes * 0.9
    assert profile.memory.kv_capacity_tokens > 100_000
    with pytest.raises(ConfigError, match="does not fit"):
        moe_profile("H100", MoeLayout(model="deepseek-v3", tp=8, dtype="fp8"))
    with pytest.raises(ConfigError, match="does not fit"):
        analytic_profile("H200", "deepseek-v3", 8)  # bf16 weights: 1.3 TB


def test_expert_parallel_profiles_differ_only_in_the_expert_layout() -> None:
    tp, ep = (load_profile(f"h200-qwen3-30b-a3b-tp2{s}-analytic") for s in ("", "-ep2"))
    assert tp.memory == ep.memory and tp.device_s == ep.device_s
    assert tp.moe is not None and ep.moe is not None
    assert ep.moe.ep == 2 and ep.moe.expert_bytes == 2 * tp.moe.expert_bytes  # whole experts, half as many
    assert ep.moe.all_to_all_bandwidth_Bps is not None and tp.moe.all_to_all_bandwidth_Bps is None
    assert "not measured" in ep.label and ep.derived_from == "h100-llama-3-8b-tp2-fitted-published"


def test_every_shipped_moe_profile_is_generated(tmp_path) -> None:  # type: ignore[no-untyped-def]
    written, skipped = generate_shipped(tmp_path, date="2000-01-01")
    names = {p.stem for p in written}
    for layout in SHIPPED_MOE:
        suffix = f"tp{layout.tp}" + (f"-ep{layout.ep}" if layout.ep > 1 else "")
        assert f"h200-{layout.model}-{suffix}-analytic" in names
    assert any(s.startswith("H100 deepseek-v3") and "does not fit" in s for s in skipped)
