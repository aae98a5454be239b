"""Model shapes (Llama architecture, with mixture-of-experts FFNs and latent attention as options) and
their tensor- and expert-parallel sharding.

Torch-free on purpose: analytic profiles, the profile scaler and the simulator's memory checks read these
shapes without the engine extra installed. Every figure of a public model comes from the source its
``source`` names (the model's Hugging Face config.json, or its paper).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeShape:
    """The mixture-of-experts FFN of a decoder: which layers route, to how many experts, of what width."""

    num_experts: int
    """E: routed experts in every MoE layer, the whole model's (config.json num_local_experts / num_experts /
    n_routed_experts)."""
    experts_per_token: int
    """k: routed experts each token goes to in every MoE layer (num_experts_per_tok)."""
    expert_intermediate_size: int
    """SwiGLU width of one routed expert (moe_intermediate_size; Mixtral's intermediate_size); per GPU once
    sharded (the expert split over tp/ep GPUs)."""
    num_shared_experts: int = 0
    """Experts every token passes through besides its k routed ones, each expert_intermediate_size wide
    (n_shared_experts; DeepSeek-V3: 1). Tensor-parallel over all tp GPUs."""
    num_dense_layers: int = 0
    """Leading decoder layers with a dense FFN of the model's intermediate_size instead of experts
    (first_k_dense_replace; DeepSeek-V3: 3)."""
    ep: int = 1
    """Expert-parallel degree the shape is sharded at: experts in ep groups of E/ep."""

    @property
    def num_local_experts(self) -> int:
        """Routed experts whose slices one GPU holds (E/ep)."""
        return self.num_experts // self.ep


@dataclass(frozen=True, slots=True, kw_only=True)
class MlaShape:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values cached as one compressed latent per token
    and layer (kv_lora_rank) plus a shared RoPE key (qk_rope_head_dim), expanded per head by kv_b_proj. The
    latent has no head axis to split, so tensor parallelism replicates the cache on every GPU."""

    q_lora_rank: int
    """Width of the compressed query (0: queries projected directly from the hidden state)."""
    kv_lora_rank: int
    """Width of the cached key/value latent."""
    qk_nope_head_dim: int
    """Per-head query/key dimensions without rotary embedding."""
    qk_rope_head_dim: int
    """Per-head query/key dimensions with rotary embedding (the key's part is shared by all heads, cached)."""
    v_head_dim: int
    """Per-head value dimension."""

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_width(self) -> int:
        """Elements cached per token and layer: the latent and the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The dimensions of a Llama-architecture decoder (per tensor-parallel rank once sharded)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    """Query heads (per rank after sharding)."""
    num_kv_heads: int
    """Key/value heads (per rank after sharding; replicated when tp exceeds the model's KV heads)."""
    head_dim: int
    intermediate_size: int
    """SwiGLU FFN width (per rank after sharding)."""
    vocab_size: int
    """Vocabulary rows of the LM head (per rank after sharding)."""
    rope_theta: float = 500000.0
    rope_scaling_factor: float | None = None
    """Llama-3.1 RoPE scaling factor (8.0 for the 3.1 models); None = plain RoPE."""
    max_position: int = 131072
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    gated_mlp: bool = True
    """SwiGLU (gate and up projections, 3 FFN matrices); False for a plain two-matrix MLP (phi-2's GELU)."""
    moe: MoeShape | None = None
    """Mixture-of-experts FFNs (after any leading dense layers); None = every layer dense."""
    mla: MlaShape | None = None
    """Multi-head latent attention in place of grouped-query attention; None = GQA (num_kv_heads x head_dim)."""
    source: str = ""
    """Where the figures come from (the config.json or paper they were read from)."""
    tp: int = 1

    # -- parameters per layer (one rank) -------------------------------------------------------------------

    @property
    def attention_params(self) -> int:
        """Linear parameters of one layer's attention on one rank. MLA: the query and latent down-projections
        are replicated (one latent for all heads), the per-head up-projections and the output split by tp."""
        mla = self.mla
        if mla is None:
            qkv = self.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
            return qkv + self.num_heads * self.head_dim * self.hidden_size
        if mla.q_lora_rank:
            query = self.hidden_size * mla.q_lora_rank + mla.q_lora_rank * self.num_heads * mla.qk_head_dim
        else:
            query = self.hidden_size * self.num_heads * mla.qk_head_dim
        latent = self.hidden_size * mla.cache_width
        up = mla.kv_lora_rank * self.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        return query + latent + up + self.num_heads * mla.v_head_dim * self.hidden_size

    @property
    def norm_params_per_layer(self) -> int:
        """Norm weights of one layer: input and post-attention RMSNorms (and MLA's two latent norms)."""
        mla = self.mla
        return 2 * self.hidden_size + (mla.q_lora_rank + mla.kv_lora_rank if mla is not None else 0)

    def ffn_params(self, width: int) -> int:
        """Parameters of one FFN of ``width`` on this rank (3 matrices gated, 2 plain)."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * width

    @property
    def params_per_layer(self) -> int:
        """Parameters of one dense layer on one rank (attention, dense FFN, norms)."""
        return self.attention_params + self.ffn_params(self.intermediate_size) + self.norm_params_per_layer

    # -- the mixture of experts ----------------------------------------------------------------------------

    @property
    def num_moe_layers(self) -> int:
        """Layers whose FFN is a mixture of experts."""
        return 0 if self.moe is None else max(0, self.num_layers - self.moe.num_dense_layers)

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense FFN of intermediate_size."""
        return self.num_layers - self.num_moe_layers

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert of one layer on one rank (its tp/ep slice)."""
        return 0 if self.moe is None else self.ffn_params(self.moe.expert_intermediate_size)

    @property
    def moe_dense_params(self) -> int:
        """Parameters of one MoE layer's FFN that every token uses on one rank: router (replicated, E x hidden)
        and shared experts."""
        moe = self.moe
        if moe is None:
            return 0
        # A routed expert is split over tp/ep GPUs, a shared one over all tp: its slice is ep times thinner.
        shared = self.ffn_params(moe.num_shared_experts * moe.expert_intermediate_size // moe.ep)
        return moe.num_experts * self.hidden_size + shared

    @property
    def router_params(self) -> int:
        """Router (gate) weights of the whole model: vLLM keeps them unquantized, like the norms."""
        return 0 if self.moe is None else self.num_moe_layers * self.moe.num_experts * self.hidden_size

    @property
    def num_routed_expert_params(self) -> int:
        """Parameters of every routed expert one rank holds, over all MoE layers."""
        moe = self.moe
        return 0 if moe is None else self.num_moe_layers * moe.num_local_experts * self.expert_params

    def _layer_params(self, *, routed: bool) -> int:
        """All layers' parameters on one rank, with or without the routed experts."""
        base = self.num_layers * (self.attention_params + self.norm_params_per_layer)
        dense = self.num_dense_layers * self.ffn_params(self.intermediate_size)
        moe = self.num_moe_layers * self.moe_dense_params
        return base + dense + moe + (self.num_routed_expert_params if routed else 0)

    @property
    def num_params(self) -> int:
        """Parameters held by one rank, embedding and every routed expert included."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self._layer_params(routed=True) + embed + head + self.hidden_size

    @property
    def num_params_read_per_step(self) -> int:
        """Parameters every step reads on one rank: every linear weight and the LM head, not the embedding
        table; of an MoE model the dense part only (the routed experts read depend on the step's tokens)."""
        return self._layer_params(routed=False) + self.vocab_size * self.hidden_size + self.hidden_size

    @property
    def num_linear_params(self) -> int:
        """Parameters of the decoder's linear layers on one rank, routed experts included: the part a weight
        dtype quantizes (embedding, LM head, norms and the MoE router stay 16-bit, as vLLM loads them)."""
        return self._layer_params(routed=True) - self.num_layers * self.norm_params_per_layer - self.router_params

    @property
    def num_linear_params_read_per_step(self) -> int:
        """Linear parameters among ``num_params_read_per_step`` (the routed experts left out)."""
        return self.num_linear_params - self.num_routed_expert_params

    @property
    def num_active_params(self) -> int:
        """Parameters one token's forward uses on one rank: the dense part and k routed experts per MoE layer
        (k/ep of the local ones on average) — what compute scales with."""
        moe = self.moe
        routed = 0 if moe is None else self.num_moe_layers * moe.experts_per_token * self.expert_params // moe.ep
        return self.num_params_read_per_step + routed

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache bytes per token on one rank: 2 (K and V) x layers x KV heads x head dim x dtype; with MLA
        layers x (latent + RoPE key) x dtype, the same on every rank (replicated, never split by tp)."""
        if self.mla is not None:
            return self.num_layers * self.mla.cache_width * dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def attention_flops_per_pair(self) -> float:
        """FLOPs of one (query, key) pair over all layers on one rank: QK^T and PV, 2 FLOPs per multiply-add.
        MLA prefill expands the latent per head (qk_head_dim keys, v_head_dim values)."""
        if self.mla is not None:
            return 2.0 * self.num_heads * (self.mla.qk_head_dim + self.mla.v_head_dim) * self.num_layers
        return 4.0 * self.head_dim * self.num_heads * self.num_layers

    def decode_attention_flops_per_context_token(self) -> float:
        """FLOPs of one cached token in decode attention over all layers on one rank. MLA decodes on the
        latent with the up-projections absorbed into the query and output (DeepSeek-V2 §2.1.2): every head
        attends over kv_lora_rank + rope keys and kv_lora_rank values, many FLOPs per cached byte."""
        if self.mla is not None:
            return 2.0 * self.num_heads * (self.mla.cache_width + self.mla.kv_lora_rank) * self.num_layers
        return self.attention_flops_per_pair()

    def with_layers(self, num_layers: int) -> ModelShape:
        """The same shape with fewer layers: per-layer profiling builds a few layers and scales."""
        return replace(self, num_layers=num_layers)

    def shard(self, tp: int, ep: int = 1) -> ModelShape:
        """Per-rank shape under tensor parallelism of degree ``tp`` (Megatron-style column/row split) and, for an
        MoE model, ``ep`` expert groups: each group holds E/ep experts, each split over tp/ep GPUs."""
        if tp < 1 or tp & (tp - 1):
            raise ValueError(f"tp must be a power of two >= 1, got {tp}")
        if self.tp != 1:
            raise ValueError(f"{self.name} is already sharded (tp={self.tp})")
        if self.num_heads % tp or self.intermediate_size % tp:
            raise ValueError(
                f"{self.name}: {self.num_heads} heads / FFN {self.intermediate_size} not divisible by tp={tp}"
            )
        moe = self.moe
        if moe is None and ep != 1:
            raise ValueError(f"{self.name} has no experts to split: ep must be 1, got {ep}")
        if moe is not None:
            expert_tp = tp // ep if ep >= 1 and tp % ep == 0 else 0
            if not expert_tp or moe.num_experts % ep or moe.expert_intermediate_size % expert_tp \
                    or (moe.num_shared_experts * moe.expert_intermediate_size) % tp:
                raise ValueError(f"{self.name}: ep={ep} must divide tp={tp} and its {moe.num_experts} experts, "
                                 f"and tp/ep their width {moe.expert_intermediate_size}")
            moe = replace(moe, expert_intermediate_size=moe.expert_intermediate_size // expert_tp, ep=ep)
        kv_heads = max(1, self.num_kv_heads // tp)  # replicate KV heads when tp > num_kv_heads
        return replace(
            self,
            num_heads=self.num_heads // tp,
            num_kv_heads=kv_heads,
            intermediate_size=self.intermediate_size // tp,
            vocab_size=-(-self.vocab_size // tp),
            moe=moe,
            tp=tp,
        )


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        # Tiny shapes for CPU tests: every code path of the 8B model at a size CI runs in seconds.
        ModelShape(
            name="tiny", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=256, rope_theta=10000.0, max_position=4096,
        ),
        # "small": the CPU calibration model, big enough that step times are not pure Python overhead.
        ModelShape(
            name="small", hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64,
            intermediate_size=1536, vocab_size=4096, rope_theta=500000.0, max_position=8192,
        ),
        # Mixture-of-experts shapes for the CPU engine: "tiny-moe" runs every MoE path (a leading dense layer,
        # top-2 of 4 experts, a shared expert) in the tests; "small-moe" is "small" with its FFN cut into 8
        # experts of which 2 run per token (the same active FFN width, 1536).
        ModelShape(
            name="tiny-moe", hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=256, rope_theta=10000.0, max_position=4096,
            moe=MoeShape(num_experts=4, experts_per_token=2, expert_intermediate_size=32, num_shared_experts=1,
                         num_dense_layers=1),
        ),
        ModelShape(
            name="small-moe", hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64,
            intermediate_size=1536, vocab_size=4096, rope_theta=500000.0, max_position=8192,
            moe=MoeShape(num_experts=8, experts_per_token=2, expert_intermediate_size=768),
        ),
        # Meta Llama 3 / 3.1 config.json values (hidden, layers, heads, kv heads, FFN, vocab, rope).
        ModelShape(
            name="llama-3-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
            intermediate_size=14336, vocab_size=128256, rope_scaling_factor=8.0,
        ),
        ModelShape(
            name="llama-3-70b", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128,
            intermediate_size=28672, vocab_size=128256, rope_scaling_factor=8.0,
        ),
        ModelShape(
            name="llama-3-405b", hidden_size=16384, num_layers=126, num_heads=128, num_kv_heads=8,
            head_dim=128, intermediate_size=53248, vocab_size=128256, rope_scaling_factor=8.0,
        ),
        # The models of Vidur's published profiles (../shared/data/profiling/vidur): each shape as its
        # Hugging Face config.json gives it (the profile rows repeat hidden, heads, KV heads, FFN and vocab;
        # the layer count is only in config.json). Vocabularies are the padded sizes the profiles record.
        ModelShape(
            name="llama-2-7b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128,
            intermediate_size=11008, vocab_size=32768, rope_theta=10000.0, max_position=4096,
        ),
        ModelShape(
            name="llama-2-70b", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128,
            intermediate_size=28672, vocab_size=32768, rope_theta=10000.0, max_position=4096,
        ),
        ModelShape(
            name="codellama-34b", hidden_size=8192, num_layers=48, num_heads=64, num_kv_heads=8, head_dim=128,
            intermediate_size=22016, vocab_size=32768, rope_theta=1000000.0, max_position=16384,
        ),
        ModelShape(
            name="internlm-20b", hidden_size=5120, num_layers=60, num_heads=40, num_kv_heads=40, head_dim=128,
            intermediate_size=13824, vocab_size=103168, rope_theta=10000.0, max_position=4096,
        ),
        ModelShape(
            name="phi-2", hidden_size=2560, num_layers=32, num_heads=32, num_kv_heads=32, head_dim=80,
            intermediate_size=10240, vocab_size=51200, rope_theta=10000.0, max_position=2048, gated_mlp=False,
        ),
        ModelShape(
            name="qwen-72b", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=64, head_dim=128,
            intermediate_size=24576, vocab_size=152064, rope_theta=1000000.0, max_position=32768,
        ),
        # codellama/CodeLlama-7b-hf config.json (Llama 2 shape, 16 extra vocab rows, 16k RoPE positions).
        ModelShape(
            name="codellama-7b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128,
            intermediate_size=11008, vocab_size=32016, rope_theta=1000000.0, max_position=16384,
        ),
        # Mixture-of-experts models. intermediate_size is the width of the dense FFN layers, where a model has
        # any (DeepSeek-V3's first 3); Mixtral's and Qwen3's have none (their config.json's intermediate_size is
        # kept as written: Mixtral's is its expert width, Qwen3's is unused by its MoE layers).
        # mistralai/Mixtral-8x7B-v0.1 config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads (head dim
        # 4096/32), 8 local experts of intermediate_size 14336, 2 per token, vocab 32000, rope_theta 1e6, 32768
        # positions. 46.7 B parameters, 12.9 B active (Mistral AI, "Mixtral of experts", 2023-12-11).
        ModelShape(
            name="mixtral-8x7b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
            intermediate_size=14336, vocab_size=32000, rope_theta=1000000.0, max_position=32768,
            moe=MoeShape(num_experts=8, experts_per_token=2, expert_intermediate_size=14336),
            source="https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
        ),
        # Qwen/Qwen3-30B-A3B config.json: hidden 2048, 48 layers, 32 query heads of head_dim 128 (4096 wide, twice
        # the hidden size), 4 KV heads, 128 experts of moe_intermediate_size 768, 8 per token, no shared expert
        # (decoder_sparse_step 1, mlp_only_layers []), vocab 151936, untied LM head, rope_theta 1e6, 40960
        # positions. 30.5 B parameters, 3.3 B active (Qwen3 model card). Its per-head q/k RMSNorms (256
        # weights a layer) are left out.
        ModelShape(
            name="qwen3-30b-a3b", hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
            intermediate_size=6144, vocab_size=151936, rope_theta=1000000.0, max_position=40960, rms_eps=1e-6,
            moe=MoeShape(num_experts=128, experts_per_token=8, expert_intermediate_size=768),
            source="https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
        ),
        # deepseek-ai/DeepSeek-V3 config.json (and inference/configs/config_671B.json): hidden 7168, 61 layers of
        # which the first 3 dense (intermediate_size 18432), 256 routed experts of moe_intermediate_size 2048, 8
        # per token, 1 shared expert; MLA with 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim
        # 128, qk_rope_head_dim 64, v_head_dim 128; vocab 129280, 163840 positions (YaRN, factor 40 over 4096).
        # 671 B parameters, 37 B active (DeepSeek-V3 Technical Report, arXiv 2412.19437); the multi-token-
        # prediction module (14 B more) is only loaded for speculative decoding and is left out. head_dim is
        # the rotary dimension (64), what vLLM's RoPE cache holds; the per-head dimensions live in mla.
        ModelShape(
            name="deepseek-v3", hidden_size=7168, num_layers=61, num_heads=128, num_kv_heads=128, head_dim=64,
            intermediate_size=18432, vocab_size=129280, rope_theta=10000.0, max_position=163840, rms_eps=1e-6,
            moe=MoeShape(num_experts=256, experts_per_token=8, expert_intermediate_size=2048, num_shared_experts=1,
                         num_dense_layers=3),
            mla=MlaShape(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                         v_head_dim=128),
            source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
        ),
    )
}


def get_model(name: str, tp: int = 1, ep: int = 1) -> ModelShape:
    """The named model's shape for one rank at tensor parallelism ``tp`` (and ``ep`` expert groups)."""
    try:
        shape = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    return shape if tp == 1 and ep == 1 else shape.shard(tp, ep)
