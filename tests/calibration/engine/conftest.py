"""Fixtures for engine tests: a tiny fp32 model and a paged-step driver checked against the dense oracle.

The driver plays the scheduler's part in the smallest honest way (a shuffled free list of block ids, one
block table per sequence, shared prefix blocks by copying table entries), so tests state step plans as
{sequence: number of new tokens} and compare each step's logits with a from-scratch dense recompute.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable, Mapping

import pytest

pytest.importorskip("torch")
import torch

# Triton's CPU interpreter must be chosen before triton is first imported (its own library functions are
# wrapped at import), so it is set here, at collection, whenever there is no GPU to run the kernels on.
TRITON_INTERPRETED = False
if not torch.cuda.is_available():
    TRITON_INTERPRETED = "triton" not in sys.modules
    if TRITON_INTERPRETED:
        os.environ.setdefault("TRITON_INTERPRET", "1")

from calibration.engine.attention import BACKENDS, ScheduledSeq, step_positions  # noqa: E402
from calibration.engine.attention.dense import dense_last_logits  # noqa: E402
from calibration.engine.configs import get_model  # noqa: E402
from calibration.engine.kv_cache import KVCache  # noqa: E402
from calibration.engine.model import LlamaModel  # noqa: E402


class PagedRun:
    """Runs one model step by step on a paged backend, holding each sequence's tokens and block table."""

    def __init__(
        self, model: LlamaModel, backend: str, *, num_blocks: int = 64, block_size: int = 4, seed: int = 0
    ) -> None:
        self.model = model
        self.backend = BACKENDS[backend](block_size=block_size, device=model.device)
        self.kv = KVCache(model.shape, num_blocks=num_blocks, block_size=block_size, dtype=model.dtype)
        self.block_size = block_size
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)  # non-contiguous, out-of-order physical blocks
        self.tokens: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.tables: dict[str, list[int]] = {}

    def add(self, name: str, tokens: list[int], *, prefix_of: str | None = None, num_shared_blocks: int = 0) -> None:
        """A new sequence; with ``prefix_of``, its first blocks are the other sequence's (a prefix-cache hit)."""
        self.tokens[name] = list(tokens)
        self.tables[name] = []
        self.computed[name] = 0
        if prefix_of is not None:
            n = num_shared_blocks * self.block_size
            assert self.tokens[prefix_of][:n] == tokens[:n] and self.computed[prefix_of] >= n
            self.tables[name] = self.tables[prefix_of][:num_shared_blocks]
            self.computed[name] = n

    def step(self, plan: Mapping[str, int]) -> torch.Tensor:
        """Run {sequence: new tokens} as one step; (num_seqs, vocab) logits in plan order."""
        seqs, ids = [], []
        for name, n in plan.items():
            start = self.computed[name]
            assert start + n <= len(self.tokens[name]), "plan schedules tokens the sequence does not have"
            while len(self.tables[name]) * self.block_size < start + n:
                self.tables[name].append(self.free.pop())
            seqs.append(ScheduledSeq(num_new_tokens=n, num_computed_tokens=start, block_table=self.tables[name]))
            ids.extend(self.tokens[name][start : start + n])
        meta = self.backend.prepare(seqs)
        logits = self.model(torch.tensor(ids), step_positions(seqs), meta, self.kv)
        for name, n in plan.items():
            self.computed[name] += n
        return logits

    def dense(self, names: list[str]) -> torch.Tensor:
        """The oracle for the step just run: each sequence's computed history recomputed from scratch."""
        return dense_last_logits(self.model, [self.tokens[n][: self.computed[n]] for n in names])

    def append_greedy(self, names: list[str], logits: torch.Tensor) -> None:
        for name, row in zip(names, logits, strict=True):
            if self.computed[name] == len(self.tokens[name]):
                self.tokens[name].append(int(row.argmax()))


@pytest.fixture(scope="session")
def tiny_model() -> LlamaModel:
    return LlamaModel(get_model("tiny"), dtype=torch.float32, seed=1)


@pytest.fixture
def paged_run(tiny_model: LlamaModel) -> Callable[..., PagedRun]:
    """``paged_run(backend, model=None, num_blocks=64, block_size=4, seed=0)`` → a fresh PagedRun."""

    def make(backend: str, *, model: LlamaModel | None = None, **kwargs: int) -> PagedRun:
        return PagedRun(model or tiny_model, backend, **kwargs)

    return make


def triton_usable() -> str | None:
    """None when the Triton kernel can run here (CUDA, or the CPU interpreter); else why not."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if torch.cuda.is_available():
        return None
    import numpy as np

    if tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 4):
        return "Triton's CPU interpreter needs numpy < 2.4"
    return None


@pytest.fixture
def triton_backend_ready() -> None:
    """Skip unless the Triton kernel can run: on a GPU, or under the interpreter set up above."""
    reason = triton_usable()
    if reason is not None:
        pytest.skip(reason)
    if not torch.cuda.is_available() and not (TRITON_INTERPRETED and os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
