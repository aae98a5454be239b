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
from simulator.cost.profile import (
    Accelerator,
    CommModel,
    DeviceCoefficients,
    HostCoefficients,
    MemoryFigures,
    Profile,
    ProfileKind,
    Provenance,
    get_accelerator,
    load_hardware,
    profiles_dir,
)
from simulator.errors import ConfigError

DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2}
"""Dtypes an analytic profile can price: hardware.yaml holds BF16/FP16 tensor rates only."""

MEMORY_FRACTION = 0.9
"""Share of device memory the engine may use: vLLM's gpu_memory_utilization default."""

RUNTIME_RESERVE_BYTES = 1 << 30
"""CUDA context, cuBLAS workspace and CUDA-graph pool per GPU (assumption, ~1 GiB)."""

ACTIVATION_TOKENS = 8192
"""Tokens of the largest forward the activation reserve must hold (vLLM v1's max_num_batched_tokens)."""

ALLREDUCE_ALPHA_S = 8e-6
"""Latency of one small all-reduce (research §5: 5–10 µs per call; assumption until a NCCL sweep)."""

KNEE_P = 4.0
"""Smoothmax exponent of the memory/compute knee (research §4.3)."""


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
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        known = ", ".join(DTYPE_BYTES)
        raise ConfigError(f"no analytic pricing for dtype {dtype!r}; known: {known}", field="dtype") from None


def activation_reserve_bytes(shape: ModelShape, nbytes: int) -> int:
    """Runtime reserve plus the widest activations of an ACTIVATION_TOKENS forward on one rank."""
    per_token = (4 * shape.hidden_size + 3 * shape.intermediate_size) * nbytes
    return RUNTIME_RESERVE_BYTES + ACTIVATION_TOKENS * per_token


def memory_figures(hw: Accelerator, shape: ModelShape, nbytes: int, *, where: str) -> MemoryFigures:
    """KV capacity = (HBM × 0.9 − weights − activations) / KV bytes per token; a model that leaves no room
    for one KV block is a ConfigError."""
    weights = shape.num_params * nbytes
    activations = activation_reserve_bytes(shape, nbytes)
    usable = int(hw.hbm_bytes * MEMORY_FRACTION)
    kv_per_token = shape.kv_bytes_per_token(nbytes)
    free = usable - weights - activations
    if free < 16 * kv_per_token:
        raise ConfigError(
            f"{shape.name} at tp={shape.tp} does not fit: {weights / 1e9:.1f} GB of weights + "
            f"{activations / 1e9:.1f} GB of activations per GPU exceed {usable / 1e9:.1f} GB usable "
            f"({hw.hbm_bytes / 1e9:.0f} GB x {MEMORY_FRACTION}) on {hw.full_name}",
            field=where,
        )
    return MemoryFigures(
        kv_bytes_per_token=kv_per_token,
        kv_capacity_tokens=free // kv_per_token,
        weight_bytes=weights,
        device_memory_bytes=int(hw.hbm_bytes),
        memory_fraction=MEMORY_FRACTION,
        activation_bytes=activations,
    )


def device_coefficients(hw: Accelerator, shape: ModelShape, nbytes: int, eff: Efficiencies) -> DeviceCoefficients:
    """Roofline coefficients of one rank: bytes / achieved bandwidth and FLOPs / achieved rate."""
    bandwidth = hw.memory_bandwidth_Bps * eff.bandwidth
    flop_rate = hw.dense_bf16_flops * eff.flops
    params_read = shape.num_params_read_per_step
    # Logits of each sequence are written in fp32 and read back by the sampler.
    logits_bytes = 2 * 4 * shape.vocab_size
    return DeviceCoefficients(
        a0_s=shape.num_layers * eff.kernel_floor_s_per_layer,
        weight_s=params_read * nbytes / bandwidth,
        per_token_s=2.0 * params_read / flop_rate,
        knee_p=KNEE_P,
        per_ctx_token_s=shape.kv_bytes_per_token(nbytes) / (hw.memory_bandwidth_Bps * eff.kv_bandwidth),
        # QK^T and PV: 2 matmuls x 2 FLOPs per head dimension, per query head and layer.
        per_attn_pair_s=4.0 * shape.head_dim * shape.num_heads * shape.num_layers
        / (hw.dense_bf16_flops * eff.attention_flops),
        per_seq_s=logits_bytes / bandwidth,
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


def profile_name(hardware: str, model: str, tp: int) -> str:
    return f"{hardware.lower()}-{model}-tp{tp}-analytic"


def analytic_profile(
    hardware: str,
    model: str,
    tp: int = 1,
    dtype: str = "bfloat16",
    *,
    efficiencies: Efficiencies | None = None,
    table: dict[str, Accelerator] | None = None,
    date: str | None = None,
) -> Profile:
    """An analytic Profile of ``model`` at tensor parallelism ``tp`` on ``hardware``."""
    eff = efficiencies or Efficiencies()
    hw = get_accelerator(hardware, table)
    nbytes = dtype_bytes(dtype)
    try:
        shape = get_model(model, tp)
    except ValueError as err:
        raise ConfigError(str(err), field="model") from None
    memory = memory_figures(hw, shape, nbytes, where="model")
    source = (
        f"Analytic (not measured): roofline of {model} tp={tp} {dtype} on {hw.full_name} datasheet figures "
        f"(calibration/hardware.yaml); weight_s = weights read per step / (bandwidth x eff), per_token_s = "
        f"2 x params / (BF16 rate x eff), per_ctx_token_s = KV bytes per token / (bandwidth x eff), "
        f"per_attn_pair_s = 4 x d_head x H_q x layers / (BF16 rate x eff), per_seq_s = fp32 logits "
        f"write + read / bandwidth; {eff.describe()}; all-reduce alpha {ALLREDUCE_ALPHA_S * 1e6:.3g} us; "
        f"KV capacity = (HBM x {MEMORY_FRACTION} - weights - {RUNTIME_RESERVE_BYTES / 2**30:.0f} GiB runtime "
        f"- activations of {ACTIVATION_TOKENS} tokens) / KV bytes per token."
    )
    return Profile(
        name=profile_name(hardware, model, tp),
        hardware=hardware,
        model=model,
        tp=tp,
        dtype=dtype,
        kind=ProfileKind.ANALYTIC,
        derived_from=eff.derived_from,
        device_s=device_coefficients(hw, shape, nbytes, eff),
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
    )


def efficiencies_from(measured: Profile, table: dict[str, Accelerator] | None = None) -> Efficiencies:
    """The achieved fractions of peak a measured profile implies, to carry to other hardware or models."""
    if not measured.is_measured:
        raise ConfigError(f"{measured.name} is not a measured profile", field="derived_from")
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
        attention_flops=4.0 * shape.head_dim * shape.num_heads * shape.num_layers
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


def generate_shipped(out_dir: Path | None = None, *, date: str | None = None) -> tuple[list[Path], list[str]]:
    """Write every shipped (hardware, model, tp) that fits; returns (written paths, skipped reasons)."""
    out_dir = out_dir or profiles_dir()
    table = load_hardware()
    written: list[Path] = []
    skipped: list[str] = []
    for hardware in SHIPPED_HARDWARE:
        for model, tp in SHIPPED_MODELS:
            try:
                profile = analytic_profile(hardware, model, tp, table=table, date=date)
            except ConfigError as err:
                skipped.append(f"{hardware} {model} tp{tp}: {err.message}")
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
