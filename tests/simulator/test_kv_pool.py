"""vLLM's KV-pool rule: public vLLM start-up logs reproduced within 1 %, and the rule's invariants.

Every logged case is a real vLLM v0.19.0 run on one H100 80GB HBM3 node (total_memory=79.19GiB,
gpu_memory_utilization 0.95, `vllm serve` defaults: max_num_batched_tokens 8192, max_num_seqs 1024,
block 16), published with its full log by the llm-d planner's accuracy study (discussed in
https://github.com/llm-d-incubation/llm-d-planner/issues/194). The rule's constants are stated in
``simulator/cost/kv_pool.py``; nothing here is tuned per case.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration.analytic import rank_memory_shape
from calibration.engine.configs import get_model
from simulator.cost.dtypes import KvDtype, WeightDtype
from simulator.cost.kv_pool import (
    GIB,
    VLLM_V1,
    KvPoolError,
    RankMemoryShape,
    VllmSettings,
    kv_pool,
    non_torch_bytes,
    sampler_peak_bytes,
    serve_defaults,
)

LOGS = "https://github.com/llm-d-incubation/llm-d-planner/blob/d3121e059da88662db39a926a3ead964be97359b/accuracy/results/v0.19.0/logs/"
TABLE = "https://github.com/jgchn/llm-d-planner/blob/30ec05f7cab43782bdfa4f529aef70e06ff9f149/accuracy/results/v0.19.0/results_raw.csv"
H100_TOTAL_BYTES = int(79.19 * GIB)
V019 = VllmSettings(gpu_memory_utilization=0.95, max_num_batched_tokens=8192, max_num_seqs=1024, block_size=16)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedPool:
    """One vLLM start-up log: the model and engine settings, and what vLLM printed."""

    source: str
    """URL of the log (or of the table its numbers were parsed into)."""
    checkpoint: str
    """The Hugging Face checkpoint that was served."""
    model: str
    """Its shape in calibration/engine/configs.py."""
    tp: int
    dtype: WeightDtype = WeightDtype.BFLOAT16
    kv_dtype: KvDtype = KvDtype.BFLOAT16
    float32: bool = False
    """``--dtype float32``: weights, activations and KV all at 4 bytes."""
    weights_gib: float
    """'model weights take' / 'Model loading took'."""
    activation_gib: float
    """'PyTorch activation peak memory takes'."""
    non_torch_gib: float
    """'non_torch_memory takes'."""
    kv_tokens: int
    """'GPU KV cache size: N tokens'."""


LOGGED = (
    LoggedPool(source=TABLE, checkpoint="meta-llama/Llama-3.1-8B-Instruct", model="llama-3-8b", tp=1,
               weights_gib=14.99, activation_gib=1.89, non_torch_gib=0.25, kv_tokens=476_016),
    LoggedPool(source=TABLE, checkpoint="meta-llama/Llama-3.1-8B-Instruct", model="llama-3-8b", tp=2,
               weights_gib=7.51, activation_gib=1.89, non_torch_gib=2.07, kv_tokens=1_044_688),
    LoggedPool(source=TABLE, checkpoint="meta-llama/Llama-3.1-8B-Instruct", model="llama-3-8b", tp=4,
               weights_gib=3.77, activation_gib=1.89, non_torch_gib=2.13, kv_tokens=2_209_792),
    LoggedPool(source=TABLE, checkpoint="meta-llama/Llama-3.1-8B-Instruct (--kv-cache-dtype fp8)",
               model="llama-3-8b", tp=1, kv_dtype=KvDtype.FP8,
               weights_gib=14.99, activation_gib=1.89, non_torch_gib=0.25, kv_tokens=952_032),
    LoggedPool(source=LOGS + "meta-llama-llama-3---h100-80gb--tp1pp1dp1--8192-qfp8.log",
               checkpoint="meta-llama/Llama-3.1-8B-Instruct (--quantization fp8)", model="llama-3-8b", tp=1,
               dtype=WeightDtype.FP8, weights_gib=8.49, activation_gib=1.89, non_torch_gib=0.25, kv_tokens=529_248),
    LoggedPool(source=TABLE, checkpoint="RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16 (--dtype float16)",
               model="llama-3-8b", tp=1, dtype=WeightDtype.INT4, kv_dtype=KvDtype.FLOAT16,
               weights_gib=5.38, activation_gib=1.89, non_torch_gib=0.25, kv_tokens=554_704),
    LoggedPool(source=LOGS + "meta-llama-llama-3--h100-80gb--tp1pp1dp1--8192-dtf32.log",
               checkpoint="meta-llama/Llama-3.1-8B-Instruct (--dtype float32)", model="llama-3-8b", tp=1,
               float32=True, weights_gib=29.98, activation_gib=2.21, non_torch_gib=0.25, kv_tokens=175_296),
    LoggedPool(source=LOGS + "fp8dyn-llama-3-3-70b--h100-80gb--tp2pp1dp1--8192.log",
               checkpoint="RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic", model="llama-3-70b", tp=2,
               dtype=WeightDtype.FP8, weights_gib=33.88, activation_gib=1.96, non_torch_gib=2.10, kv_tokens=244_304),
    LoggedPool(source=LOGS + "fp8dyn-llama-3-3-70b--h100-80gb--tp4pp1dp1--8192.log",
               checkpoint="RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic", model="llama-3-70b", tp=4,
               dtype=WeightDtype.FP8, weights_gib=16.96, activation_gib=1.97, non_torch_gib=2.21, kv_tokens=708_992),
    LoggedPool(source=LOGS + "codellama-codellama-7b-h--h100-80gb--tp1pp1dp1--8192.log",
               checkpoint="codellama/CodeLlama-7b-hf", model="codellama-7b", tp=1,
               weights_gib=12.56, activation_gib=0.77, non_torch_gib=0.25, kv_tokens=126_256),
)


def logged_shape(case: LoggedPool) -> RankMemoryShape:
    shape = rank_memory_shape(get_model(case.model, case.tp), case.dtype, case.kv_dtype)
    if not case.float32:
        return shape
    params = get_model(case.model, case.tp).num_params
    return shape.model_copy(update={"weight_bytes": 4 * params, "activation_bytes": 4,
                                    "kv_bytes_per_token": 2 * shape.kv_bytes_per_token})


@pytest.mark.parametrize("case", LOGGED, ids=lambda c: f"{c.checkpoint}-tp{c.tp}")
def test_reproduces_logged_kv_cache_size(case: LoggedPool) -> None:
    pool = kv_pool(logged_shape(case), H100_TOTAL_BYTES, V019)
    assert pool.num_tokens == pytest.approx(case.kv_tokens, rel=0.01), pool.describe()
    assert pool.num_blocks == pytest.approx(case.kv_tokens // 16, rel=0.01)
    # Each term, not only their sum, is what vLLM logged (to its 0.01 GiB rounding, plus the spread
    # of the non-torch term across runs).
    assert pool.weight_bytes / GIB == pytest.approx(case.weights_gib, abs=0.05)
    assert pool.activation_bytes / GIB == pytest.approx(case.activation_gib, abs=0.05)
    assert pool.non_torch_bytes / GIB == pytest.approx(case.non_torch_gib, abs=0.15)


def test_logged_breakdown_reads_like_vllm() -> None:
    pool = kv_pool(logged_shape(LOGGED[0]), H100_TOTAL_BYTES, V019)
    text = pool.describe()
    assert "total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.95) = 75.23GiB" in text
    assert f"# GPU blocks: {pool.num_blocks}" in text and f"GPU KV cache size: {pool.num_tokens:,} tokens" in text
    assert pool.requested_bytes - pool.non_kv_bytes == pool.kv_bytes


def test_sampler_sees_the_full_vocabulary_at_any_tp() -> None:
    # The logged activation peak of Llama-3.1-8B is 1.89 GiB at TP 1, 2 and 4: the sampler's gathered
    # logits dominate, and they do not shrink with TP.
    ranks = [rank_memory_shape(get_model("llama-3-8b", tp), WeightDtype.BFLOAT16, KvDtype.BFLOAT16) for tp in (1, 2, 4)]
    assert len({sampler_peak_bytes(rank, V019) for rank in ranks}) == 1


def test_non_torch_grows_with_tensor_parallelism() -> None:
    assert non_torch_bytes(1) == VLLM_V1.non_torch_bytes
    assert non_torch_bytes(2) == non_torch_bytes(8) > non_torch_bytes(1)


def test_serve_defaults_follow_vllm() -> None:
    big = serve_defaults(int(79.19 * GIB), "NVIDIA H100 80GB HBM3")
    assert (big.max_num_batched_tokens, big.max_num_seqs) == (8192, 1024)
    a100 = serve_defaults(int(79.15 * GIB), "NVIDIA A100-SXM4-80GB")
    small = serve_defaults(int(44.42 * GIB), "NVIDIA L40S")
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (small.max_num_batched_tokens, small.max_num_seqs) \
        == (2048, 256)


def test_model_that_does_not_fit_is_a_clear_error() -> None:
    shape = rank_memory_shape(get_model("llama-3-70b"), WeightDtype.BFLOAT16, KvDtype.BFLOAT16)
    with pytest.raises(KvPoolError, match="no room for one KV block") as info:
        kv_pool(shape, H100_TOTAL_BYTES)
    pool = info.value.pool
    assert pool.kv_bytes < 0 and pool.num_blocks == 0
    assert "model weights take 131." in str(info.value)  # the numbers that explain it
    with pytest.raises(ValueError, match="positive"):
        kv_pool(shape, 0)


# --- properties ------------------------------------------------------------------------------------------


@st.composite
def shapes(draw: st.DrawFn) -> RankMemoryShape:
    hidden = draw(st.integers(64, 16384))
    return RankMemoryShape(
        num_layers=draw(st.integers(1, 128)),
        hidden_size=hidden,
        intermediate_size=draw(st.integers(64, 65536)),
        vocab_size=draw(st.integers(256, 262144)),
        head_dim=draw(st.sampled_from([64, 128, 256])),
        max_position=draw(st.integers(512, 131072)),
        tp=draw(st.sampled_from([1, 2, 4, 8])),
        weight_bytes=draw(st.integers(0, 200 * GIB)),
        kv_bytes_per_token=draw(st.integers(1024, 1 << 20)),
        activation_bytes=draw(st.sampled_from([2, 4])),
    )


engine_settings = st.builds(
    VllmSettings,
    gpu_memory_utilization=st.floats(0.05, 1.0),
    max_num_batched_tokens=st.integers(1, 65536),
    max_num_seqs=st.integers(1, 2048),
    block_size=st.sampled_from([1, 16, 32]),
)
device_bytes = st.integers(1 << 30, 300 * GIB)


def num_blocks(shape: RankMemoryShape, memory: int, engine: VllmSettings) -> int:
    try:
        return kv_pool(shape, memory, engine).num_blocks
    except KvPoolError as err:
        assert err.pool.num_blocks == 0
        return 0


@settings(max_examples=300, deadline=None)
@given(shapes(), engine_settings, device_bytes, device_bytes)
def test_more_memory_never_fewer_blocks(shape: RankMemoryShape, engine: VllmSettings, a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert num_blocks(shape, low, engine) <= num_blocks(shape, high, engine)


@settings(max_examples=300, deadline=None)
@given(shapes(), engine_settings, device_bytes, st.floats(0.05, 1.0), st.floats(0.05, 1.0))
def test_utilization_is_monotone(shape: RankMemoryShape, engine: VllmSettings, memory: int, u: float,
                                 v: float) -> None:
    low, high = sorted((u, v))
    at = {x: engine.model_copy(update={"gpu_memory_utilization": x}) for x in (low, high)}
    assert num_blocks(shape, memory, at[low]) <= num_blocks(shape, memory, at[high])


@settings(max_examples=300, deadline=None)
@given(shapes(), engine_settings, device_bytes)
def test_blocks_fill_what_is_left(shape: RankMemoryShape, engine: VllmSettings, memory: int) -> None:
    try:
        pool = kv_pool(shape, memory, engine)
    except KvPoolError as err:
        assert err.pool.kv_bytes < err.pool.block_bytes  # "does not fit" means not even one block
        return
    assert pool.requested_bytes - pool.non_kv_bytes == pool.kv_bytes
    assert pool.num_blocks * pool.block_bytes <= pool.kv_bytes < (pool.num_blocks + 1) * pool.block_bytes
    assert pool.num_tokens == pool.num_blocks * engine.block_size


@settings(max_examples=200, deadline=None)
@given(shapes(), engine_settings, device_bytes)
def test_halving_kv_bytes_at_least_doubles_blocks(shape: RankMemoryShape, engine: VllmSettings, memory: int) -> None:
    even = shape.model_copy(update={"kv_bytes_per_token": 2 * shape.kv_bytes_per_token})
    assert num_blocks(shape, memory, engine) >= 2 * num_blocks(even, memory, engine)
