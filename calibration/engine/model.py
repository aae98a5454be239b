"""A Llama-architecture decoder with random weights, run one flat step at a time.

Calibration measures time, not quality, so weights are random (normal, std 0.02, seeded) and are created
directly on the target device in the target dtype: an 8B model never passes through host memory. The
forward takes one step's flat tokens (every scheduled sequence's new tokens back to back), their
positions and the step's attention metadata; attention itself belongs to the backend that built the
metadata, so the same weights run paged or dense (the test oracle). A shape with a mixture of experts gets
``calibration.engine.moe.MoeMLP`` in place of the dense FFN after its leading dense layers. The model never
schedules, allocates blocks or samples.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from calibration.engine.attention.base import AttentionMetadata
from calibration.engine.configs import ModelShape
from calibration.engine.kv_cache import KVCache
from calibration.engine.moe import MoeMLP

# Llama 3.1's RoPE scaling constants (its config.json "rope_scaling"); only the factor varies by model.
ROPE_LOW_FREQ_FACTOR = 1.0
ROPE_HIGH_FREQ_FACTOR = 4.0
ROPE_ORIGINAL_MAX_POSITION = 8192


def rope_inv_freq(head_dim: int, theta: float, scaling_factor: float | None = None) -> torch.Tensor:
    """(head_dim // 2,) float64 inverse frequencies, with Llama-3 scaling when ``scaling_factor`` is set.

    Llama 3.1 stretches long wavelengths (beyond the original 8K context) by the factor, keeps short ones,
    and blends linearly in between, so short-range behaviour is unchanged while long context extends.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling_factor is None:
        return inv_freq
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = ROPE_ORIGINAL_MAX_POSITION / ROPE_LOW_FREQ_FACTOR
    high_freq_wavelen = ROPE_ORIGINAL_MAX_POSITION / ROPE_HIGH_FREQ_FACTOR
    smooth = (ROPE_ORIGINAL_MAX_POSITION / wavelen - ROPE_LOW_FREQ_FACTOR) / (
        ROPE_HIGH_FREQ_FACTOR - ROPE_LOW_FREQ_FACTOR
    )
    blended = (1 - smooth) * inv_freq / scaling_factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling_factor, blended)
    return torch.where(wavelen < high_freq_wavelen, inv_freq, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_tokens, head_dim // 2) fp32 cos and sin for the given positions (once per step, not per layer)."""
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (num_tokens, head_dim // 2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (num_tokens, num_heads, head_dim) by position, half-split convention (as HF Llama), in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)  # (num_tokens, num_heads, head_dim // 2) each
    c, s = cos[:, None, :], sin[:, None, :]  # (num_tokens, 1, head_dim // 2)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 (bf16 sums of squares lose precision), cast back."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class _Init:
    """Seeded random parameters created in place on the device, in the model dtype."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        self.device, self.dtype = device, dtype
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def normal(self, *size: int) -> nn.Parameter:
        t = torch.empty(size, device=self.device, dtype=self.dtype)
        return nn.Parameter(t.normal_(0.0, 0.02, generator=self.generator), requires_grad=False)

    def ones(self, size: int) -> nn.Parameter:
        return nn.Parameter(torch.ones(size, device=self.device, dtype=self.dtype), requires_grad=False)


class DecoderLayer(nn.Module):
    """Pre-norm block: RMSNorm → GQA attention (fused QKV) → residual; RMSNorm → SwiGLU (fused gate-up), or
    the mixture of experts when ``moe`` (its reference spelling when ``dense_experts``)."""

    def __init__(self, shape: ModelShape, init: _Init, *, moe: bool = False, dense_experts: bool = False) -> None:
        super().__init__()
        self.shape = shape
        q_size = shape.num_heads * shape.head_dim
        kv_size = shape.num_kv_heads * shape.head_dim
        self.input_norm = init.ones(shape.hidden_size)
        self.qkv_proj = init.normal(q_size + 2 * kv_size, shape.hidden_size)
        self.o_proj = init.normal(shape.hidden_size, q_size)
        self.post_attn_norm = init.ones(shape.hidden_size)
        self.moe = MoeMLP(shape, init) if moe else None
        self.dense_experts = dense_experts
        if self.moe is None:
            self.gate_up_proj = init.normal(2 * shape.intermediate_size, shape.hidden_size)
            self.down_proj = init.normal(shape.hidden_size, shape.intermediate_size)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        layer_cache: torch.Tensor | None,
    ) -> torch.Tensor:
        shape = self.shape
        num_tokens = h.shape[0]
        q_size = shape.num_heads * shape.head_dim
        kv_size = shape.num_kv_heads * shape.head_dim
        qkv = F.linear(rms_norm(h, self.input_norm, shape.rms_eps), self.qkv_proj)  # (num_tokens, q + 2 kv)
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(num_tokens, shape.num_heads, shape.head_dim)  # (num_tokens, num_heads, head_dim)
        k = k.view(num_tokens, shape.num_kv_heads, shape.head_dim)  # (num_tokens, num_kv_heads, head_dim)
        v = v.view(num_tokens, shape.num_kv_heads, shape.head_dim)  # (num_tokens, num_kv_heads, head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        attn = meta.backend.forward(q, k, v, layer_cache, meta)  # (num_tokens, num_heads, head_dim)
        h = h + F.linear(attn.reshape(num_tokens, q_size), self.o_proj)  # (num_tokens, hidden)
        x = rms_norm(h, self.post_attn_norm, shape.rms_eps)
        if self.moe is not None:
            return h + (self.moe.reference(x) if self.dense_experts else self.moe(x))  # (num_tokens, hidden)
        gate_up = F.linear(x, self.gate_up_proj)  # (num_tokens, 2 * ffn)
        gate, up = gate_up.chunk(2, dim=-1)  # (num_tokens, ffn) each
        return h + F.linear(F.silu(gate) * up, self.down_proj)  # (num_tokens, hidden)


class LlamaModel(nn.Module):
    """Llama decoder with an untied LM head, returning logits of each sequence's last new token."""

    def __init__(
        self,
        shape: ModelShape,
        *,
        num_layers: int | None = None,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        seed: int = 0,
        dense_experts: bool = False,
    ) -> None:
        """``num_layers`` overrides the shape's depth: per-layer profiling builds a few layers and scales.
        ``dense_experts`` runs an MoE shape's experts by the reference (every expert on every token)."""
        super().__init__()
        if num_layers is not None:
            shape = shape.with_layers(num_layers)
        if shape.tie_embeddings:
            raise ValueError(f"{shape.name}: tied embeddings are not supported (Llama 3 unties its LM head)")
        if shape.mla is not None:
            raise ValueError(f"{shape.name}: latent attention (MLA) is priced analytically; the engine runs GQA")
        self.shape = shape
        self.device = torch.device(device)
        self.dtype = dtype
        init = _Init(self.device, dtype, seed)
        self.embed_tokens = init.normal(shape.vocab_size, shape.hidden_size)
        first_moe = shape.num_dense_layers if shape.moe is not None else shape.num_layers
        self.layers = nn.ModuleList(
            DecoderLayer(shape, init, moe=i >= first_moe, dense_experts=dense_experts) for i in range(shape.num_layers)
        )
        self.norm = init.ones(shape.hidden_size)
        self.lm_head = init.normal(shape.vocab_size, shape.hidden_size)
        inv_freq = rope_inv_freq(shape.head_dim, shape.rope_theta, shape.rope_scaling_factor)
        self.register_buffer("inv_freq", inv_freq.to(self.device, torch.float32), persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache | None = None,
        *,
        token_indices: torch.Tensor | None = None,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """One step: input_ids, positions (num_tokens,) int64 → logits (num_seqs, vocab) in the model dtype.

        ``meta`` comes from a backend's ``prepare`` for the same sequences, in the same order as the flat
        tokens; ``kv_cache`` is required by paged backends and ignored by the dense oracle. Speculative
        decoding: ``token_indices`` (flat token positions) picks the rows of logits instead of each
        sequence's last token (a verification needs one per proposal), and ``num_layers`` runs only the
        first layers (a layer-truncated self-draft, which reads and writes those layers' KV).
        """
        if meta.backend.paged and kv_cache is None:
            raise ValueError(f"backend {meta.backend.name!r} needs a KV cache")
        if kv_cache is not None and kv_cache.shape.num_layers != len(self.layers):
            raise ValueError(f"KV cache has {kv_cache.shape.num_layers} layers, the model {len(self.layers)}")
        if input_ids.shape != positions.shape or input_ids.shape[0] != meta.num_tokens:
            raise ValueError(
                f"{input_ids.shape[0]} ids and {positions.shape[0]} positions"
                f" for metadata of {meta.num_tokens} tokens"
            )
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]
        cos, sin = rope_cos_sin(positions, inv_freq)
        h = F.embedding(input_ids, self.embed_tokens)  # (num_tokens, hidden)
        layers = self.layers if num_layers is None else self.layers[:num_layers]
        for i, layer in enumerate(layers):
            layer_cache = kv_cache.layer(i) if kv_cache is not None and meta.backend.paged else None
            h = layer(h, cos, sin, meta, layer_cache)  # (num_tokens, hidden)
        rows = meta.last_token_indices if token_indices is None else token_indices
        h = h.index_select(0, rows)  # (num_seqs, hidden), or (len(token_indices), hidden)
        return F.linear(rms_norm(h, self.norm, self.shape.rms_eps), self.lm_head)  # (num_seqs, vocab)
