"""The physical paged KV pool: one tensor, its sizing, slot-mapped writes and host swaps.

Layout (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim): a layer's K (or V) for one block is
contiguous, so a block is the unit of a swap copy and a layer view is a plain slice. The pool never decides
which blocks a sequence owns; block ids come from the shared scheduler's block pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from calibration.engine.attention.base import write_kv
from calibration.engine.configs import ModelShape


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def block_bytes(shape: ModelShape, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers, K and V."""
    return block_size * shape.kv_bytes_per_token(dtype_bytes(dtype))


def kv_budget_bytes(
    device: torch.device | str,
    *,
    memory_fraction: float = 0.9,
    reserve_bytes: int = 0,
    cpu_memory_bytes: int | None = None,
) -> int:
    """Bytes the KV pool may take.

    CUDA: free memory now (weights already loaded) x ``memory_fraction`` - ``reserve_bytes`` (activation
    peak, CUDA graph pools). CPU has no reliable "free" figure for a process, so the caller gives a budget in
    ``cpu_memory_bytes`` and the same fraction and reserve apply to it.
    """
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    device = torch.device(device)
    if device.type == "cuda":
        free_bytes, _total = torch.cuda.mem_get_info(device)
        base = free_bytes
    elif cpu_memory_bytes is None:
        raise ValueError("on CPU give cpu_memory_bytes (or size the pool by block count)")
    else:
        base = cpu_memory_bytes
    return max(0, int(base * memory_fraction) - reserve_bytes)


def num_blocks_for_budget(shape: ModelShape, block_size: int, dtype: torch.dtype, budget_bytes: int) -> int:
    """How many whole blocks fit in ``budget_bytes``."""
    return budget_bytes // block_bytes(shape, block_size, dtype)


class KVCache:
    """The paged K/V pool of every layer on one device."""

    def __init__(
        self,
        shape: ModelShape,
        *,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        self.shape = shape
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device)
        # Zeros, not empty: a bug that reads an unwritten slot then gives a wrong number, not a NaN lottery.
        self.pool = torch.zeros(
            (shape.num_layers, 2, num_blocks, block_size, shape.num_kv_heads, shape.head_dim),
            dtype=dtype,
            device=self.device,
        )  # (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)

    @classmethod
    def from_budget(
        cls,
        shape: ModelShape,
        budget_bytes: int,
        *,
        block_size: int = 16,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        """A pool of as many blocks as ``budget_bytes`` holds (see ``kv_budget_bytes``)."""
        num_blocks = num_blocks_for_budget(shape, block_size, dtype, budget_bytes)
        return cls(shape, num_blocks=num_blocks, block_size=block_size, dtype=dtype, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return self.pool.dtype

    @property
    def num_bytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def layer(self, index: int) -> torch.Tensor:
        """(2, num_blocks, block_size, num_kv_heads, head_dim) view of one layer."""
        return self.pool[index]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store (num_tokens, num_kv_heads, head_dim) K and V rows of ``layer`` at their slots."""
        write_kv(self.pool[layer], k, v, slot_mapping)

    def _index(self, block_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(block_ids, dtype=torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks):
            raise ValueError(f"block ids must be in [0, {self.num_blocks}), got {ids.tolist()}")
        return ids.to(self.device)

    def swap_out(self, block_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Copy blocks to a host tensor (num_layers, 2, len(block_ids), block_size, kv_heads, head_dim).

        On CUDA the host tensor is pinned so the copy runs at link speed; the call returns once it is done.
        """
        gathered = self.pool.index_select(2, self._index(block_ids))  # (layers, 2, n, bs, kv_heads, head_dim)
        if self.device.type != "cuda":
            return gathered
        host = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
        host.copy_(gathered)
        return host

    def swap_in(self, host: torch.Tensor, block_ids: Sequence[int] | torch.Tensor) -> None:
        """Copy a ``swap_out`` tensor back into (possibly different) blocks."""
        ids = self._index(block_ids)
        expected = (*self.pool.shape[:2], ids.numel(), *self.pool.shape[3:])
        if tuple(host.shape) != expected:
            raise ValueError(f"host tensor has shape {tuple(host.shape)}, expected {expected}")
        self.pool.index_copy_(2, ids, host.to(self.device, self.dtype))

    def copy_blocks_to(self, other: KVCache, src_ids: Sequence[int], dst_ids: Sequence[int]) -> None:
        """Copy blocks of every layer, K and V, into ``other``'s blocks ``dst_ids`` (the same count, in
        order): a KV transfer between two engines' pools, with the block table remapped. The pools must
        hold the same model's KV in the same layout and dtype; ``other`` may live on another device."""
        if len(src_ids) != len(dst_ids):
            raise ValueError(f"{len(src_ids)} source blocks but {len(dst_ids)} destinations")
        if (self.pool.shape[:2] != other.pool.shape[:2] or self.pool.shape[3:] != other.pool.shape[3:]
                or self.dtype != other.dtype):
            raise ValueError(f"pools of different layouts: {tuple(self.pool.shape)} {self.dtype} and "
                             f"{tuple(other.pool.shape)} {other.dtype}")
        if not src_ids:
            return
        gathered = self.pool.index_select(2, self._index(src_ids))  # (layers, 2, n, bs, kv_heads, head_dim)
        other.pool.index_copy_(2, other._index(dst_ids), gathered.to(other.device))
