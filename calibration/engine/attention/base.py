"""The attention-backend protocol and the per-step metadata every backend starts from.

A step's input contract is per scheduled sequence: how many new tokens it brings, how many of its tokens
are already in the KV cache (computed before the step), and its block table. That is exactly what a
scheduler's step plan says, so a runner builds a step without knowing which backend runs it. A backend
turns that list into device tensors once per step (`prepare`) and then attends once per layer (`forward`).

This module must never decide anything about scheduling or block allocation: block ids arrive from the
caller and are trusted to be allocated to the sequence that names them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, ClassVar, Generic, TypeVar

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledSeq:
    """One sequence's share of a step, as a scheduler's step plan states it."""

    num_new_tokens: int
    """Tokens this step computes for the sequence (1 for a decode, a chunk or whole prompt for a prefill)."""
    num_computed_tokens: int
    """Tokens whose K/V are already in the cache before the step (cached prefix or earlier chunks)."""
    block_table: Sequence[int] = ()
    """Physical block ids holding the sequence's tokens in order; must cover ``seq_len`` tokens."""

    @property
    def seq_len(self) -> int:
        """Context length after the step: the keys the last new token attends to."""
        return self.num_computed_tokens + self.num_new_tokens


@dataclass(slots=True, kw_only=True)
class AttentionMetadata:
    """What every backend needs for one step, built once and read by every layer.

    Host-side lists are kept beside the tensors on purpose: per-sequence loops slice by them without a
    device-to-host sync.
    """

    backend: AttentionBackend[Any]
    """The backend that built this metadata: one model serves every backend, and the step names its own."""
    num_new_tokens: list[int]
    num_computed_tokens: list[int]
    query_start: list[int]
    """Offsets of each sequence's new tokens in the flat token axis, length num_seqs + 1."""
    last_token_indices: torch.Tensor
    """(num_seqs,) int64: the flat index of each sequence's last new token, whose logits are sampled."""

    @property
    def num_seqs(self) -> int:
        return len(self.num_new_tokens)

    @property
    def num_tokens(self) -> int:
        return self.query_start[-1]


@dataclass(slots=True, kw_only=True)
class PagedMetadata(AttentionMetadata):
    """Metadata of a backend that reads and writes the paged KV pool."""

    block_size: int
    slot_mapping: torch.Tensor
    """(num_tokens,) int64: physical slot (block_id * block_size + offset) of every new token's K/V."""


def validate_seqs(seqs: Sequence[ScheduledSeq], block_size: int | None) -> None:
    """Reject a step the model cannot run: empty, a sequence with no new tokens, a short block table."""
    if not seqs:
        raise ValueError("a step needs at least one scheduled sequence")
    for i, s in enumerate(seqs):
        if s.num_new_tokens < 1 or s.num_computed_tokens < 0:
            raise ValueError(f"sequence {i}: need num_new_tokens >= 1, num_computed_tokens >= 0; got {s}")
        if block_size is not None and len(s.block_table) * block_size < s.seq_len:
            raise ValueError(
                f"sequence {i}: {len(s.block_table)} blocks of {block_size} cannot hold {s.seq_len} tokens"
            )


def query_starts(seqs: Sequence[ScheduledSeq]) -> list[int]:
    return [0, *accumulate(s.num_new_tokens for s in seqs)]


def step_positions(seqs: Sequence[ScheduledSeq], device: torch.device | str = "cpu") -> torch.Tensor:
    """(num_tokens,) int64 positions of the new tokens: each sequence continues where its cache ends."""
    return torch.cat(
        [torch.arange(s.num_computed_tokens, s.seq_len, dtype=torch.int64) for s in seqs]
    ).to(device)


def slot_mapping(
    seqs: Sequence[ScheduledSeq], block_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(num_tokens,) int64 physical slots of the new tokens: block_table[pos // bs] * bs + pos % bs."""
    slots = []
    for s in seqs:
        pos = torch.arange(s.num_computed_tokens, s.seq_len, dtype=torch.int64)  # (num_new,)
        table = torch.as_tensor(list(s.block_table), dtype=torch.int64)  # (num_blocks_of_seq,)
        slots.append(table[pos // block_size] * block_size + pos % block_size)
    return torch.cat(slots).to(device)


def context_slots(seqs: Sequence[ScheduledSeq], block_size: int) -> torch.Tensor:
    """(sum of seq_len,) int64 host tensor: every sequence's context slots in token order, concatenated."""
    out = []
    for s in seqs:
        num_blocks = -(-s.seq_len // block_size)
        table = torch.as_tensor(list(s.block_table[:num_blocks]), dtype=torch.int64)  # (num_blocks,)
        offsets = torch.arange(block_size, dtype=torch.int64)  # (block_size,)
        slots = (table[:, None] * block_size + offsets[None, :]).reshape(-1)  # (num_blocks * block_size,)
        out.append(slots[: s.seq_len])
    return torch.cat(out)


def write_kv(layer_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store new K/V rows in one layer's pool at their slots.

    layer_cache: (2, num_blocks, block_size, num_kv_heads, head_dim); k, v: (num_tokens, num_kv_heads,
    head_dim); slots: (num_tokens,) int64. index_copy_ on a flat view writes in place without a Python loop.
    """
    _, num_blocks, block_size, num_kv_heads, head_dim = layer_cache.shape
    num_slots = num_blocks * block_size
    k_flat = layer_cache[0].view(num_slots, num_kv_heads, head_dim)  # (num_slots, kv_heads, head_dim)
    v_flat = layer_cache[1].view(num_slots, num_kv_heads, head_dim)  # (num_slots, kv_heads, head_dim)
    k_flat.index_copy_(0, slots, k.to(layer_cache.dtype))
    v_flat.index_copy_(0, slots, v.to(layer_cache.dtype))


MetaT = TypeVar("MetaT", bound=AttentionMetadata)


class AttentionBackend(ABC, Generic[MetaT]):
    """Attention over one step's flat tokens: ``prepare`` once per step, ``forward`` once per layer."""

    name: ClassVar[str]
    paged: ClassVar[bool] = True
    """Whether forward needs a layer of the paged KV pool (False only for the dense oracle)."""

    def __init__(self, *, block_size: int = 16, device: torch.device | str = "cpu") -> None:
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        self.block_size = block_size
        self.device = torch.device(device)

    @abstractmethod
    def prepare(self, seqs: Sequence[ScheduledSeq]) -> MetaT:
        """Turn one step's sequences into device metadata (host work happens here, not per layer)."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_cache: torch.Tensor | None,
        meta: MetaT,
    ) -> torch.Tensor:
        """Attend the step's new tokens.

        q: (num_tokens, num_heads, head_dim); k, v: (num_tokens, num_kv_heads, head_dim) of the new tokens,
        RoPE applied; layer_cache: (2, num_blocks, block_size, num_kv_heads, head_dim) or None for a
        backend with ``paged = False``. Paged backends first store k, v at ``meta.slot_mapping``.
        Returns (num_tokens, num_heads, head_dim).
        """

    def _paged_common(self, seqs: Sequence[ScheduledSeq]) -> dict[str, Any]:
        """The fields of PagedMetadata, for subclasses to extend."""
        validate_seqs(seqs, self.block_size)
        starts = query_starts(seqs)
        return {
            "backend": self,
            "num_new_tokens": [s.num_new_tokens for s in seqs],
            "num_computed_tokens": [s.num_computed_tokens for s in seqs],
            "query_start": starts,
            "last_token_indices": torch.tensor(starts[1:], dtype=torch.int64).sub_(1).to(self.device),
            "block_size": self.block_size,
            "slot_mapping": slot_mapping(seqs, self.block_size, self.device),
        }
