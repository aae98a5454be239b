"""Paged attention by gathering: copy each sequence's context out of the pool, then plain SDPA.

CPU default and the GPU reference. Costs one copy of the context per layer (on a GPU that roughly doubles
decode KV traffic), which is why the GPU decode path is a Triton kernel instead; but it is correct for every
step shape: decode, a whole prompt, and a chunk over a cached prefix (lower-right causal mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from calibration.engine.attention.base import (
    AttentionBackend,
    PagedMetadata,
    ScheduledSeq,
    context_slots,
    write_kv,
)


@dataclass(slots=True, kw_only=True)
class GatherMetadata(PagedMetadata):
    gather_seqs: list[int]
    """Indices of the sequences attended by gathering (all of them here; a subset in subclasses)."""
    context_slots: torch.Tensor
    """int64 physical slots of the gathered sequences' contexts, concatenated (none for a whole prompt)."""
    context_start: list[int]
    """Offsets of each gathered sequence in ``context_slots``."""
    masks: list[torch.Tensor | None]
    """Per gathered sequence: None (one query, or no cached prefix: SDPA's own causal flag) or a bool
    (num_new, seq_len) lower-right causal mask for a chunk over a cached prefix."""


def lower_right_causal_mask(num_new: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """(num_new, seq_len) bool: new token i (at position seq_len - num_new + i) sees keys up to itself."""
    return torch.ones(num_new, seq_len, dtype=torch.bool, device=device).tril_(seq_len - num_new)


class SdpaGatherBackend(AttentionBackend[GatherMetadata]):
    """Per-sequence gather of the paged context + torch SDPA."""

    name = "sdpa_gather"

    def prepare(self, seqs: Sequence[ScheduledSeq]) -> GatherMetadata:
        return GatherMetadata(**self._paged_common(seqs), **self._gather_fields(seqs, range(len(seqs))))

    def _gather_fields(self, seqs: Sequence[ScheduledSeq], which: Sequence[int]) -> dict[str, Any]:
        """GatherMetadata's own fields for the sequences ``which`` (a subclass may gather only some)."""
        chosen = [seqs[i] for i in which]
        # A whole prompt (nothing cached) attends its own new K/V directly, so it gathers nothing.
        cached = [s for s in chosen if s.num_computed_tokens > 0]
        starts = [0]
        for s in chosen:
            starts.append(starts[-1] + (s.seq_len if s.num_computed_tokens > 0 else 0))
        slots = context_slots(cached, self.block_size) if cached else torch.empty(0, dtype=torch.int64)
        masks: list[torch.Tensor | None] = [
            lower_right_causal_mask(s.num_new_tokens, s.seq_len, self.device)
            if s.num_new_tokens > 1 and s.num_computed_tokens > 0
            else None
            for s in chosen
        ]
        return {
            "gather_seqs": list(which),
            "context_slots": slots.to(self.device),
            "context_start": starts,
            "masks": masks,
        }

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_cache: torch.Tensor | None,
        meta: GatherMetadata,
    ) -> torch.Tensor:
        if layer_cache is None:
            raise ValueError(f"{self.name} attends over the paged KV pool: pass a KV cache")
        write_kv(layer_cache, k, v, meta.slot_mapping)
        out = torch.empty_like(q)
        self.attend_gathered(q, k, v, layer_cache, meta, out)
        return out

    @staticmethod
    def attend_gathered(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_cache: torch.Tensor,
        meta: GatherMetadata,
        out: torch.Tensor,
    ) -> None:
        """Fill ``out`` rows of the gathered sequences; the new K/V are already in ``layer_cache``."""
        if not meta.gather_seqs:
            return
        _, num_blocks, block_size, num_kv_heads, head_dim = layer_cache.shape
        num_slots = num_blocks * block_size
        k_pool = layer_cache[0].view(num_slots, num_kv_heads, head_dim)  # (num_slots, kv_heads, head_dim)
        v_pool = layer_cache[1].view(num_slots, num_kv_heads, head_dim)  # (num_slots, kv_heads, head_dim)
        # One gather per layer for all sequences, then slices: fewer kernel launches than one per sequence.
        k_ctx = k_pool.index_select(0, meta.context_slots)  # (sum_seq_len, kv_heads, head_dim)
        v_ctx = v_pool.index_select(0, meta.context_slots)  # (sum_seq_len, kv_heads, head_dim)
        for j, i in enumerate(meta.gather_seqs):
            lo, hi = meta.query_start[i], meta.query_start[i + 1]
            qi = q[lo:hi].transpose(0, 1).unsqueeze(0)  # (1, num_heads, num_new, head_dim)
            if meta.num_computed_tokens[i] == 0:
                ki, vi, causal = k[lo:hi], v[lo:hi], hi - lo > 1
            else:
                c_lo, c_hi = meta.context_start[j], meta.context_start[j + 1]
                ki, vi, causal = k_ctx[c_lo:c_hi], v_ctx[c_lo:c_hi], False
            ki = ki.transpose(0, 1).unsqueeze(0).to(q.dtype)  # (1, num_kv_heads, seq_len, head_dim)
            vi = vi.transpose(0, 1).unsqueeze(0).to(q.dtype)  # (1, num_kv_heads, seq_len, head_dim)
            oi = F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=meta.masks[j], is_causal=causal, enable_gqa=True
            )  # (1, num_heads, num_new, head_dim)
            out[lo:hi] = oi.squeeze(0).transpose(0, 1)  # (num_new, num_heads, head_dim)
