"""Attention backends against a float64 reference on random pools and steps; the KV pool's sizing and swaps."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration.engine.attention import BACKENDS, ScheduledSeq
from calibration.engine.attention.base import slot_mapping, write_kv
from calibration.engine.configs import get_model
from calibration.engine.kv_cache import (
    KVCache,
    block_bytes,
    kv_budget_bytes,
    num_blocks_for_budget,
)

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 16, 4, 48


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """float64 GQA attention of the last len(q) positions over all len(k) keys, causal (lower right).

    q: (num_new, num_heads, head_dim); k, v: (seq_len, num_kv_heads, head_dim).
    """
    num_new, num_heads, head_dim = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    kd = k.double().repeat_interleave(group, dim=1)  # (seq_len, num_heads, head_dim)
    vd = v.double().repeat_interleave(group, dim=1)  # (seq_len, num_heads, head_dim)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kd) / head_dim**0.5  # (num_heads, num_new, seq_len)
    q_pos = torch.arange(seq_len - num_new, seq_len)[:, None]
    scores = scores.masked_fill(torch.arange(seq_len)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vd)  # (num_new, num_heads, head_dim)


@dataclass
class RandomStep:
    """A pool with each sequence's cached context written at shuffled blocks, plus the step's new q/k/v."""

    seqs: list[ScheduledSeq]
    layer_cache: torch.Tensor  # (2, num_blocks, block_size, num_kv_heads, head_dim)
    q: torch.Tensor  # (num_tokens, num_heads, head_dim)
    k: torch.Tensor  # (num_tokens, num_kv_heads, head_dim)
    v: torch.Tensor  # (num_tokens, num_kv_heads, head_dim)
    expected: torch.Tensor  # (num_tokens, num_heads, head_dim) float64


def random_step(shapes: list[tuple[int, int]], shared_blocks: int, seed: int) -> RandomStep:
    """``shapes``: (num_computed, num_new) per sequence; sequence 1 reuses sequence 0's first
    ``shared_blocks`` blocks (clipped to what both have cached), as a prefix-cache hit does."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(NUM_BLOCKS, generator=g).tolist()
    cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    seqs: list[ScheduledSeq] = []
    ctx_k: list[torch.Tensor] = []
    ctx_v: list[torch.Tensor] = []
    for i, (computed, new) in enumerate(shapes):
        k_ctx = torch.randn(computed, NUM_KV_HEADS, HEAD_DIM, generator=g)  # (num_computed, kv_heads, head_dim)
        v_ctx = torch.randn(computed, NUM_KV_HEADS, HEAD_DIM, generator=g)  # (num_computed, kv_heads, head_dim)
        table: list[int] = []
        if i == 1:
            n = min(shared_blocks, computed // BLOCK_SIZE, shapes[0][0] // BLOCK_SIZE)
            table = list(seqs[0].block_table[:n])
            k_ctx[: n * BLOCK_SIZE] = ctx_k[0][: n * BLOCK_SIZE]
            v_ctx[: n * BLOCK_SIZE] = ctx_v[0][: n * BLOCK_SIZE]
        table = table + [free.pop() for _ in range(-(-(computed + new) // BLOCK_SIZE) - len(table))]
        if computed:  # the cached context, as earlier steps would have left it
            context = ScheduledSeq(num_new_tokens=computed, num_computed_tokens=0, block_table=table)
            write_kv(cache, k_ctx, v_ctx, slot_mapping([context], BLOCK_SIZE))
        seqs.append(ScheduledSeq(num_new_tokens=new, num_computed_tokens=computed, block_table=table))
        ctx_k.append(k_ctx)
        ctx_v.append(v_ctx)
    num_tokens = sum(new for _, new in shapes)
    q = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, generator=g)
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=g)
    v = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=g)
    expected, lo = [], 0
    for s, kc, vc in zip(seqs, ctx_k, ctx_v, strict=True):
        hi = lo + s.num_new_tokens
        expected.append(reference_attention(q[lo:hi], torch.cat([kc, k[lo:hi]]), torch.cat([vc, v[lo:hi]])))
        lo = hi
    return RandomStep(seqs, cache, q, k, v, torch.cat(expected))


def run_backend(name: str, step: RandomStep) -> torch.Tensor:
    backend = BACKENDS[name](block_size=BLOCK_SIZE, device="cpu")
    return backend.forward(step.q, step.k, step.v, step.layer_cache, backend.prepare(step.seqs))


MIXED = [(0, 7), (9, 1), (12, 5), (3, 1), (0, 1)]  # prompt, decode, chunk over prefix, decode, 1-token prompt


@pytest.mark.parametrize("backend", ["sdpa_gather", "flex"])
def test_backend_matches_reference_on_a_mixed_step(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "flex":  # see test_model: the eager debug path skips per-shape dynamo tracing on CPU
        monkeypatch.setattr(torch.nn.attention.flex_attention, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)
    step = random_step(MIXED, shared_blocks=2, seed=0)
    torch.testing.assert_close(run_backend(backend, step).double(), step.expected, atol=1e-5, rtol=1e-5)


def test_new_tokens_land_in_their_slots() -> None:
    step = random_step([(5, 3), (0, 2)], shared_blocks=0, seed=1)
    run_backend("sdpa_gather", step)
    slots = slot_mapping(step.seqs, BLOCK_SIZE)
    k_pool = step.layer_cache[0].reshape(-1, NUM_KV_HEADS, HEAD_DIM)  # (num_slots, kv_heads, head_dim)
    v_pool = step.layer_cache[1].reshape(-1, NUM_KV_HEADS, HEAD_DIM)  # (num_slots, kv_heads, head_dim)
    assert torch.equal(k_pool[slots], step.k) and torch.equal(v_pool[slots], step.v)


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(0, 20), st.integers(1, 9)), min_size=1, max_size=4),
    shared_blocks=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_sdpa_gather_matches_reference_on_random_steps(
    shapes: list[tuple[int, int]], shared_blocks: int, seed: int
) -> None:
    step = random_step(shapes, shared_blocks, seed)
    torch.testing.assert_close(run_backend("sdpa_gather", step).double(), step.expected, atol=1e-5, rtol=1e-5)


INTERPRETER_NOISE = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


@INTERPRETER_NOISE
def test_triton_backend_matches_reference_on_a_mixed_step(triton_backend_ready: None) -> None:
    step = random_step(MIXED, shared_blocks=2, seed=2)
    torch.testing.assert_close(run_backend("triton_paged", step).double(), step.expected, atol=1e-5, rtol=1e-5)


@INTERPRETER_NOISE
def test_triton_decode_kernel_matches_float64(triton_backend_ready: None) -> None:
    """Direct kernel call: GQA group of 4, context lengths 1..38 over shuffled pages, split so some
    sequences have empty splits (the merge must weight them zero)."""
    from calibration.engine.attention.triton_paged import paged_decode

    g = torch.Generator().manual_seed(3)
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 8, 2, 32, 4, 40
    lens = [1, 9, 38]
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    q = torch.randn(len(lens), num_heads, head_dim, generator=g)
    free = torch.randperm(num_blocks, generator=g).tolist()
    tables = torch.zeros(len(lens), -(-max(lens) // block_size), dtype=torch.int32)
    expected = []
    for i, n in enumerate(lens):
        pages = [free.pop() for _ in range(-(-n // block_size))]
        tables[i, : len(pages)] = torch.tensor(pages)
        slots = (torch.tensor(pages)[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:n]
        k_flat = k_cache.reshape(-1, num_kv_heads, head_dim)  # (num_slots, kv_heads, head_dim)
        v_flat = v_cache.reshape(-1, num_kv_heads, head_dim)  # (num_slots, kv_heads, head_dim)
        expected.append(reference_attention(q[i : i + 1], k_flat[slots], v_flat[slots]))
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_decode(q, k_cache, v_cache, tables, seq_lens, num_splits=4)
    torch.testing.assert_close(out.double(), torch.cat(expected), atol=1e-5, rtol=1e-5)


def test_triton_kernels_compile_for_h200() -> None:
    """Ahead-of-time compile to sm_90 cubins at Llama-3-8B's shapes (group 4, head_dim 128, block 16), bf16
    and fp32, no GPU needed. A fresh process: this session may have imported triton in interpreter mode."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    code = (
        "from calibration.engine.attention.triton_paged import compile_kernels\n"
        "for dtype in ('bf16', 'fp32'):\n"
        "    assert all(compile_kernels(arch=90, dtype=dtype).values())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["triton_paged", "flex"])
def test_gpu_backends_match_sdpa_gather_in_bf16(backend: str) -> None:
    """Llama-3-8B head shapes, block 16, bf16: each GPU backend against the gather reference."""
    g = torch.Generator(device="cuda").manual_seed(0)
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 32, 8, 128, 16, 2048
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=g, device="cuda")
    cache = cache.to(torch.bfloat16)
    perm = torch.randperm(num_blocks, generator=g, device="cuda").tolist()
    shapes = [(0, 300), (1000, 1), (4000, 1), (517, 64), (33, 1), (12000, 1)]
    seqs = [
        ScheduledSeq(
            num_new_tokens=new,
            num_computed_tokens=computed,
            block_table=[perm.pop() for _ in range(-(-(computed + new) // block_size))],
        )
        for computed, new in shapes
    ]
    num_tokens = sum(n for _, n in shapes)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=g, device="cuda").to(torch.bfloat16)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g, device="cuda").to(torch.bfloat16)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g, device="cuda").to(torch.bfloat16)
    outs = {}
    for name in ("sdpa_gather", backend):
        b = BACKENDS[name](block_size=block_size, device="cuda")
        outs[name] = b.forward(q, k, v, cache.clone(), b.prepare(seqs)).float()
    torch.testing.assert_close(outs[backend], outs["sdpa_gather"], atol=2e-2, rtol=2e-2)


# KV cache


def test_block_bytes_and_budget_sizing() -> None:
    shape = get_model("tiny")  # 2 layers, 2 KV heads, head_dim 16
    assert block_bytes(shape, 16, torch.float32) == 16 * 2 * 2 * 2 * 16 * 4
    assert block_bytes(get_model("llama-3-8b"), 16, torch.bfloat16) == 16 * 128 * 1024  # 128 KiB per token
    budget = kv_budget_bytes("cpu", memory_fraction=0.5, reserve_bytes=1000, cpu_memory_bytes=1_000_000)
    assert budget == 499_000
    assert num_blocks_for_budget(shape, 16, torch.float32, budget) == 499_000 // 8192
    kv = KVCache.from_budget(shape, budget, block_size=16, dtype=torch.float32)
    assert kv.num_blocks == 60 and kv.num_bytes == 60 * 8192 <= budget
    assert kv.pool.shape == (2, 2, 60, 16, 2, 16)
    with pytest.raises(ValueError, match="cpu_memory_bytes"):
        kv_budget_bytes("cpu")
    with pytest.raises(ValueError, match="memory_fraction"):
        kv_budget_bytes("cpu", memory_fraction=1.5, cpu_memory_bytes=10)
    with pytest.raises(ValueError, match="power of two"):
        KVCache(shape, num_blocks=4, block_size=12)


def test_write_then_swap_out_and_in_round_trip() -> None:
    shape = get_model("tiny")
    kv = KVCache(shape, num_blocks=10, block_size=4, dtype=torch.float32)
    g = torch.Generator().manual_seed(4)
    seq = ScheduledSeq(num_new_tokens=7, num_computed_tokens=0, block_table=[6, 3])
    slots = slot_mapping([seq], 4)
    written = []
    for layer in range(shape.num_layers):
        k = torch.randn(7, shape.num_kv_heads, shape.head_dim, generator=g)
        v = torch.randn(7, shape.num_kv_heads, shape.head_dim, generator=g)
        kv.write(layer, k, v, slots)
        written.append((k, v))
    assert torch.equal(kv.pool[1, 0, 3, 2], written[1][0][6])  # token 6 = block 3 (second), offset 2

    host = kv.swap_out([6, 3])
    assert host.device.type == "cpu" and host.shape == (2, 2, 2, 4, 2, 16)
    before = kv.pool[:, :, [6, 3]].clone()
    kv.pool.zero_()
    kv.swap_in(host, [1, 8])  # preempted blocks come back wherever the allocator finds room
    assert torch.equal(kv.pool[:, :, [1, 8]], before)
    assert int(kv.pool[:, :, [6, 3]].count_nonzero()) == 0
    with pytest.raises(ValueError, match="shape"):
        kv.swap_in(host, [1])
    with pytest.raises(ValueError, match="block ids"):
        kv.swap_out([10])
