"""Analytic profiles: step-time coefficients from datasheet figures and a model's shape, never measured.

Every coefficient is a roofline quantity divided by an assumed efficiency (or by efficiencies carried over
from a measured profile, in which case the profile says so in ``derived_from``). The assumptions are
written into each profile's ``provenance.source`` so a reader never mistakes these numbers for
measurements. Hardware figures come only from ``calibration/hardware.yaml``.

Run ``python -m calibration.analytic`` to regenerate the shipped analytic profiles.
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass, field
from pathlib import Path

from calibration import scale
from calibration.engine.configs import ModelShape, get_model
from simulator.cost import dtypes
from simulator.cost import moe as routing
from simulator.cost.dtypes import KvDtype, WeightDtype
from simulator.cost.kv_pool import KvPool, KvPoolError, RankMemoryShape, VllmSettings, kv_pool, serve_defaults
from simulator.cost.moe import Routing
from simulator.cost.profile import (
    Accelerator,
    CommModel,
    DeviceCoefficients,
    HostCoefficients,
    MemoryFigures,
    MoeCoefficients,
    Profile,
    ProfileKind,
    Provenance,
    get_accelerator,
    load_hardware,
    load_profile,
    profiles_dir,
)
from simulator.errors import ConfigError

DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2}
"""Bytes of the 16-bit dtypes activations and all-reduces run in (``dtype_bytes``). Weights and the KV
cache are priced by ``simulator.cost.dtypes``, which also knows fp8 and int4 weights and fp8 KV."""

MEMORY_FRACTION = 0.9
"""Share of device memory the engine may use: vLLM's gpu_memory_utilization default."""

ALLREDUCE_ALPHA_S = 8e-6
"""Latency of one small all-reduce (research §5: 5–10 µs per call; assumption until a NCCL sweep)."""

KNEE_P = 4.0
"""Smoothmax exponent of the memory/compute knee (research §4.3)."""

ALL_TO_ALL_EFFICIENCY = 0.765
"""Achieved / one direction of NVLink for an expert-parallel dispatch or combine: DeepEP's intranode EP8
kernels reach a 153 GB/s (dispatch) and 158 GB/s (combine) bottleneck bandwidth on H800, whose NVLink moves
200 GB/s per direction (github.com/deepseek-ai/DeepEP README, "Normal kernels with NVLink and RDMA
forwarding"; NVIDIA H800 SXM: NVLink 400 GB/s). The lower, dispatch, figure: 153 / 200."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiencies:
    """Achieved fraction of each datasheet peak, plus overheads that no datasheet states."""

    bandwidth: float = 0.8
    """Weight streaming: achieved / peak memory bandwidth."""
    flops: float = 0.6
    """Large GEMMs: achieved / peak dense BF16 rate."""
    kv_bandwidth: float = 0.8
    """Decode attention KV reads: achieved / peak memory bandwidth."""
    attention_flops: float = 0.6
    """Prefill attention: achieved / peak dense BF16 rate."""
    nvlink_allreduce: float = 1.0
    """All-reduce bus bandwidth / one direction of NVLink (nccl-tests busbw on 8×H100 ≈ 460–480 GB/s)."""
    pcie: float = 0.8
    """Achieved / one direction of the PCIe link (swap copies; all-reduce without NVLink)."""
    kernel_floor_s_per_layer: float = 8e-6
    """a0 per layer: ~8 small kernels whose ~1 µs ramp and tail the weight stream does not hide."""
    host: HostCoefficients = field(
        default_factory=lambda: HostCoefficients(h0_s=300e-6, per_seq_s=5e-6, per_token_s=20e-9)
    )
    """Host overhead per step (assumption: a vLLM-v1-like Python scheduler and input preparation)."""
    overlap_host: bool = False
    """Whether host work overlaps the device step (vLLM v1 without async scheduling: no)."""
    derived_from: str | None = None
    """The measured profile these factors came from, if any."""

    def describe(self) -> str:
        origin = f"carried over from measured profile {self.derived_from}" if self.derived_from else "assumed"
        return (
            f"efficiencies ({origin}): bandwidth {self.bandwidth:.3g}, GEMM FLOPs {self.flops:.3g}, "
            f"KV reads {self.kv_bandwidth:.3g}, attention FLOPs {self.attention_flops:.3g}, "
            f"all-reduce {self.nvlink_allreduce:.3g} of one NVLink direction (PCIe {self.pcie:.3g}), "
            f"a0 = layers x {self.kernel_floor_s_per_layer * 1e6:.3g} us; host h0 "
            f"{self.host.h0_s * 1e6:.3g} us + {self.host.per_seq_s * 1e6:.3g} us/seq + "
            f"{self.host.per_token_s * 1e9:.3g} ns/token, overlap {self.overlap_host}"
        )


def dtype_bytes(dtype: str) -> int:
    """Bytes of a 16-bit activation dtype ('bfloat16' or 'float16')."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        known = ", ".join(DTYPE_BYTES)
        raise ConfigError(f"no analytic pricing for dtype {dtype!r}; known: {known}", field="dtype") from None


def linear_params(shape: ModelShape) -> int:
    """Parameters of the decoder's linear layers on one rank: the part a weight dtype quantizes."""
    return shape.num_linear_params


def ffn_peak_width(shape: ModelShape) -> int:
    """FFN width per token at the forward's widest point on one rank (vLLM's profiling run): the dense FFN,
    or an MoE layer's k routed copies of a token (its fused-MoE gate-up and activation caches hold every
    token k times, an average k/ep of them on this GPU) plus its shared experts, whichever is wider."""
    moe = shape.moe
    if moe is None:
        return shape.intermediate_size
    moe_width = (moe.experts_per_token + moe.num_shared_experts) * moe.expert_intermediate_size // moe.ep
    return max(moe_width, shape.intermediate_size if shape.num_dense_layers else 0)


def weight_bytes(shape: ModelShape, dtype: WeightDtype = WeightDtype.BFLOAT16) -> int:
    """Parameter bytes resident on one rank: linear layers at ``dtype``, embedding, LM head and norms at 16 bits."""
    linear = linear_params(shape)
    return dtypes.weight_bytes(linear, shape.num_params - linear, dtype)


def engine_settings(hw: Accelerator) -> VllmSettings:
    """The vLLM settings an analytic profile assumes: ``vllm serve``'s defaults on this GPU."""
    return serve_defaults(hw.device_memory_bytes, hw.full_name, MEMORY_FRACTION)


def rank_memory_shape(shape: ModelShape, dtype: WeightDtype, kv_dtype: KvDtype) -> RankMemoryShape:
    """One rank of ``shape`` as the plain numbers vLLM's start-up accounting reads."""
    return RankMemoryShape(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        intermediate_size=ffn_peak_width(shape),
        vocab_size=shape.vocab_size * shape.tp,  # the sampler sees the gathered (full) vocabulary
        head_dim=shape.head_dim,
        max_position=shape.max_position,
        tp=shape.tp,
        weight_bytes=weight_bytes(shape, dtype),
        kv_bytes_per_token=shape.kv_bytes_per_token(dtypes.kv_bytes_per_element(kv_dtype)),
        activation_bytes=dtypes.ACTIVATION_BYTES,
    )


def _kv_pool(hw: Accelerator, shape: ModelShape, dtype: WeightDtype, kv_dtype: KvDtype, where: str) -> KvPool:
    try:
        return kv_pool(rank_memory_shape(shape, dtype, kv_dtype), hw.device_memory_bytes, engine_settings(hw))
    except KvPoolError as err:
        pool = err.pool
        gib = 1 << 30
        raise ConfigError(
            f"{shape.name} at tp={shape.tp} does not fit: {pool.weight_bytes / gib:.1f} GiB of {dtype} weights + "
            f"{pool.activation_bytes / gib:.1f} GiB of activations + {pool.non_torch_bytes / gib:.1f} GiB "
            f"non-torch per GPU leave {pool.kv_bytes / gib:.1f} GiB of the {pool.requested_bytes / gib:.1f} GiB "
            f"usable ({hw.device_memory_mib} MiB x {MEMORY_FRACTION}) on {hw.full_name}, less than one KV block",
            field=where,
        ) from None


def activation_reserve_bytes(
    hw: Accelerator, shape: ModelShape, dtype: WeightDtype = WeightDtype.BFLOAT16, kv_dtype: KvDtype | None = None
) -> int:
    """What vLLM keeps from the KV pool besides weights on one rank: the activation peak of its profiling
    run at ``vllm serve``'s defaults, non-torch memory and any CUDA-graph reserve (``simulator.cost.kv_pool``)."""
    pool = _kv_pool(hw, shape, dtype, kv_dtype or dtypes.default_kv_dtype(dtype), where="model")
    return pool.activation_bytes + pool.non_torch_bytes + pool.cuda_graph_bytes


def memory_figures(
    hw: Accelerator,
    shape: ModelShape,
    dtype: WeightDtype = WeightDtype.BFLOAT16,
    kv_dtype: KvDtype | None = None,
    *,
    where: str,
) -> MemoryFigures:
    """KV capacity by vLLM v1's rule from the memory the device reports; a model that leaves no room for
    one KV block is a ConfigError naming the model, tp and the numbers."""
    kv_dtype = kv_dtype or dtypes.default_kv_dtype(dtype)
    pool = _kv_pool(hw, shape, dtype, kv_dtype, where)
    return MemoryFigures(
        kv_bytes_per_token=shape.kv_bytes_per_token(dtypes.kv_bytes_per_element(kv_dtype)),
        kv_capacity_tokens=pool.num_tokens,
        weight_bytes=pool.weight_bytes,
        device_memory_bytes=pool.device_memory_bytes,
        memory_fraction=MEMORY_FRACTION,
        activation_bytes=pool.activation_bytes,
        non_torch_bytes=pool.non_torch_bytes,
        cuda_graph_bytes=pool.cuda_graph_bytes,
        linear_weight_bytes=int(linear_params(shape) * dtypes.weight_bytes_per_param(dtype)),
    )


def device_coefficients(
    hw: Accelerator,
    shape: ModelShape,
    nbytes: int,
    eff: Efficiencies,
    dtype: WeightDtype = WeightDtype.BFLOAT16,
    kv_dtype: KvDtype | None = None,
) -> DeviceCoefficients:
    """Roofline coefficients of one rank: bytes / achieved bandwidth and FLOPs / achieved rate. ``nbytes``
    is the activation dtype's size; the linear layers' weights are read and multiplied at ``dtype`` (bytes
    and GEMM rate), the LM head and norms at 16 bits, the KV cache at ``kv_dtype``. Of an MoE model these
    are the dense part's (``moe_coefficients`` prices the routed experts)."""
    kv_dtype = kv_dtype or dtypes.default_kv_dtype(dtype)
    bandwidth = hw.memory_bandwidth_Bps * eff.bandwidth
    flop_rate = hw.dense_bf16_flops * eff.flops
    params_read = shape.num_params_read_per_step
    linear = shape.num_linear_params_read_per_step
    bytes_read = dtypes.weight_bytes(linear, params_read - linear, dtype)
    # Logits of each sequence are written in fp32 and read back by the sampler.
    logits_bytes = 2 * 4 * shape.vocab_size
    # Decode attention streams each cached token's KV bytes, or, where it does more FLOPs per byte than the
    # GPU's ridge (MLA's absorbed decode), is bound by those FLOPs instead.
    kv_read_s = shape.kv_bytes_per_token(dtypes.kv_bytes_per_element(kv_dtype)) / (
        hw.memory_bandwidth_Bps * eff.kv_bandwidth)
    kv_compute_s = shape.decode_attention_flops_per_context_token() / (hw.dense_bf16_flops * eff.attention_flops)
    return DeviceCoefficients(
        a0_s=shape.num_layers * eff.kernel_floor_s_per_layer,
        weight_s=bytes_read / bandwidth,
        per_token_s=2.0 * (linear / dtypes.gemm_rate_ratio(hw, dtype) + (params_read - linear)) / flop_rate,
        knee_p=KNEE_P,
        per_ctx_token_s=max(kv_read_s, kv_compute_s),
        # QK^T and PV: 2 matmuls x 2 FLOPs per head dimension, per query head and layer.
        per_attn_pair_s=shape.attention_flops_per_pair() / (hw.dense_bf16_flops * eff.attention_flops),
        per_seq_s=logits_bytes / bandwidth,
    )


def moe_coefficients(hw: Accelerator, shape: ModelShape, eff: Efficiencies, dtype: WeightDtype,
                     nbytes: int, routing_law: Routing = Routing.UNIFORM, zipf_exponent: float = 0.0
                     ) -> MoeCoefficients | None:
    """The routed experts of one rank of ``shape`` (sharded at its tp and ep): the bytes of its share of one
    expert over every MoE layer at the weight dtype and the time to stream them, the expert GEMMs' seconds
    per token by active parameters (k/ep of the rank's experts' slices per token, on average), and at ep > 1
    the all-to-all over NVLink (or PCIe) at the achieved fraction DeepEP reports. None for a dense model."""
    moe = shape.moe
    if moe is None:
        return None
    expert_params = shape.num_moe_layers * shape.expert_params
    expert_bytes = dtypes.weight_bytes(expert_params, 0, dtype)
    active_params = moe.experts_per_token * expert_params / moe.ep
    link = (hw.nvlink_bidirectional_Bps / 2 * ALL_TO_ALL_EFFICIENCY if hw.nvlink_bidirectional_Bps is not None
            else hw.host_link_bidirectional_Bps / 2 * eff.pcie)
    return MoeCoefficients(
        num_experts=moe.num_experts,
        experts_per_token=moe.experts_per_token,
        num_moe_layers=shape.num_moe_layers,
        ep=moe.ep,
        routing=routing_law,
        zipf_exponent=zipf_exponent,
        expert_bytes=expert_bytes,
        expert_weight_s=expert_bytes / (hw.memory_bandwidth_Bps * eff.bandwidth),
        expert_per_token_s=2.0 * active_params / dtypes.gemm_rate_ratio(hw, dtype) / (hw.dense_bf16_flops * eff.flops),
        hidden_size=shape.hidden_size,
        dtype_bytes=nbytes,
        all_to_all_alpha_s=ALLREDUCE_ALPHA_S if moe.ep > 1 else 0.0,
        all_to_all_bandwidth_Bps=link if moe.ep > 1 else None,
    )


def comm_model(hw: Accelerator, shape: ModelShape, nbytes: int, eff: Efficiencies) -> CommModel | None:
    """All-reduce terms at tp > 1: NVLink when present, else PCIe through the host."""
    if shape.tp <= 1:
        return None
    if hw.nvlink_bidirectional_Bps is not None:
        bus = hw.nvlink_bidirectional_Bps / 2 * eff.nvlink_allreduce
    else:
        bus = hw.host_link_bidirectional_Bps / 2 * eff.pcie
    return scale.comm_model(shape, shape.tp, alpha_s=ALLREDUCE_ALPHA_S, bus_bandwidth_Bps=bus, dtype_bytes=nbytes)


def profile_name(hardware: str, model: str, tp: int, ep: int = 1) -> str:
    layout = f"tp{tp}" if ep == 1 else f"tp{tp}-ep{ep}"
    return f"{hardware.lower()}-{model}-{layout}-analytic"


def moe_rules(shape: ModelShape, moe: MoeCoefficients, tp: int) -> str:
    """The rules behind an MoE profile's expert terms, for its provenance."""
    fanout = routing.dispatch_fanout(moe.num_experts, moe.experts_per_token, moe.ep, tp)
    shares = routing.inclusion_probabilities(moe.num_experts, moe.experts_per_token, moe.routing, moe.zipf_exponent)
    skew = (f"zipf with exponent {moe.zipf_exponent:.3g} (load Gini {routing.gini(shares):.3f})"
            if moe.routing is Routing.ZIPF else "uniform")
    layout = ("experts tensor-parallel over all GPUs, MoE output all-reduced" if moe.ep == 1 else
              f"experts in {moe.ep} groups of {moe.num_experts // moe.ep}, each expert split over {tp // moe.ep} "
              f"GPU(s); per MoE layer a dispatch and a combine all-to-all replace the all-reduce, each GPU sending "
              f"its N/{tp} tokens to {fanout:.3g} other GPUs on average (once per destination GPU, as DeepEP) at "
              f"{ALL_TO_ALL_EFFICIENCY} of one NVLink direction (DeepEP's 153 of 200 GB/s on H800), alpha "
              f"{ALLREDUCE_ALPHA_S * 1e6:.3g} us a call (assumed as the all-reduce's)")
    return (f" Mixture of experts: {moe.num_experts} routed experts, {moe.experts_per_token} per token, in "
            f"{moe.num_moe_layers} of {shape.num_layers} layers; device_s prices the dense part (attention, "
            f"shared experts, dense layers, router, LM head); moe.expert_weight_s = one expert's bytes on a GPU "
            f"over all MoE layers / (bandwidth x eff), read R(N) times a step, R(N) the experts the busiest GPU "
            f"touches for N tokens (expected distinct experts D(N) = sum_i 1 - (1 - p_i)^N under {skew} routing; "
            f"the fullest group's share above ep 1: simulator/cost/moe.py); moe.expert_per_token_s = 2 x k active "
            f"expert params / (rate x eff) (expert GEMMs assumed as efficient as the dense ones); memory holds all "
            f"{moe.num_experts} experts; {layout}.")


def analytic_profile(
    hardware: str,
    model: str,
    tp: int = 1,
    dtype: str = "bfloat16",
    *,
    kv_dtype: str | None = None,
    ep: int = 1,
    routing_law: Routing = Routing.UNIFORM,
    zipf_exponent: float = 0.0,
    efficiencies: Efficiencies | None = None,
    table: dict[str, Accelerator] | None = None,
    date: str | None = None,
) -> Profile:
    """An analytic Profile of ``model`` at tensor parallelism ``tp`` on ``hardware``, weights in ``dtype``
    and the KV cache in ``kv_dtype`` (default: the 16-bit activation dtype, vLLM's ``auto``); of an MoE
    model with its experts in ``ep`` groups, routed by ``routing_law``."""
    eff = efficiencies or Efficiencies()
    hw = get_accelerator(hardware, table)
    weight_dtype = dtypes.parse_weight_dtype(dtype)
    kv = dtypes.parse_kv_dtype(kv_dtype) if kv_dtype is not None else dtypes.default_kv_dtype(weight_dtype)
    nbytes = dtypes.ACTIVATION_BYTES
    try:
        shape = get_model(model, tp, ep)
    except ValueError as err:
        raise ConfigError(str(err), field="model") from None
    memory = memory_figures(hw, shape, weight_dtype, kv, where="model")
    moe = moe_coefficients(hw, shape, eff, weight_dtype, nbytes, routing_law, zipf_exponent)
    settings = engine_settings(hw)
    ratio = dtypes.gemm_rate_ratio(hw, weight_dtype)
    source = (
        f"Analytic (not measured): roofline of {model} tp={tp} weights {weight_dtype}, KV {kv} on {hw.full_name} "
        f"datasheet figures (calibration/hardware.yaml); weight_s = weight bytes read per step (linear layers "
        f"at {dtypes.weight_bytes_per_param(weight_dtype):.4g} B, LM head and norms at 2 B) / (bandwidth x eff), "
        f"per_token_s = 2 x (linear params / {ratio:.3g} + other params) / (BF16 rate x eff), per_ctx_token_s = "
        f"KV bytes per token / (bandwidth x eff), per_attn_pair_s = 4 x d_head x H_q x layers / (BF16 rate x "
        f"eff), per_seq_s = fp32 logits write + read / bandwidth; {eff.describe()}; all-reduce alpha "
        f"{ALLREDUCE_ALPHA_S * 1e6:.3g} us; KV capacity = vLLM v1's start-up rule (simulator/cost/kv_pool.py): "
        f"(device memory as CUDA reports it, {hw.device_memory_mib} MiB, x {MEMORY_FRACTION} - weights - "
        f"activation peak of the profiling run at {settings.max_num_batched_tokens} tokens and "
        f"{settings.max_num_seqs} sequences - non-torch memory) // (block of {settings.block_size} tokens x "
        f"KV bytes per token)."
    )
    if moe is not None:
        source += moe_rules(shape, moe, tp)
    if shape.mla is not None:
        source += (" Multi-head latent attention: KV = layers x (kv_lora_rank + rope dim) per token, replicated on "
                   "every GPU (the latent has no heads to split); decode attention is bound by the larger of its KV "
                   "bytes / (bandwidth x eff) and its absorbed FLOPs 2 x heads x (2 kv_lora_rank + rope dim) x "
                   "layers / (BF16 rate x attention eff); prefill pairs by 2 x heads x (qk + v head dims) x layers.")
    return Profile(
        name=profile_name(hardware, model, tp, ep),
        hardware=hardware,
        model=model,
        tp=tp,
        dtype=weight_dtype.value,
        kind=ProfileKind.ANALYTIC,
        derived_from=eff.derived_from,
        device_s=device_coefficients(hw, shape, nbytes, eff, weight_dtype, kv),
        host_s=eff.host,
        overlap_host=eff.overlap_host,
        comm=comm_model(hw, shape, nbytes, eff),
        memory=memory,
        host_link_Bps=hw.host_link_bidirectional_Bps / 2 * eff.pcie,
        provenance=Provenance(
            device_name="datasheet",
            date=date or datetime.date.today().isoformat(),
            source=source,
        ),
        moe=moe,
    )


def efficiencies_from(measured: Profile, table: dict[str, Accelerator] | None = None) -> Efficiencies:
    """The achieved fractions of peak a measured (or fitted-published) profile implies, to carry to other
    hardware or models. Of a fitted-published profile it reads the token curve's summary: the time at one
    token as the weight stream (launch and per-layer fixed costs included) and the curve's last slope as
    the compute-bound rate."""
    if measured.kind is ProfileKind.ANALYTIC:
        raise ConfigError(f"{measured.name} is not a measured or fitted-published profile", field="derived_from")
    hw = get_accelerator(measured.hardware, table)
    nbytes = dtype_bytes(measured.dtype)
    shape = get_model(measured.model, measured.tp)
    dev = measured.device_s
    if min(dev.weight_s, dev.per_token_s, dev.per_ctx_token_s, dev.per_attn_pair_s) <= 0:
        raise ConfigError(
            f"{measured.name}: a zero coefficient implies no efficiency to carry over", field="device_s"
        )
    params_read = shape.num_params_read_per_step
    return Efficiencies(
        bandwidth=params_read * nbytes / (dev.weight_s * hw.memory_bandwidth_Bps),
        flops=2.0 * params_read / (dev.per_token_s * hw.dense_bf16_flops),
        kv_bandwidth=shape.kv_bytes_per_token(nbytes) / (dev.per_ctx_token_s * hw.memory_bandwidth_Bps),
        attention_flops=shape.attention_flops_per_pair()
        / (dev.per_attn_pair_s * hw.dense_bf16_flops),
        kernel_floor_s_per_layer=dev.a0_s / shape.num_layers,
        host=measured.host_s,
        overlap_host=measured.overlap_host,
        derived_from=measured.name,
    )


SHIPPED_MODELS: tuple[tuple[str, int], ...] = (
    ("llama-3-8b", 1),
    ("llama-3-70b", 4),
    ("llama-3-70b", 8),
    ("llama-3-405b", 8),
)
SHIPPED_HARDWARE: tuple[str, ...] = ("H100", "H200", "A100", "L40S", "B200")


DERIVE_FROM: dict[str, str] = {"H200": "H100", "B200": "H100", "L40S": "H100"}
"""Accelerators without published measurements, and the fitted one whose efficiencies they carry: the
H100 for all three (the H200 is the same Hopper die with faster memory; the B200 and the L40S are nearer
to it in generation than to the A100). The carried fractions of peak are an assumption, and each such
profile says it is analytic with the source named."""


def derived_profile(hardware: str, model: str, tp: int, *, table: dict[str, Accelerator] | None = None,
                    date: str | None = None) -> Profile:
    """An analytic profile of ``hardware`` with the efficiencies (and host term) of the nearest fitted
    profile of the same model and TP; its measured all-reduce curve too where the NVLink is the same."""
    table = table if table is not None else load_hardware()
    source_hw = DERIVE_FROM.get(hardware.upper())
    if source_hw is None:
        return analytic_profile(hardware, model, tp, table=table, date=date)
    source_name = f"{source_hw.lower()}-{model}-tp{tp}-fitted-published"
    try:
        source = load_profile(source_name)
    except ConfigError:
        return analytic_profile(hardware, model, tp, table=table, date=date)
    profile = analytic_profile(hardware, model, tp, table=table, date=date,
                               efficiencies=efficiencies_from(source, table))
    hw, origin = get_accelerator(hardware, table), get_accelerator(source_hw, table)
    if source.comm is not None and source.comm.curve is not None and hw.nvlink_bidirectional_Bps is not None \
            and hw.nvlink_bidirectional_Bps == origin.nvlink_bidirectional_Bps:
        note = (f" All-reduce: the measured curve of {source_name} ({source.comm.topology}), the same NVLink "
                f"bandwidth as {hw.full_name}.")
        profile = profile.model_copy(update={
            "comm": source.comm,
            "provenance": profile.provenance.model_copy(update={"source": profile.provenance.source + note}),
        })
    return profile


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayout:
    """One shipped mixture-of-experts profile: the model, its GPUs and how its experts are laid out on them."""

    model: str
    """Catalogue name (calibration/engine/configs.py)."""
    tp: int
    """GPUs per replica: attention tensor-parallel over all of them."""
    ep: int = 1
    """Expert groups (1: every expert split over all tp GPUs)."""
    dtype: str = "bfloat16"
    """Weight dtype the model is served in (DeepSeek-V3 ships its checkpoint in fp8)."""


SHIPPED_MOE: tuple[MoeLayout, ...] = (
    MoeLayout(model="mixtral-8x7b", tp=2),
    MoeLayout(model="mixtral-8x7b", tp=2, ep=2),
    MoeLayout(model="qwen3-30b-a3b", tp=1),
    MoeLayout(model="qwen3-30b-a3b", tp=2),
    MoeLayout(model="qwen3-30b-a3b", tp=2, ep=2),
    MoeLayout(model="deepseek-v3", tp=8, dtype="fp8"),
    MoeLayout(model="deepseek-v3", tp=8, ep=8, dtype="fp8"),
)
"""The MoE profiles shipped for each of ``SHIPPED_MOE_HARDWARE`` where the model fits."""

SHIPPED_MOE_HARDWARE: tuple[str, ...] = ("H100", "H200")

MOE_EFFICIENCIES_FROM: dict[str, str] = {
    "mixtral-8x7b": "llama-3-8b",
    "qwen3-30b-a3b": "llama-3-8b",
    "deepseek-v3": "llama-3-70b",
}
"""No MoE model has published per-operator timings (Vidur's profiles are all dense), so an MoE profile
carries the efficiencies and host term of the H100 fitted-published profile of a dense model at the same
TP: Llama-3-8B for Mixtral (the same attention and hidden size) and Qwen3-30B-A3B (the nearest small
model), Llama-3-70B for DeepSeek-V3 (the largest GEMMs measured). An assumption the profile names."""


def moe_profile(hardware: str, layout: MoeLayout, *, table: dict[str, Accelerator] | None = None,
                date: str | None = None) -> Profile:
    """An analytic MoE profile with the efficiencies of ``MOE_EFFICIENCIES_FROM``'s fitted H100 profile
    (assumed ones when that profile is missing)."""
    table = table if table is not None else load_hardware()
    dense = MOE_EFFICIENCIES_FROM.get(layout.model)
    eff = None
    if dense is not None:
        try:
            eff = efficiencies_from(load_profile(f"h100-{dense}-tp{layout.tp}-fitted-published"), table)
        except ConfigError:
            eff = None
    return analytic_profile(hardware, layout.model, layout.tp, layout.dtype, ep=layout.ep, efficiencies=eff,
                            table=table, date=date)


def generate_shipped(out_dir: Path | None = None, *, date: str | None = None) -> tuple[list[Path], list[str]]:
    """Write every shipped (hardware, model, tp) that fits; returns (written paths, skipped reasons). The
    H100 and A100 have fitted-published profiles (``calibration.published.ship``), written first."""
    out_dir = out_dir or profiles_dir()
    table = load_hardware()
    written: list[Path] = []
    skipped: list[str] = []
    for hardware in SHIPPED_HARDWARE:
        for model, tp in SHIPPED_MODELS:
            try:
                profile = derived_profile(hardware, model, tp, table=table, date=date)
            except ConfigError as err:
                skipped.append(f"{hardware} {model} tp{tp}: {err.message}")
                continue
            written.append(profile.save(out_dir / f"{profile.name}.yaml"))
    for hardware in SHIPPED_MOE_HARDWARE:
        for layout in SHIPPED_MOE:
            try:
                profile = moe_profile(hardware, layout, table=table, date=date)
            except ConfigError as err:
                skipped.append(f"{hardware} {layout.model} tp{layout.tp} ep{layout.ep}: {err.message}")
                continue
            written.append(profile.save(out_dir / f"{profile.name}.yaml"))
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="(Re)generate the shipped analytic profiles.")
    parser.add_argument("--out", type=Path, default=None, help="folder (default: calibration/profiles)")
    parser.add_argument("--date", default=None, help="provenance date (default: today)")
    args = parser.parse_args(argv)
    written, skipped = generate_shipped(args.out, date=args.date)
    for path in written:
        print(f"wrote {path}")
    for reason in skipped:
        print(f"skipped {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
