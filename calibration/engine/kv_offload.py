"""Host-memory KV offload for the real engine: the bytes behind the core's KV tiers.

The core decides everything (``simulator.core.kv_tiers``): which evicted block moves down, which tier
keeps or drops it, whether an admission loads a prefix from a tier or recomputes it. This module only
moves bytes: when the device's prefix cache evicts a block (``BlockPool.on_evict``, called before the block
is handed out again, so its bytes are intact) it copies the block to a host tensor kept by hash; when a
plan carries loads (``StepPlan.loads``) it copies those tensors into the fresh device blocks the core gave
the request, before the step's forward. Bytes of hashes no tier holds any more are dropped after each step.

Every tier's bytes live in host memory here (a disk or remote tier of the engine is host memory too); tiers
written as blocks are computed (``TierSource.COMPUTE``) are refused: their bytes exist only after the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from simulator.core.kv_tiers import KVTiers, LoadOp, TierSource
from simulator.core.step import StepPlan


class HostKVBlocks:
    """Host copies of evicted device blocks, by hash, for the engine's KV tiers."""

    def __init__(self, tiers: KVTiers, swap_out: Callable[[Sequence[int]], torch.Tensor],
                 swap_in: Callable[[torch.Tensor, Sequence[int]], None]) -> None:
        if tiers.written_on_compute or any(s.spec.source is TierSource.COMPUTE for s in tiers.stores):
            raise ValueError("the engine's tiers take blocks on eviction: a tier written on compute is the "
                             "simulator's (its bytes exist only once the step has run)")
        self.tiers = tiers
        self._swap_out = swap_out
        self._swap_in = swap_in
        self.blocks: dict[int, torch.Tensor] = {}
        """Hash -> (num_layers, 2, 1, block_size, num_kv_heads, head_dim) host copy of the block."""
        self.num_offloaded = 0
        self.num_loaded = 0

    def on_evict(self, block_hash: int, block_id: int) -> None:
        """``BlockPool.on_evict``: copy the block out, then let the core's tiers account for it."""
        self.blocks[block_hash] = self._swap_out([block_id])  # (layers, 2, 1, bs, kv_heads, head_dim)
        self.num_offloaded += 1
        self.tiers.on_evict(block_hash, block_id)

    def load(self, plan: StepPlan) -> None:
        """Copy the plan's loads into their device blocks (before its forward)."""
        for op in plan.loads or ():
            self._load(op)

    def _load(self, op: LoadOp) -> None:
        missing = [h for h in op.block_hashes if h not in self.blocks]
        if missing:
            raise RuntimeError(f"request {op.request_id}: no host copy of {len(missing)} block(s) the core loads")
        host = torch.cat([self.blocks[h] for h in op.block_hashes], dim=2)  # (layers, 2, n, bs, kv_heads, hd)
        self._swap_in(host, op.block_ids)
        self.num_loaded += len(op.block_ids)

    def prune(self, keep: Sequence[StepPlan | None] = ()) -> None:
        """Drop copies of hashes no tier holds, except those a plan still to run loads."""
        held: set[int] = set()
        for store in self.tiers.stores:
            held.update(store.hashes())
        for plan in keep:
            if plan is not None:
                for op in plan.loads or ():
                    held.update(op.block_hashes)
        for block_hash in [h for h in self.blocks if h not in held]:
            del self.blocks[block_hash]


class MeasuredTierCost:
    """The engine's ``TierCost``: a load moves ``block_bytes`` per block at ``read_bytes_per_s`` after
    ``latency_s`` (measured by ``benchmarks/kv_offload.py``); a prefill costs ``prefill_s_per_token``."""

    def __init__(self, *, block_bytes: int, read_bytes_per_s: float, latency_s: float,
                 prefill_s_per_token: float) -> None:
        self.block_bytes = block_bytes
        self.read_bytes_per_s = read_bytes_per_s
        self.latency_s = latency_s
        self.prefill_s_per_token = prefill_s_per_token

    def load_s(self, num_blocks_by_tier: Sequence[int]) -> float:
        n = sum(num_blocks_by_tier)
        return self.latency_s + n * self.block_bytes / self.read_bytes_per_s if n else 0.0

    def prefill_s(self, num_computed_tokens: int, num_new_tokens: int) -> float:
        return num_new_tokens * self.prefill_s_per_token
