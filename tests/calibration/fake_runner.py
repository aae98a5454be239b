"""A stand-in for ``ModelRunner`` where only the profiler's bookkeeping is under test: it records every
step it is handed, checks the rows' blocks, and takes a "time" that is a fixed function of the step
(times ``slowdown``, a host that runs uniformly slower)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class FakeTiming:
    device_s: float
    cycle_s: float


class FakeRunner:
    def __init__(self, num_blocks: int = 4096, block_size: int = 16, slowdown: float = 1.0) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.slowdown = slowdown
        self.calls: list[list[Any]] = []

    def execute_timed(self, seqs: Sequence[Any], input_ids: Sequence[int]) -> tuple[list[int], FakeTiming]:
        self.calls.append(list(seqs))
        assert len(input_ids) == sum(s.num_new_tokens for s in seqs)
        blocks = [b for s in seqs for b in s.block_table]
        assert len(blocks) == len(set(blocks)), "rows must not share physical blocks"
        assert all(0 <= b < self.num_blocks for b in blocks)
        tokens = sum(s.num_new_tokens for s in seqs)
        device = 1e-3 + 1e-5 * tokens + 1e-7 * sum(s.seq_len for s in seqs)
        return [0] * len(seqs), FakeTiming(device_s=device * self.slowdown, cycle_s=(device + 2e-4) * self.slowdown)
