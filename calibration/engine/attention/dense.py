"""The dense oracle: attention with no KV cache at all, for tests of every paged path.

Each sequence's step must carry its whole token history (num_computed_tokens == 0), and attention is plain
causal SDPA over it. Nothing is stored, so nothing about paging, slot mappings or block tables can be wrong
here; a paged engine is correct when its logits and greedy tokens match these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from calibration.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    ScheduledSeq,
    query_starts,
    step_positions,
    validate_seqs,
)

if TYPE_CHECKING:
    from calibration.engine.model import LlamaModel


class DenseBackend(AttentionBackend[AttentionMetadata]):
    """Recompute every sequence from scratch with causal SDPA; the test oracle."""

    name = "dense"
    paged = False

    def prepare(self, seqs: Sequence[ScheduledSeq]) -> AttentionMetadata:
        validate_seqs(seqs, None)
        if any(s.num_computed_tokens for s in seqs):
            raise ValueError("the dense oracle has no cache: every sequence must bring its whole history")
        starts = query_starts(seqs)
        return AttentionMetadata(
            backend=self,
            num_new_tokens=[s.num_new_tokens for s in seqs],
            num_computed_tokens=[0] * len(seqs),
            query_start=starts,
            last_token_indices=torch.tensor(starts[1:], dtype=torch.int64).sub_(1).to(self.device),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_cache: torch.Tensor | None,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        for i in range(meta.num_seqs):
            lo, hi = meta.query_start[i], meta.query_start[i + 1]
            qi = q[lo:hi].transpose(0, 1).unsqueeze(0)  # (1, num_heads, seq_len, head_dim)
            ki = k[lo:hi].transpose(0, 1).unsqueeze(0)  # (1, num_kv_heads, seq_len, head_dim)
            vi = v[lo:hi].transpose(0, 1).unsqueeze(0)  # (1, num_kv_heads, seq_len, head_dim)
            oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=True)
            out[lo:hi] = oi.squeeze(0).transpose(0, 1)  # (seq_len, num_heads, head_dim)
        return out


def dense_last_logits(model: LlamaModel, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """(num_seqs, vocab) logits of each token list's last token, recomputed from scratch."""
    backend = DenseBackend(device=model.device)
    seqs = [ScheduledSeq(num_new_tokens=len(t), num_computed_tokens=0) for t in sequences]
    input_ids = torch.tensor([tok for t in sequences for tok in t], dtype=torch.int64, device=model.device)
    return model(input_ids, step_positions(seqs, model.device), backend.prepare(seqs))


def dense_greedy(model: LlamaModel, prompt: Sequence[int], num_output_tokens: int) -> list[int]:
    """Greedy continuation of one prompt, recomputing the whole history for every token."""
    tokens = list(prompt)
    for _ in range(num_output_tokens):
        tokens.append(int(dense_last_logits(model, [tokens])[0].argmax()))
    return tokens[len(prompt) :]
