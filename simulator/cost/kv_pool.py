"""KV pool: how many KV-cache blocks vLLM gives one GPU, by vLLM v1's start-up accounting.

vLLM sizes its KV pool once, before serving (``Worker.determine_available_memory`` in
``vllm/v1/worker/gpu_worker.py``, blocks in ``vllm/v1/core/kv_cache_utils.py``)::

    requested  = total device memory (torch.cuda.mem_get_info()[1]) x gpu_memory_utilization
    kv bytes   = requested - weights - peak activations of one profiling forward - non-torch memory
                 [- CUDA-graph memory, only where the version subtracts it]
    num_blocks = kv bytes // (block_size x KV bytes per token)        tokens = num_blocks x block_size

v1 logs the result as "GPU KV cache size: N tokens"; v0 logged "# GPU blocks: N". vLLM measures the three
middle terms on the device; this module states each as a rule of the model's shape, fixed on public
vLLM v0.19.0 logs (``tests/simulator/test_kv_pool.py`` reproduces them within 1 %):

- weights: the dtype-priced parameters plus the RoPE cos/sin cache vLLM allocates with them
  (max_position x head_dim elements; Llama-3.1-8B: 14.96 GiB of parameters, 14.99 GiB logged).
- activations: the larger of two peaks of the profiling run over ``max_num_batched_tokens`` (T) tokens
  and ``min(max_num_seqs, T)`` (S) sequences. The forward's widest point is the MLP:
  T x (4 hidden + 3 intermediate) elements live (residual, normed input, attention output and
  down-projection output; gate/up and their SiLU product). The sampler then holds the final hidden
  states (T x hidden) and, per logit of S x vocab, the logits in the model dtype plus 13 bytes of fp32
  work (a float copy, the probabilities and the sampling noise at 4 bytes each, a one-byte mask). The
  vocab is the full one: logits are gathered across tensor-parallel ranks, which is why the logged peak
  of Llama-3.1-8B is 1.89 GiB at TP 1, 2 and 4 alike.
- non-torch memory: what grows outside PyTorch's allocator after vLLM's baseline snapshot (the CUDA
  context is in the baseline, so it is not subtracted): cuBLAS/cuBLASLt workspaces, 0.25 GiB; at TP > 1
  also NCCL's and the custom all-reduce's buffers, 1.85 GiB more (logged: 0.24-0.27 GiB at TP 1,
  2.06-2.21 GiB at TP 2 and 4).
- CUDA graphs: v0.19 captures them after sizing the pool and does not subtract them
  (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` off), so the default reserve is 0.

Plain numbers in, plain numbers out: stdlib and pydantic only. It must never import ``calibration`` or
torch; the caller prices weight and KV bytes by dtype (``simulator.cost.dtypes``).
"""

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

GIB = 1 << 30
"""Bytes in a GiB (vLLM logs memory in GiB)."""

SAMPLER_FP32_BYTES_PER_LOGIT = 13
"""fp32 work bytes per logit at the sampler's peak: a float copy, probabilities, noise (4 each), a mask (1)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class RankMemoryShape(_Frozen):
    """What vLLM's start-up accounting needs of a model on one tensor-parallel rank, as plain numbers."""

    num_layers: int = Field(ge=1)
    """Decoder layers."""
    hidden_size: int = Field(ge=1)
    """Model width (activations are replicated across ranks, so never sharded)."""
    intermediate_size: int = Field(ge=1)
    """FFN width on this rank (the model's FFN width / tp)."""
    vocab_size: int = Field(ge=1)
    """The full vocabulary: the sampler sees logits gathered across ranks."""
    head_dim: int = Field(ge=1)
    """Attention head dimension (the RoPE cache is max_position x head_dim)."""
    max_position: int = Field(ge=1)
    """Longest position the model's RoPE cache covers (config.json max_position_embeddings)."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree (TP > 1 adds the communication buffers to non-torch memory)."""
    weight_bytes: int = Field(ge=0)
    """Parameter bytes resident on this rank, priced by dtype (RoPE cache not included)."""
    kv_bytes_per_token: int = Field(gt=0)
    """KV-cache bytes one token takes on this rank, all layers, at the KV dtype."""
    activation_bytes: int = Field(default=2, ge=1)
    """Bytes per activation element (2 for bf16/fp16 models, 4 for float32)."""


class VllmSettings(_Frozen):
    """The engine arguments the pool depends on. Defaults: ``vllm serve`` on a GPU of at least 70 GiB
    that is not an A100 (see ``serve_defaults`` for the others)."""

    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Fraction of the device's total memory vLLM may use (vLLM's default 0.9)."""
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    """Tokens of the profiling forward (the largest step the scheduler may run)."""
    max_num_seqs: int = Field(default=1024, ge=1)
    """Sequences per step; the profiling run samples min(max_num_seqs, max_num_batched_tokens) of them."""
    block_size: int = Field(default=16, ge=1)
    """Tokens per KV block (vLLM's default 16 on CUDA)."""


class VllmMemoryRule(_Frozen):
    """The constants of one vLLM generation's accounting (see the module docstring for their sources)."""

    name: str
    """Registry key, e.g. 'vllm-v1'."""
    forward_hidden_widths: int = Field(default=4, ge=0)
    """Hidden-wide tensors live per token at the forward's peak."""
    forward_intermediate_widths: int = Field(default=3, ge=0)
    """Intermediate-wide (per rank) tensors live per token at the forward's peak."""
    sampler_fp32_bytes_per_logit: int = Field(default=SAMPLER_FP32_BYTES_PER_LOGIT, ge=0)
    """fp32 work bytes per logit at the sampler's peak, besides the logits themselves."""
    non_torch_bytes: int = Field(default=GIB // 4, ge=0)
    """Memory outside PyTorch's allocator that grows during start-up on one GPU (cuBLAS workspaces)."""
    non_torch_tp_bytes: int = Field(default=int(1.85 * GIB), ge=0)
    """Extra non-torch memory at TP > 1 (NCCL and custom all-reduce buffers)."""
    cuda_graph_bytes: int = Field(default=0, ge=0)
    """CUDA-graph memory subtracted before sizing the pool: 0 where the version captures graphs after it."""


VLLM_V1 = VllmMemoryRule(name="vllm-v1")
"""vLLM v1 (V1 engine, torch.compile + piecewise CUDA graphs), constants fixed on v0.19.0 logs."""

RULES: dict[str, VllmMemoryRule] = {VLLM_V1.name: VLLM_V1}
"""Accounting rules by name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KvPool:
    """One GPU's memory as vLLM splits it at start-up, bytes; ``num_blocks`` is what it allocates."""

    device_memory_bytes: int
    """Total device memory as CUDA reports it."""
    gpu_memory_utilization: float
    """Fraction vLLM may use."""
    requested_bytes: int
    """device_memory_bytes x gpu_memory_utilization."""
    weight_bytes: int
    """Weights as vLLM counts them ("model weights take"): parameters plus the RoPE cache."""
    activation_bytes: int
    """Peak activations of the profiling run."""
    non_torch_bytes: int
    """Non-torch memory growth (workspaces, communication buffers)."""
    cuda_graph_bytes: int
    """CUDA-graph reserve subtracted (0 where the version does not)."""
    kv_bytes: int
    """What is left for the KV cache (negative when the model does not fit)."""
    block_size: int
    """Tokens per block."""
    block_bytes: int
    """Bytes of one block on this GPU, all layers."""
    num_blocks: int
    """Blocks allocated ("# GPU blocks" in v0 logs); 0 when nothing is left."""

    @property
    def num_tokens(self) -> int:
        """Tokens of KV the pool holds ("GPU KV cache size: N tokens" in v1 logs)."""
        return self.num_blocks * self.block_size

    @property
    def non_kv_bytes(self) -> int:
        """Everything subtracted from the requested memory."""
        return self.weight_bytes + self.activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes

    def describe(self) -> str:
        """The breakdown in the words and units of vLLM's own start-up log."""
        return (
            f"total_gpu_memory ({self.device_memory_bytes / GIB:.2f}GiB) x gpu_memory_utilization "
            f"({self.gpu_memory_utilization:.2f}) = {self.requested_bytes / GIB:.2f}GiB; model weights take "
            f"{self.weight_bytes / GIB:.2f}GiB; non_torch_memory takes {self.non_torch_bytes / GIB:.2f}GiB; "
            f"PyTorch activation peak memory takes {self.activation_bytes / GIB:.2f}GiB; CUDA graphs "
            f"{self.cuda_graph_bytes / GIB:.2f}GiB; the rest of the memory reserved for KV Cache is "
            f"{self.kv_bytes / GIB:.2f}GiB; # GPU blocks: {self.num_blocks}; "
            f"GPU KV cache size: {self.num_tokens:,} tokens"
        )


class KvPoolError(ValueError):
    """The model leaves no room for one KV block; ``pool`` holds the breakdown that says why."""

    def __init__(self, pool: KvPool) -> None:
        self.pool = pool
        super().__init__(f"no room for one KV block: {pool.describe()}")


def rope_cache_bytes(shape: RankMemoryShape) -> int:
    """vLLM's RoPE cos/sin cache, allocated with the weights: max_position x head_dim in the model dtype."""
    return shape.max_position * shape.head_dim * shape.activation_bytes


def forward_peak_bytes(shape: RankMemoryShape, settings: VllmSettings, rule: VllmMemoryRule = VLLM_V1) -> int:
    """Peak of the profiling forward: T tokens x the tensors live at the MLP's widest point."""
    widths = rule.forward_hidden_widths * shape.hidden_size + rule.forward_intermediate_widths * shape.intermediate_size
    return settings.max_num_batched_tokens * widths * shape.activation_bytes


def sampler_peak_bytes(shape: RankMemoryShape, settings: VllmSettings, rule: VllmMemoryRule = VLLM_V1) -> int:
    """Peak of the profiling sampler: the final hidden states plus S x vocab logits and their fp32 work."""
    num_tokens = settings.max_num_batched_tokens
    num_seqs = min(settings.max_num_seqs, num_tokens)
    hidden = num_tokens * shape.hidden_size * shape.activation_bytes
    return hidden + num_seqs * shape.vocab_size * (shape.activation_bytes + rule.sampler_fp32_bytes_per_logit)


def activation_peak_bytes(shape: RankMemoryShape, settings: VllmSettings, rule: VllmMemoryRule = VLLM_V1) -> int:
    """"PyTorch activation peak memory" of the profiling run: the larger of the forward and sampler peaks."""
    return max(forward_peak_bytes(shape, settings, rule), sampler_peak_bytes(shape, settings, rule))


def non_torch_bytes(tp: int, rule: VllmMemoryRule = VLLM_V1) -> int:
    """Non-torch memory growth on one GPU at tensor parallelism ``tp``."""
    return rule.non_torch_bytes + (rule.non_torch_tp_bytes if tp > 1 else 0)


def kv_pool(
    shape: RankMemoryShape,
    device_memory_bytes: int,
    settings: VllmSettings | None = None,
    rule: VllmMemoryRule = VLLM_V1,
) -> KvPool:
    """The KV pool vLLM allocates on one GPU of ``device_memory_bytes`` (as CUDA reports it); a model that
    leaves no room for one block raises KvPoolError carrying the breakdown."""
    settings = settings or VllmSettings()
    if device_memory_bytes <= 0:
        raise ValueError(f"device_memory_bytes must be positive, got {device_memory_bytes}")
    requested = int(device_memory_bytes * settings.gpu_memory_utilization)
    weights = shape.weight_bytes + rope_cache_bytes(shape)
    activations = activation_peak_bytes(shape, settings, rule)
    non_torch = non_torch_bytes(shape.tp, rule)
    kv = requested - weights - activations - non_torch - rule.cuda_graph_bytes
    block_bytes = settings.block_size * shape.kv_bytes_per_token
    pool = KvPool(
        device_memory_bytes=device_memory_bytes,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        requested_bytes=requested,
        weight_bytes=weights,
        activation_bytes=activations,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=rule.cuda_graph_bytes,
        kv_bytes=kv,
        block_size=settings.block_size,
        block_bytes=block_bytes,
        num_blocks=max(0, kv // block_bytes),
    )
    if pool.num_blocks < 1:
        raise KvPoolError(pool)
    return pool


LARGE_GPU_BYTES = 70 * GIB
"""vLLM's threshold for its larger scheduler defaults (``EngineArgs``: at least 70 GiB and not an A100)."""


def serve_defaults(device_memory_bytes: int, device_name: str, gpu_memory_utilization: float = 0.9,
                   entry_point: str = "api_server") -> VllmSettings:
    """vLLM's scheduler defaults for a GPU and an entry point (``EngineArgs.get_batch_defaults``,
    vllm/engine/arg_utils.py, by ``UsageContext``). ``vllm serve`` (the OpenAI API server): 8192 batched
    tokens and 1024 sequences on a GPU of at least 70 GiB that is not an A100, else 2048 and 256 (vLLM's
    ``test_defaults_with_usage_context``). The offline ``LLM`` class ("offline"): 16384 and 1024, else
    8192 and 256."""
    large = device_memory_bytes >= LARGE_GPU_BYTES and "a100" not in device_name.lower()
    offline = entry_point == "offline"
    tokens = (16384 if offline else 8192) if large else (8192 if offline else 2048)
    return VllmSettings(gpu_memory_utilization=gpu_memory_utilization, max_num_batched_tokens=tokens,
                        max_num_seqs=1024 if large else 256)
