"""Paged attention with torch FlexAttention over the whole physical pool: the GPU fallback and baseline.

The step's flat tokens are one query row of length num_tokens; the keys are every slot of the pool. A mask
maps a key slot back to a position of the query's own sequence (through a physical→logical block table per
sequence) and allows it when that position is at or before the query's: one rule covering decode, whole
prompts, chunks over a cached prefix and blocks shared between sequences. The block mask is built from
per-sequence tables every step, so unallocated pages are never visited (an unbounded mask reads garbage
pages and yields NaN under compile).

On CUDA flex_attention is compiled (to Triton). On CPU it runs eagerly, which materialises scores over the
whole pool: fine for the tiny pools of tests, far too slow for anything else (use sdpa_gather there).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from calibration.engine.attention.base import AttentionBackend, PagedMetadata, ScheduledSeq, write_kv


@dataclass(slots=True, kw_only=True)
class FlexMetadata(PagedMetadata):
    block_mask: BlockMask | None
    """Built on the first layer's call, when the pool size is known; reused by every other layer."""
    query_seq: torch.Tensor
    """(num_tokens,) int64 sequence index of each new token."""
    query_pos: torch.Tensor
    """(num_tokens,) int64 position of each new token."""
    physical_to_logical: torch.Tensor
    """(num_seqs, max_block_id + 1) int64: a block's index in the sequence's table, or -1 if not in it."""


def _eager_flex(*args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():  # eager is deliberate on CPU: silence "call torch.compile" advice
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile", category=UserWarning)
        return flex_attention(*args, **kwargs)


@cache
def _compiled_flex() -> Callable[..., Any]:
    return torch.compile(flex_attention, dynamic=True)


class FlexBackend(AttentionBackend[FlexMetadata]):
    """torch FlexAttention over the paged pool with a per-step block mask."""

    name = "flex"

    def prepare(self, seqs: Sequence[ScheduledSeq]) -> FlexMetadata:
        common = self._paged_common(seqs)
        num_tables = [-(-s.seq_len // self.block_size) for s in seqs]
        max_block = max(max(s.block_table[:n]) for s, n in zip(seqs, num_tables, strict=True))
        p2l = torch.full((len(seqs), max_block + 1), -1, dtype=torch.int64)  # (num_seqs, max_block + 1)
        for i, (s, n) in enumerate(zip(seqs, num_tables, strict=True)):
            p2l[i, torch.as_tensor(list(s.block_table[:n]))] = torch.arange(n)
        query_seq = torch.repeat_interleave(
            torch.arange(len(seqs)), torch.tensor([s.num_new_tokens for s in seqs])
        )  # (num_tokens,)
        query_pos = torch.cat([torch.arange(s.num_computed_tokens, s.seq_len) for s in seqs])  # (num_tokens,)
        return FlexMetadata(
            **common,
            block_mask=None,
            query_seq=query_seq.to(self.device),
            query_pos=query_pos.to(self.device),
            physical_to_logical=p2l.to(self.device),
        )

    def _block_mask(self, meta: FlexMetadata, num_slots: int) -> BlockMask:
        bs = self.block_size
        p2l, query_seq, query_pos = meta.physical_to_logical, meta.query_seq, meta.query_pos
        max_block = p2l.shape[1] - 1

        def mask_mod(
            b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
        ) -> torch.Tensor:
            block = torch.clamp(kv_idx // bs, max=max_block)  # blocks past the highest one in use: not ours
            logical = p2l[query_seq[q_idx], block]
            kv_pos = logical * bs + kv_idx % bs
            return (logical >= 0) & (kv_idx // bs <= max_block) & (kv_pos <= query_pos[q_idx])

        return create_block_mask(
            mask_mod, B=None, H=None, Q_LEN=meta.num_tokens, KV_LEN=num_slots, device=self.device,
            _compile=self.device.type == "cuda",
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_cache: torch.Tensor | None,
        meta: FlexMetadata,
    ) -> torch.Tensor:
        if layer_cache is None:
            raise ValueError(f"{self.name} attends over the paged KV pool: pass a KV cache")
        write_kv(layer_cache, k, v, meta.slot_mapping)
        _, num_blocks, block_size, num_kv_heads, head_dim = layer_cache.shape
        num_slots = num_blocks * block_size
        if meta.block_mask is None:
            meta.block_mask = self._block_mask(meta, num_slots)
        k_pool = layer_cache[0].view(num_slots, num_kv_heads, head_dim)  # (num_slots, kv_heads, head_dim)
        v_pool = layer_cache[1].view(num_slots, num_kv_heads, head_dim)  # (num_slots, kv_heads, head_dim)
        # Eager on CPU: compiling costs seconds per shape there and the tests' pools are tiny.
        attend: Callable[..., Any] = _compiled_flex() if q.device.type == "cuda" else _eager_flex
        out = attend(
            q.transpose(0, 1).unsqueeze(0),  # (1, num_heads, num_tokens, head_dim)
            k_pool.transpose(0, 1).unsqueeze(0).to(q.dtype),  # (1, kv_heads, num_slots, head_dim)
            v_pool.transpose(0, 1).unsqueeze(0).to(q.dtype),  # (1, kv_heads, num_slots, head_dim)
            block_mask=meta.block_mask,
            enable_gqa=True,
        )  # (1, num_heads, num_tokens, head_dim)
        return out.squeeze(0).transpose(0, 1).contiguous()  # (num_tokens, num_heads, head_dim)
