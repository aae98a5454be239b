"""Profile: the measured (or analytic) cost model of one (hardware, model, tp, dtype), as a YAML contract.

Calibration writes profiles with these models; the simulator reads them. This module lives in the
simulator package because dependencies point one way (calibration may import the simulator, never the
reverse). Shipped profiles are data files in ``calibration/profiles/``, found by path, not by import.

It must never import ``calibration`` or torch. Loading errors become one ``ConfigError`` naming the file
and the field.
"""


import functools
import types
import typing
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from simulator import yaml_text
from simulator.cost.curve import PiecewiseLinear
from simulator.cost.moe import Routing
from simulator.errors import ConfigError, did_you_mean

SCHEMA_VERSION: Literal[1] = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ProfileKind(StrEnum):
    MEASURED = "measured"
    """Coefficients fitted to step timings of the real engine on the named hardware."""
    ANALYTIC = "analytic"
    """Coefficients derived from datasheet figures and assumed efficiencies; never measured."""
    FITTED_PUBLISHED = "fitted-published"
    """Fitted to published GPU measurements of other people's runs (per-operator and collective timings),
    composed into whole steps by stated rules; ``provenance.sources`` lists the files."""


FLEETSIM_ENGINE = "fleetsim"
"""``Profile.measured_on`` of a profile measured on this project's own engine (``fleetsim calibrate``)."""


MAX_STEP_TERM_S = 3600.0
"""No term of one step's time is as much as an hour: a profile's device times above it are refused (and a
term of 1e308 s overflowed the cost model's arithmetic)."""


class DeviceCoefficients(_Frozen):
    """Device (GPU) time of one step: research §4.3,
    ``a0 + smoothmax(W, f·N) + m·[N > 1] + k·Σctx + q·Σpairs + s·B``, at least ``eager_floor_s`` for a
    step that runs without a CUDA graph."""

    a0_s: float = Field(ge=0, le=MAX_STEP_TERM_S)
    """Fixed time of every non-empty step, seconds (kernels whose cost does not scale with the batch)."""
    weight_s: float = Field(ge=0, le=MAX_STEP_TERM_S)
    """W_eff: flat weight-read time, seconds (weight bytes / achieved bandwidth); the floor of small steps."""
    per_token_s: float = Field(ge=0, le=MAX_STEP_TERM_S)
    """f: seconds per new token once GEMMs are compute-bound (≈ 2·params / achieved FLOP rate)."""
    knee_p: float = Field(default=4.0, gt=0, le=64)
    """Smoothmax exponent p in (W^p + (f·N)^p)^(1/p); larger is a sharper memory/compute knee."""
    per_ctx_token_s: float = Field(ge=0, le=MAX_STEP_TERM_S)
    """k: seconds per context token read by decode attention (KV bytes per token / bandwidth)."""
    per_attn_pair_s: float = Field(ge=0, le=MAX_STEP_TERM_S)
    """q: seconds per causal attention pair of a prefill chunk (4·d_head·H_q·layers / FLOP rate)."""
    per_seq_s: float = Field(ge=0, le=MAX_STEP_TERM_S)
    """s: seconds per sequence in the step (sampling, logits, per-sequence metadata)."""
    multi_token_s: float = Field(default=0.0, ge=0, le=MAX_STEP_TERM_S)
    """m: extra fixed seconds of a step that runs more than one new token. On CPU a one-token step's
    matmuls run as matrix-vector kernels, while two or more tokens switch to matrix-matrix kernels that
    pack the weights first (measured on the small model: batch 1 decode ~12 ms, batch 2 ~20 ms, then
    ~2.5 ms per extra sequence). 0 (no such step) for GPU and analytic profiles."""
    eager_floor_s: float = Field(default=0.0, ge=0, le=MAX_STEP_TERM_S)
    """The least device time of a step the engine cannot replay as a CUDA graph (a profile with
    ``cuda_graph_batch_sizes``): one with prefill tokens, a row of more than one new token, or more rows
    than the largest captured batch. Such a step launches every kernel from the host one by one, and the
    device waits on the launches unless its own work takes longer: ``max(eager_floor_s, T)``. Measured
    on the H200 with this project's engine (32 layers of Llama-3-8B, launched from Python): 21-51 ms
    for prefill chunks of 16-512 tokens that the formula prices at 8-22 ms, while graph-replayed decode
    steps of any batch follow it within a few per cent. 0 (no floor) without CUDA graphs."""
    token_curve: PiecewiseLinear | None = None
    """Device seconds of everything in a step that scales with its N new tokens (every layer's GEMMs,
    norms, activations, RoPE, the embedding), by N. When set it prices the step in place of
    ``a0 + smoothmax(W, f·N) + m·[N > 1]``: GEMM efficiency that climbs with the rows of the matrix and
    per-layer fixed costs that do not shrink with TP are in its knots. a0_s, weight_s and per_token_s
    then only summarise it (0, the curve at one token, its last slope) for reading effective rates."""
    seq_curve: PiecewiseLinear | None = None
    """Device seconds that scale with the B sequences of a step (the LM head over the last token of each,
    logits, sampling), by B. When set it replaces ``s·B`` (per_seq_s then only summarises it)."""


class HostCoefficients(_Frozen):
    """Host (CPU) overhead of one step: ``h0 + h1·B + h2·N``, kept apart from device time because it is
    what differs between engines and between CPU and GPU."""

    h0_s: float = Field(default=0.0, ge=0)
    """Fixed host seconds per step (schedule, input preparation, launch, sync)."""
    per_seq_s: float = Field(default=0.0, ge=0)
    """Host seconds per sequence in the step."""
    per_token_s: float = Field(default=0.0, ge=0)
    """Host seconds per new token in the step."""
    engine: str | None = None
    """The serving engine (and mode) these figures are for, e.g. 'vllm-v1-async'; None = this engine."""
    source: str | None = None
    """Where the figures come from (measured cycle − device time, or the published figures cited)."""


class CommModel(_Frozen):
    """Tensor-parallel all-reduce cost, added to device time: per call the measured ``curve`` of seconds
    by message bytes when there is one, else ``α + 2(p−1)/p · bytes / BW``."""

    alpha_s: float = Field(ge=0)
    """Latency of one all-reduce call, seconds."""
    bus_bandwidth_Bps: float = Field(gt=0)
    """All-reduce bus bandwidth, bytes/s (nccl-tests busbw convention)."""
    num_allreduce_per_layer: int = Field(default=2, ge=0)
    """All-reduces per decoder layer (Megatron: one after attention, one after the MLP)."""
    num_layers: int = Field(ge=1)
    """Decoder layers of the full model."""
    hidden_size: int = Field(ge=1)
    """Elements per token in each all-reduce (the model's hidden size)."""
    dtype_bytes: int = Field(default=2, ge=1)
    """Bytes per element of the all-reduced activations (2 for bf16)."""
    curve: PiecewiseLinear | None = None
    """Measured seconds of one all-reduce by message bytes (x) for this topology and rank count; when set
    it prices each call and alpha_s / bus_bandwidth_Bps only summarise it (an α–β fit to the curve)."""
    topology: str | None = None
    """Where the curve was measured (e.g. 'a100_dgx': NVSwitch, all ranks in one node)."""

    def bytes_per_token(self) -> int:
        """Bytes of one all-reduce per new token of the step (the hidden state of that token)."""
        return self.hidden_size * self.dtype_bytes

    def calls_per_step(self) -> int:
        """All-reduce calls of one forward over the whole model."""
        return self.num_allreduce_per_layer * self.num_layers


class MoeCoefficients(_Frozen):
    """The routed experts of a mixture-of-experts model: what a step reads and moves beyond the dense part.

    ``device_s`` then prices the dense part only (attention, shared experts, leading dense layers, router, LM
    head), and device time adds ``smoothmax(expert_weight_s·R(N), expert_per_token_s·N)`` with the same knee:
    R(N) the experts the busiest GPU reads for the step's N new tokens (``simulator.cost.moe``: the expected
    distinct experts D(N) at ep 1, the fullest of the ep groups above it). With ep > 1 each MoE layer trades
    its all-reduce for an all-to-all dispatch and combine of every token to the GPUs holding its experts."""

    num_experts: int = Field(ge=1)
    """E: routed experts in every MoE layer (the whole model's, not one GPU's)."""
    experts_per_token: int = Field(ge=1)
    """k: routed experts each token is sent to in every MoE layer (at most num_experts)."""
    num_moe_layers: int = Field(ge=1)
    """Decoder layers with routed experts (the rest are dense, e.g. DeepSeek-V3's first 3 of 61)."""
    ep: int = Field(default=1, ge=1)
    """Expert-parallel degree: the experts split into ep groups of E/ep, each group's experts tensor-parallel
    over tp/ep GPUs. 1 = every expert split over all tp GPUs (plain TP). Divides num_experts and tp."""
    routing: Routing = Routing.UNIFORM
    """Distribution of the router's choices: uniform, or zipf (popularity ∝ rank^-zipf_exponent)."""
    zipf_exponent: float = Field(default=0.0, ge=0)
    """Exponent s of the zipf routing; 0 with uniform routing."""
    expert_bytes: int = Field(ge=0)
    """Bytes one GPU reads of one routed expert over all MoE layers: its share (1/(tp/ep)) of the expert's
    weights in every MoE layer, at the weight dtype."""
    expert_weight_s: float = Field(ge=0)
    """Seconds one GPU takes to stream ``expert_bytes`` (expert_bytes / achieved bandwidth)."""
    expert_per_token_s: float = Field(ge=0)
    """Seconds of routed-expert GEMMs per new token on one GPU once compute-bound (2·k·expert params / tp /
    achieved FLOP rate): compute counts active parameters only."""
    hidden_size: int = Field(ge=1)
    """Elements of a token's hidden state in a dispatch or combine (the model's hidden size)."""
    dtype_bytes: int = Field(default=2, ge=1)
    """Bytes per element of dispatched activations (2: bf16)."""
    all_to_all_alpha_s: float = Field(default=0.0, ge=0)
    """Latency of one all-to-all call (dispatch or combine), seconds; used at ep > 1."""
    all_to_all_bandwidth_Bps: float | None = Field(default=None, gt=0)
    """Bytes/s one GPU sends in an all-to-all (one direction of its link x achieved fraction); needed at ep > 1."""

    @field_validator("experts_per_token")
    @classmethod
    def _k_within_experts(cls, value: int, info: ValidationInfo) -> int:
        experts = info.data.get("num_experts")
        if experts is not None and value > experts:
            raise ValueError(f"experts_per_token {value} exceeds num_experts {experts}")
        return value

    @field_validator("ep")
    @classmethod
    def _ep_splits_experts(cls, value: int, info: ValidationInfo) -> int:
        experts = info.data.get("num_experts")
        if experts is not None and experts % value:
            raise ValueError(f"ep {value} does not divide num_experts {experts}")
        return value

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.routing is Routing.UNIFORM and self.zipf_exponent != 0.0:
            raise ValueError("zipf_exponent applies to routing zipf only")
        if self.ep > 1 and self.all_to_all_bandwidth_Bps is None:
            raise ValueError(f"ep {self.ep} needs all_to_all_bandwidth_Bps to price dispatch and combine")
        return self


class StreamingFigures(_Frozen):
    """What the path from the engine to an HTTP client adds, as measured at a client (``fleetsim calibrate
    --endpoint``): a scenario takes them with ``network.latency_ms: profile`` and ``network.flush_interval_ms:
    profile``."""

    latency_ms: float = Field(ge=0)
    """One-way: HTTP handling, the event loop and SSE framing on top of the engine's step, per token seen."""
    flush_interval_ms: float = Field(default=0.0, ge=0)
    """A buffering proxy in between that forwards what it holds every this many ms (0: none, every chunk
    passes at once)."""
    tokens_per_chunk: float = Field(default=1.0, ge=1)
    """Mean tokens per SSE event the client received (1: one event per token)."""
    source: str | None = None
    """Where the figures were measured (the endpoint, the date)."""


class MemoryFigures(_Frozen):
    """Per-GPU memory: what sizes the KV pool of one replica. The KV pool is what the engine's start-up
    accounting leaves: device memory · memory_fraction − weights − activations − non-torch − CUDA graphs
    (vLLM v1's rule; ``simulator.cost.kv_pool`` states it for analytic profiles)."""

    kv_bytes_per_token: int = Field(gt=0)
    """KV cache bytes one token occupies on one GPU (2 · layers · KV heads per rank · head dim · KV dtype)."""
    kv_capacity_tokens: int = Field(ge=0)
    """KV tokens one replica holds: as measured on the engine, or derived by vLLM's rule, whole blocks
    ((device memory · memory_fraction − weights − activations − non-torch − graphs) // block bytes · block size)."""
    weight_bytes: int = Field(ge=0)
    """Model weight bytes resident on one GPU, as the engine counts them (parameters at their dtype)."""
    device_memory_bytes: int = Field(gt=0)
    """Memory of one GPU as the device reports it to CUDA (torch.cuda.mem_get_info total), bytes: what vLLM
    multiplies by memory_fraction. Not the datasheet's decimal GB (H100: 79.19 GiB = 85.0e9, not 80e9)."""
    memory_fraction: float = Field(default=0.9, gt=0, le=1)
    """Fraction of device memory the engine may use (vLLM's gpu_memory_utilization, default 0.9)."""
    activation_bytes: int = Field(default=0, ge=0)
    """Peak activation bytes of the engine's profiling forward (measured: everything PyTorch allocated
    besides weights and KV, so workspaces too)."""
    non_torch_bytes: int = Field(default=0, ge=0)
    """Memory outside PyTorch's allocator kept from the pool (cuBLAS workspaces, NCCL and all-reduce
    buffers); 0 where a measured capacity already accounts for it."""
    cuda_graph_bytes: int = Field(default=0, ge=0)
    """CUDA-graph memory kept from the pool; 0 where the engine captures graphs after sizing it (vLLM v1)."""
    linear_weight_bytes: int | None = Field(default=None, ge=0)
    """Bytes of the decoder's linear layers among ``weight_bytes``: the part a quantized checkpoint
    shrinks (embedding, LM head and norms stay 16-bit). None when unknown: then all weights count."""


class ValidRange(_Frozen):
    """The largest shapes in the profiling grid: outside them the profile extrapolates."""

    max_batch: int = Field(ge=1)
    """Largest number of sequences in one profiled step."""
    max_context: int = Field(ge=1)
    """Longest context (tokens) of one profiled sequence."""
    max_chunk: int = Field(ge=1)
    """Largest prefill chunk (tokens) profiled."""


class FitError(_Frozen):
    """Held-out error of the fit (k-fold over the grid points)."""

    mape: float = Field(ge=0)
    """Mean absolute percentage error on held-out points, as a fraction (0.03 = 3 %)."""
    max_error: float = Field(ge=0)
    """Largest relative error on a held-out point, as a fraction."""
    r2: float
    """Coefficient of determination of held-out predictions against observations."""
    num_points: int = Field(ge=1)
    """Grid points fitted."""
    num_folds: int = Field(ge=1)
    """Folds of the cross-validation."""


class SourceFile(_Frozen):
    """One file a profile's numbers were read from."""

    path: str
    """The file, relative to the data folder it was read from."""
    sha256: str
    """sha256 of the file's bytes when it was read."""
    rows_used: int = Field(ge=0)
    """Rows of the file that went into the profile."""


class Provenance(_Frozen):
    """Where the numbers came from."""

    device_name: str
    """Device the timings were taken on (e.g. 'NVIDIA H200'), or 'datasheet' for analytic profiles."""
    library_versions: dict[str, str] = Field(default_factory=dict)
    """Versions of torch, triton, CUDA and the like used to measure."""
    date: str
    """ISO date the profile was produced."""
    git_revision: str | None = None
    """fleetsim git revision that produced it, if known."""
    raw_timings_sha256: str | None = None
    """sha256 of the raw timings file the fit read (None for analytic profiles)."""
    source: str
    """Free text: how the numbers were obtained, and every assumption behind them."""
    sources: tuple[SourceFile, ...] = ()
    """For a fitted-published profile: every file read, with its sha256 and the rows used."""
    rules: tuple[str, ...] = ()
    """For a fitted-published profile: the rule behind each term that no file measured directly."""


class Profile(_Frozen):
    """Cost model of one replica of one model on one kind of hardware."""

    schema_version: Literal[1] = SCHEMA_VERSION
    """Version of this schema; bumped on incompatible changes."""
    name: str
    """Identifier, by convention the file stem: '{hardware}-{model}-tp{tp}-{kind}'."""
    hardware: str
    """Accelerator name as in calibration/hardware.yaml (e.g. 'H200')."""
    model: str
    """Model name as in calibration/engine/configs.py (e.g. 'llama-3-8b')."""
    tp: int = Field(ge=1)
    """Tensor-parallel degree: GPUs per replica."""
    dtype: str = "bfloat16"
    """Weight and KV dtype."""
    kind: ProfileKind
    """measured (fitted to engine timings) or analytic (datasheet + assumptions)."""
    derived_from: str | None = None
    """For an analytic profile: the measured or fitted-published profile whose efficiency factors it
    carries over."""
    device_s: DeviceCoefficients
    """Device-time coefficients."""
    host_s: HostCoefficients = HostCoefficients()
    """Host-overhead coefficients."""
    overlap_host: bool = False
    """True when host work overlaps the device step (step = max(device, host)); else they add."""
    comm: CommModel | None = None
    """All-reduce terms added to device time; None at tp 1 or when the coefficients already include them."""
    memory: MemoryFigures
    """Per-GPU memory figures."""
    host_link_Bps: float = Field(gt=0)
    """Device↔host bandwidth per direction, bytes/s: prices swap preemption."""
    cuda_graph_batch_sizes: tuple[int, ...] = ()
    """Batch buckets the engine pads decode-only steps to (CUDA graphs); empty = no padding."""
    valid_range: ValidRange | None = None
    """Largest profiled shapes (None for analytic profiles)."""
    fit_error: FitError | None = None
    """Held-out fit error (None for analytic profiles)."""
    provenance: Provenance
    """Origin of the numbers."""
    kv_dtype: str | None = None
    """KV cache dtype when it differs from ``dtype`` (e.g. 'fp8' beside bfloat16 weights)."""
    repriced: str | None = None
    """Set when a scenario asked for other data types than the profile was made for: what was repriced
    and by which rule (``simulator.cost.reprice``)."""
    moe: MoeCoefficients | None = None
    """The routed experts of a mixture-of-experts model; None for a dense model (today's form, unchanged)."""
    streaming: StreamingFigures | None = None
    """The client's view of a served endpoint (None: not measured; a scenario gives its own network figures)."""
    measured_on: str | None = None
    """The engine whose steps a measured profile timed, where its figures are that engine's own: 'fleetsim',
    this project's engine (its Python host loop and kernel launches: on the H200, 36 ms for a prefill step
    that a serving engine's compiled graphs run in a few). Such a profile prices that engine, for validating
    the simulator against it: a scenario gets it by name (``fleet.profile``), or when no other shipped
    profile has its hardware, model and tp. None: a serving engine's, or not engine-specific."""

    @model_validator(mode="after")
    def _check_kind(self) -> Self:
        if self.derived_from is not None and self.kind is not ProfileKind.ANALYTIC:
            raise ValueError("derived_from is only meaningful for an analytic profile")
        if any(b < 1 for b in self.cuda_graph_batch_sizes) or list(self.cuda_graph_batch_sizes) != sorted(
            set(self.cuda_graph_batch_sizes)
        ):
            raise ValueError("cuda_graph_batch_sizes must be positive and strictly increasing")
        if self.device_s.eager_floor_s and not self.cuda_graph_batch_sizes:
            raise ValueError("device_s.eager_floor_s is the floor of steps run without a CUDA graph: it needs "
                             "cuda_graph_batch_sizes (without graphs every step is such a step, and a0_s holds it)")
        if self.moe is not None:
            self._check_moe(self.moe)
        return self

    def _check_moe(self, moe: MoeCoefficients) -> None:
        if self.tp % moe.ep:
            raise ValueError(f"moe.ep {moe.ep} does not divide tp {self.tp}: an expert group spans whole GPUs")
        dev = self.device_s
        if dev.token_curve is not None or dev.seq_curve is not None or (self.comm and self.comm.curve):
            raise ValueError("moe: expert reads are priced in the analytic form; a measured curve would already "
                             "hold the routing it was measured with (no MoE curve exists yet)")
        if self.comm is not None and moe.num_moe_layers > self.comm.num_layers:
            raise ValueError(f"moe.num_moe_layers {moe.num_moe_layers} exceeds the model's {self.comm.num_layers} "
                             "layers (comm.num_layers)")

    @property
    def is_measured(self) -> bool:
        return self.kind is ProfileKind.MEASURED

    @property
    def label(self) -> str:
        """How the profile is shown to users: which kind it is and where its numbers come from; an
        analytic profile always says it was not measured."""
        repriced = f"; repriced for {self.repriced_dtypes}" if self.repriced else ""
        if self.is_measured:
            return f"{self.name} (measured on {self.provenance.device_name}{repriced})"
        if self.kind is ProfileKind.FITTED_PUBLISHED:
            return (f"{self.name} (fitted-published: {self.provenance.device_name} timings published by "
                    f"others{repriced})")
        if self.derived_from:
            return f"{self.name} (analytic, not measured; efficiencies from {self.derived_from}{repriced})"
        return f"{self.name} (analytic, not measured{repriced})"

    @property
    def repriced_dtypes(self) -> str:
        return f"{self.dtype} weights, {self.kv_dtype or self.dtype} KV"

    def kv_capacity_tokens(self, memory_fraction: float | None = None) -> int:
        """KV tokens of one replica; at another memory fraction, re-derived from the memory figures."""
        mem = self.memory
        if memory_fraction is None or memory_fraction == mem.memory_fraction:
            return mem.kv_capacity_tokens
        # Scale from the stated capacity so a measured capacity stays the anchor: the extra (or missing)
        # memory is the only thing that changes.
        delta_bytes = (memory_fraction - mem.memory_fraction) * mem.device_memory_bytes
        return max(0, mem.kv_capacity_tokens + int(delta_bytes // mem.kv_bytes_per_token))

    def kv_capacity_blocks(self, block_size: int, memory_fraction: float | None = None) -> int:
        """KV blocks of ``block_size`` tokens one replica holds."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        return self.kv_capacity_tokens(memory_fraction) // block_size

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, width=110)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml())
        return path


# ---------------------------------------------------------------------------------------------------------
# Hardware datasheet figures (calibration/hardware.yaml). The schema lives here so the simulator can read
# prices and memory sizes without importing calibration.


class Accelerator(_Frozen):
    """Datasheet figures of one accelerator; every figure names its source in ``sources``."""

    full_name: str
    """Vendor product name (form factor and memory size included)."""
    hbm_bytes: float = Field(gt=0)
    """Device memory, bytes (decimal, as the datasheet states it)."""
    device_memory_mib: int = Field(gt=0)
    """Total device memory as the device reports it to CUDA (cudaMemGetInfo, torch.cuda.mem_get_info()[1]),
    MiB: what vLLM sizes its KV pool from. Not the datasheet's decimal GB (H100 "80GB": 81,091 MiB =
    85.0e9 bytes) and a little below nvidia-smi's total; it moves by a few MiB with driver and ECC setting."""
    memory_bandwidth_Bps: float = Field(gt=0)
    """Peak device-memory bandwidth, bytes/s."""
    dense_bf16_flops: float = Field(gt=0)
    """Peak dense (no sparsity) BF16 tensor-core rate, FLOP/s."""
    dense_fp8_flops: float | None = Field(default=None, gt=0)
    """Peak dense FP8 (E4M3) tensor-core rate, FLOP/s; None = no FP8 tensor cores (FP8 runs weight-only)."""
    dense_int8_ops: float | None = Field(default=None, gt=0)
    """Peak dense INT8 tensor-core rate, operations/s; None = not offered."""
    nvlink_bidirectional_Bps: float | None = Field(default=None, gt=0)
    """GPU-to-GPU NVLink bandwidth per GPU, both directions together, bytes/s; None = no NVLink."""
    host_link_bidirectional_Bps: float = Field(gt=0)
    """Host link (PCIe) bandwidth per GPU, both directions together, bytes/s."""
    price_usd_per_gpu_hour: float = Field(gt=0)
    """Typical public on-demand price of one GPU for one hour, USD."""
    sources: dict[str, str]
    """Source of each figure above, keyed by field name."""

    @property
    def device_memory_bytes(self) -> int:
        """``device_memory_mib`` in bytes."""
        return self.device_memory_mib << 20

    @model_validator(mode="after")
    def _every_figure_sourced(self) -> Self:
        figures = [n for n in type(self).model_fields if n not in ("full_name", "sources")]
        missing = [n for n in figures if n not in self.sources]
        if missing:
            raise ValueError(f"figures without a source: {', '.join(missing)}")
        return self


class HardwareTable(_Frozen):
    """The contents of calibration/hardware.yaml."""

    schema_version: Literal[1] = 1
    """Version of this schema."""
    accelerators: dict[str, Accelerator]
    """Accelerators by short name (e.g. 'H200')."""


def hardware_path() -> Path:
    """Where the datasheet table lives (a data file of the calibration package, found by path)."""
    import simulator

    return Path(simulator.__file__).resolve().parent.parent / "calibration" / "hardware.yaml"


_HARDWARE_TABLES: dict[tuple[Path, int, int], dict[str, Accelerator]] = {}
"""Tables read, by (path, mtime in ns, size): a run looks hardware up several times (profile, KV pool, price)
and parsing the YAML each time cost more than the 10-request simulation; an edited file is read again."""


def load_hardware(path: str | Path | None = None) -> dict[str, Accelerator]:
    """All accelerators of the datasheet table, by short name (a fresh dict; the accelerators are frozen)."""
    path = Path(path) if path is not None else hardware_path()
    try:
        stat = path.stat()
        key = (path, stat.st_mtime_ns, stat.st_size)
        if key in _HARDWARE_TABLES:
            return dict(_HARDWARE_TABLES[key])
        data = yaml_text.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read hardware table: {err}", file=path) from None
    try:
        table = dict(HardwareTable.model_validate(data).accelerators)
    except ValidationError as err:
        raise config_error_from_validation(err, HardwareTable, file=path) from None
    _HARDWARE_TABLES[key] = table
    return dict(table)


def get_accelerator(name: str, table: dict[str, Accelerator] | None = None) -> Accelerator:
    """One accelerator by short name (any case); an unknown name is a ConfigError with a suggestion."""
    table = table if table is not None else load_hardware()
    if name in table:
        return table[name]
    # Profile file names spell hardware in lower case ('h200-...'); accept either spelling.
    folded = {key.lower(): value for key, value in table.items()}
    if name.lower() in folded:
        return folded[name.lower()]
    known = list(table)
    raise ConfigError(
        f"unknown hardware {name!r}{did_you_mean(name, known)}; known: {', '.join(known)}", field="hardware"
    )


# ---------------------------------------------------------------------------------------------------------
# Finding and loading profiles


def profiles_dir() -> Path:
    """Where shipped profiles live (a data folder of the calibration package, found by path)."""
    import simulator

    return Path(simulator.__file__).resolve().parent.parent / "calibration" / "profiles"


def list_profiles() -> list[str]:
    """Names (file stems) of the shipped profiles, sorted."""
    folder = profiles_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """A path as given if it names a file; else a shipped profile of that name."""
    text = str(name_or_path)
    candidate = Path(text)
    if candidate.suffix in (".yaml", ".yml") or candidate.is_file():
        if not candidate.is_file():
            raise ConfigError("profile file not found", file=candidate)
        return candidate
    shipped = profiles_dir() / f"{text}.yaml"
    if shipped.is_file():
        return shipped
    known = list_profiles()
    raise ConfigError(f"unknown profile {text!r}{did_you_mean(text, known)}; known: {', '.join(known)}")


def load_profile(name_or_path: str | Path) -> Profile:
    """Load and validate a profile by shipped name (file stem) or by path. A file is read and validated
    once per version (its size and modification time): a sweep or a notebook loads the same profile for
    every run, and profiles are immutable."""
    path = resolve_profile_path(name_or_path)
    try:
        stat = path.stat()
    except OSError as err:
        raise ConfigError(f"cannot read profile: {err.strerror or err}", file=path) from None
    return _load_profile_file(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _load_profile_file(path: Path, mtime_ns: int, size: int) -> Profile:
    try:
        data = yaml_text.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"not valid YAML: {err}", file=path) from None
    except UnicodeDecodeError:
        raise ConfigError("not a text file (not UTF-8): is it a profile YAML?", file=path) from None
    except OSError as err:
        raise ConfigError(f"cannot read profile: {err.strerror or err}", file=path) from None
    return parse_profile(data, file=path)


def parse_profile(data: Any, *, file: str | Path | None = None) -> Profile:
    """Validate a mapping as a Profile; errors become one ConfigError naming file and field."""
    if not isinstance(data, dict):
        raise ConfigError(f"a profile must be a mapping, got {type(data).__name__}", file=file)
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise config_error_from_validation(err, Profile, file=file) from None


def config_error_from_validation(
    err: ValidationError, model: type[BaseModel], *, file: str | Path | None = None
) -> ConfigError:
    """The first pydantic error as a ConfigError: field path joined by '.', and for an unknown key the
    closest allowed key (reusable by any strict YAML loader built on pydantic).

    An unknown key is reported before anything else: a misspelt key also makes its intended field
    "missing", and the misspelling is the error the user needs to see."""
    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(first["loc"])
    field = ".".join(str(part) for part in loc) or None
    if first["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        key = str(loc[-1])
        return ConfigError(f"unknown key {key!r}{did_you_mean(key, allowed)}", file=file, field=field)
    message = str(first["msg"]).removeprefix("Value error, ")
    # The value given, where it is one: not a whole section (a check across a section's fields, whose
    # message names them, would print the section).
    if first["type"] not in ("missing",) and "input" in first and not isinstance(first["input"], dict | list):
        message = f"{message} (got {first['input']!r})"
    return ConfigError(message, file=file, field=field)


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the sub-model at ``loc`` (skipping list indices and dict keys)."""
    current: Any = model
    for part in loc:
        current = _submodel(current, part)
        if current is None:
            return []
    return list(current.model_fields) if _is_model(current) else []


def _submodel(current: Any, part: Any) -> Any:
    if _is_model(current):
        info = current.model_fields.get(str(part))
        return _unwrap(info.annotation) if info is not None else None
    # A container level (list index or dict key): descend into its item type.
    args = typing.get_args(current)
    return _unwrap(args[-1]) if args else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional / unions down to the first BaseModel member, if any."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        models = [m for m in members if _is_model(m)]
        return models[0] if models else (members[0] if members else None)
    return annotation


def _is_model(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)
