"""Attention backends behind one protocol, by name: ``BACKENDS["sdpa_gather"](block_size=16, device=...)``.

| name | what | where |
|---|---|---|
| dense | no KV cache; recomputes each sequence from scratch (the test oracle) | tests |
| sdpa_gather | gather each sequence's pages, SDPA (lower-right causal for chunks) | CPU; GPU reference |
| triton_paged | own Triton split-KV decode kernel over the pool; prompt chunks via sdpa_gather | CUDA |
| flex | torch FlexAttention over the whole pool with a per-step block mask | CUDA fallback |
"""

from __future__ import annotations

from typing import Any

from calibration.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    PagedMetadata,
    ScheduledSeq,
    step_positions,
)
from calibration.engine.attention.dense import DenseBackend
from calibration.engine.attention.flex import FlexBackend
from calibration.engine.attention.sdpa_gather import SdpaGatherBackend
from calibration.engine.attention.triton_paged import TritonPagedBackend

BACKENDS: dict[str, type[AttentionBackend[Any]]] = {
    cls.name: cls for cls in (DenseBackend, SdpaGatherBackend, TritonPagedBackend, FlexBackend)
}

__all__ = [
    "BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "PagedMetadata",
    "ScheduledSeq",
    "step_positions",
]
