"""Model shapes (Llama architecture) and their tensor-parallel sharding.

Torch-free on purpose: analytic profiles, the profile scaler and the simulator's memory checks read these
shapes without the engine extra installed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


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
    tp: int = 1

    @property
    def params_per_layer(self) -> int:
        qkv = self.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        out = self.num_heads * self.head_dim * self.hidden_size
        ffn = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size
        return qkv + out + ffn + norms

    @property
    def num_params(self) -> int:
        """Parameters held by one rank, embedding included."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.num_layers * self.params_per_layer + embed + head + self.hidden_size

    @property
    def num_params_read_per_step(self) -> int:
        """Parameters a decode step reads: every linear weight and the LM head, not the embedding table."""
        return self.num_layers * self.params_per_layer + self.vocab_size * self.hidden_size + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache bytes per token on one rank: 2 (K and V) x layers x KV heads x head dim x dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def with_layers(self, num_layers: int) -> ModelShape:
        """The same shape with fewer layers: per-layer profiling builds a few layers and scales."""
        return replace(self, num_layers=num_layers)

    def shard(self, tp: int) -> ModelShape:
        """Per-rank shape under tensor parallelism of degree ``tp`` (Megatron-style column/row split)."""
        if tp < 1 or tp & (tp - 1):
            raise ValueError(f"tp must be a power of two >= 1, got {tp}")
        if self.tp != 1:
            raise ValueError(f"{self.name} is already sharded (tp={self.tp})")
        if self.num_heads % tp or self.intermediate_size % tp:
            raise ValueError(
                f"{self.name}: {self.num_heads} heads / FFN {self.intermediate_size} not divisible by tp={tp}"
            )
        kv_heads = max(1, self.num_kv_heads // tp)  # replicate KV heads when tp > num_kv_heads
        return replace(
            self,
            num_heads=self.num_heads // tp,
            num_kv_heads=kv_heads,
            intermediate_size=self.intermediate_size // tp,
            vocab_size=-(-self.vocab_size // tp),
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
    )
}


def get_model(name: str, tp: int = 1) -> ModelShape:
    """The named model's shape for one rank at tensor parallelism ``tp``."""
    try:
        shape = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    return shape if tp == 1 else shape.shard(tp)
