"""The engine's device check: ceilings, GPU kernel correctness, and Llama-3-8B decode against its floor.

    python -m calibration.engine.gpu_check                 # on a CUDA machine (about 2-3 minutes)
    python -m calibration.engine.gpu_check --dry-run       # tiny shapes on CPU: proves the script runs

Steps, each printed as it finishes and all saved to ``<out>/gpu_check.json`` (``--out``, default $OUT or
./gpu_check_out):

1. environment (device, torch/triton versions, nvidia-smi clocks before and after);
2. ceilings: device copy bandwidth (read + write bytes / time) and a square GEMM's FLOP/s;
3. correctness: the Triton paged-decode backend against a float64 reference on a random mixed step
   (Llama-3-8B head shapes, block 16, bf16; relative error < 2e-2), and CUDA-graph decode = eager tokens;
4. Llama-3-8B bf16 decode at batch 1, 32, 256 (CUDA graphs, Triton decode) at a fixed context: median
   step time (CUDA events), tokens/s, achieved bytes/s and FLOP/s; batch 1 against the floor
   weight bytes / copy bandwidth (target: within 1.25x).

Exit status 1 if a correctness check fails; a missed speed target is reported, not an error. In dry-run
mode the same code runs on the ``tiny`` model in fp32 on CPU, checking SDPA-gather (or Triton when it can
run, under TRITON_INTERPRET=1) against the reference, so CPU CI keeps the script working. Every random input is seeded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from calibration.engine.attention import BACKENDS, ScheduledSeq
from calibration.engine.configs import ModelShape, get_model
from calibration.engine.kv_cache import dtype_bytes
from calibration.engine.runner import ModelRunner

# ----- ceilings ----------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn: Callable[[], object], device: torch.device, *, warmup: int, iters: int) -> float:
    """Median seconds of ``fn`` (CUDA events on a GPU, the wall clock on CPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(device: torch.device | str, num_bytes: int, *, iters: int = 10) -> float:
    """Bytes/s of a device-to-device copy, counting read plus write (as the datasheet-style 4.3 TB/s)."""
    device = torch.device(device)
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = _median_time(lambda: dst.copy_(src), device, warmup=3, iters=iters)
    return 2 * src.numel() * 4 / t


def matmul_flops(device: torch.device | str, n: int, dtype: torch.dtype, *, iters: int = 10) -> float:
    """FLOP/s of an n x n x n GEMM on random data (zeros run measurably faster on some GPUs)."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=g).to(dtype)
    b = torch.randn(n, n, device=device, generator=g).to(dtype)
    t = _median_time(lambda: a @ b, device, warmup=3, iters=iters)
    return 2 * n**3 / t


# ----- step cost, first principles ---------------------------------------------------------------------


def step_bytes(shape: ModelShape, dtype: torch.dtype, seqs: Sequence[ScheduledSeq]) -> int:
    """Bytes a step must move at least: every weight read once, each sequence's context K/V read, new
    K/V written (activations ignored)."""
    b = dtype_bytes(dtype)
    kv_token = shape.kv_bytes_per_token(b)
    context = sum(s.seq_len for s in seqs if s.num_computed_tokens > 0)
    new = sum(s.num_new_tokens for s in seqs)
    return shape.num_params_read_per_step * b + (context + new) * kv_token


def step_flops(shape: ModelShape, seqs: Sequence[ScheduledSeq]) -> float:
    """FLOPs of a step: 2 per weight per token, plus QK and PV over each causal (query, key) pair."""
    tokens = sum(s.num_new_tokens for s in seqs)
    pairs = sum(s.num_new_tokens * (s.num_computed_tokens + (s.num_new_tokens + 1) / 2) for s in seqs)
    attn = 4 * shape.num_heads * shape.head_dim * shape.num_layers * pairs
    return 2 * shape.num_params_read_per_step * tokens + attn


# ----- checks ------------------------------------------------------------------------------------------


def random_mixed_step(
    *, block_size: int, num_blocks: int, shapes: Sequence[tuple[int, int]], seed: int
) -> list[ScheduledSeq]:
    """(computed, new) per sequence → ScheduledSeqs over distinct shuffled blocks."""
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)
    return [
        ScheduledSeq(
            num_new_tokens=new,
            num_computed_tokens=computed,
            block_table=[free.pop() for _ in range(-(-(computed + new) // block_size))],
        )
        for computed, new in shapes
    ]


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, seqs: Sequence[ScheduledSeq]
) -> torch.Tensor:
    """float64 attention of a step, straight from the definition: each sequence's cached context (read
    through its block table) plus its new K/V, causal by position. Returns (num_tokens, num_heads, head_dim).

    q: (num_tokens, num_heads, head_dim); k, v: (num_tokens, num_kv_heads, head_dim); cache: (2, num_blocks,
    block_size, num_kv_heads, head_dim) holding the context before the step.
    """
    _, num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    group = q.shape[1] // num_kv_heads
    k_pool = cache[0].reshape(num_blocks * block_size, num_kv_heads, head_dim)  # (num_slots, kv_heads, hd)
    v_pool = cache[1].reshape(num_blocks * block_size, num_kv_heads, head_dim)  # (num_slots, kv_heads, hd)
    out, lo = [], 0
    for s in seqs:
        hi = lo + s.num_new_tokens
        pos = torch.arange(s.num_computed_tokens)
        table = torch.as_tensor(list(s.block_table), dtype=torch.int64)
        slots = (table[pos // block_size] * block_size + pos % block_size).to(cache.device)  # (computed,)
        keys = torch.cat([k_pool[slots], k[lo:hi]]).double().repeat_interleave(group, 1)  # (seq_len, heads, hd)
        vals = torch.cat([v_pool[slots], v[lo:hi]]).double().repeat_interleave(group, 1)  # (seq_len, heads, hd)
        scores = torch.einsum("qhd,khd->hqk", q[lo:hi].double(), keys) / head_dim**0.5  # (heads, new, seq_len)
        q_pos = torch.arange(s.num_computed_tokens, s.seq_len, device=q.device)
        k_pos = torch.arange(s.seq_len, device=q.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vals))  # (new, heads, hd)
        lo = hi
    return torch.cat(out)


def attention_error(
    backend: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    shapes: Sequence[tuple[int, int]],
) -> float:
    """Max |backend - float64 reference| / max |reference| on one random step of (computed, new) rows."""
    g = torch.Generator(device=device).manual_seed(0)
    num_blocks = sum(-(-(c + n) // block_size) for c, n in shapes) + 4
    seqs = random_mixed_step(block_size=block_size, num_blocks=num_blocks, shapes=shapes, seed=1)
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=g, device=device).to(dtype)
    num_tokens = sum(n for _, n in shapes)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=g, device=device).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g, device=device).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g, device=device).to(dtype)
    ref = reference_attention(q, k, v, cache, seqs)
    b = BACKENDS[backend](block_size=block_size, device=device)
    out = b.forward(q, k, v, cache.clone(), b.prepare(seqs)).double()
    return float((out - ref).abs().max() / ref.abs().max())


def graph_matches_eager(shape: ModelShape, *, device: torch.device, block_size: int, seed: int = 0) -> bool:
    """CUDA-graph decode (padded buckets) gives the eager runner's tokens, fp32, over a few steps."""
    common: dict[str, Any] = dict(
        device=str(device), dtype=torch.float32, num_blocks=128, block_size=block_size, backend="triton_paged"
    )
    eager = ModelRunner(shape, **common)
    graphed = ModelRunner(shape, cuda_graphs=True, max_graph_batch=16, **common)
    rng = random.Random(seed)
    for batch in (1, 3, 13):
        free = rng.sample(range(128), 8 * batch)
        tables = [free[8 * i : 8 * i + 8] for i in range(batch)]
        lens = [rng.randint(5, 100) for _ in range(batch)]
        prefill = [
            ScheduledSeq(num_new_tokens=n, num_computed_tokens=0, block_table=t)
            for n, t in zip(lens, tables, strict=True)
        ]
        ids = [rng.randrange(shape.vocab_size) for _ in range(sum(lens))]
        last = eager.execute(prefill, ids)
        graphed.execute(prefill, ids)
        for step in range(3):
            seqs = [
                ScheduledSeq(num_new_tokens=1, num_computed_tokens=n + step, block_table=t)
                for n, t in zip(lens, tables, strict=True)
            ]
            a, b = eager.execute(seqs, last), graphed.execute(seqs, last)
            if a != b:
                return False
            last = a
    return True


# ----- decode benchmark --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecodeResult:
    batch: int
    context: int
    step_s: float
    """Median device time of one decode step."""
    cycle_s: float
    """Median cycle time (host preparation + device + sync)."""
    tokens_per_s: float
    bytes_per_s: float
    flops_per_s: float
    floor_s: float
    """Weight bytes / measured copy bandwidth: the time no decode step can beat."""


def decode_steps(
    runner: ModelRunner, batch: int, context: int, *, warmup: int, iters: int, seed: int = 0
) -> tuple[list[ScheduledSeq], float, float]:
    """Median (device, cycle) seconds of a decode step of ``batch`` sequences at ``context`` tokens.

    The pool holds whatever it holds (zeros or earlier steps' K/V): time does not depend on values.
    """
    bs = runner.block_size
    pages = -(-context // bs)
    if batch * pages > runner.num_blocks:
        raise ValueError(f"batch {batch} x {pages} pages exceeds the pool of {runner.num_blocks} blocks")
    free = list(range(runner.num_blocks))
    random.Random(seed).shuffle(free)
    seqs = [
        ScheduledSeq(num_new_tokens=1, num_computed_tokens=context - 1, block_table=free[i * pages : (i + 1) * pages])
        for i in range(batch)
    ]
    ids = [i % runner.shape.vocab_size for i in range(batch)]
    for _ in range(warmup):
        runner.execute(seqs, ids)
    device, cycle = [], []
    for _ in range(iters):
        _tokens, timing = runner.execute_timed(seqs, ids)
        device.append(timing.device_s)
        cycle.append(timing.cycle_s)
    return seqs, statistics.median(device), statistics.median(cycle)


# ----- main --------------------------------------------------------------------------------------------


def _nvidia_smi() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw",
             "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def _triton_runnable(device: torch.device) -> str | None:
    """None when the Triton backend can run here; else why not."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "no GPU and TRITON_INTERPRET is not set"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (or the given device)")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu in dry-run mode")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check_out"))
    parser.add_argument("--batch-sizes", default="1,32,256")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--target", type=float, default=1.25, help="batch-1 decode / floor must be <= this")
    args = parser.parse_args(argv)

    dry = args.dry_run
    device = torch.device(args.device or ("cpu" if dry else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run for the CPU rehearsal", file=sys.stderr)
        return 2
    shape = get_model("tiny" if dry else "llama-3-8b")
    dtype = torch.float32 if dry else torch.bfloat16
    block_size = 16
    batch_sizes = [1, 2, 4] if dry else [int(b) for b in args.batch_sizes.split(",")]
    context = 48 if dry else args.context
    iters = 3 if dry else args.iters
    cuda = device.type == "cuda"
    report: dict[str, Any] = {"dry_run": dry, "device": str(device), "model": shape.name, "dtype": str(dtype)}
    failures: list[str] = []

    def say(key: str, value: Any) -> None:
        report[key] = value
        print(f"{key}: {value}", flush=True)

    # 1. environment
    say("torch", torch.__version__)
    say("device_name", torch.cuda.get_device_name(device) if cuda else "cpu")
    if cuda:
        say("nvidia_smi_before", _nvidia_smi())

    # 2. ceilings
    copy_bw = copy_bandwidth(device, (1 << 30) if cuda else (8 << 20))
    gemm = matmul_flops(device, 8192 if cuda else 256, dtype)
    say("copy_bandwidth_GBps", round(copy_bw / 1e9, 1))
    say("gemm_TFLOPs", round(gemm / 1e12, 3))

    # 3. correctness
    why_not = _triton_runnable(device)
    backend = "triton_paged" if why_not is None else "sdpa_gather"  # the CPU rehearsal checks the reference path
    if why_not is not None:
        say("triton_skipped", why_not)
    heads = (4, 2, 16) if dry else (32, 8, 128)
    shapes = [(0, 37), (40, 1), (100, 1), (33, 20), (0, 1), (5, 1)] if dry else [
        (0, 300), (1000, 1), (4000, 1), (517, 64), (33, 1), (12000, 1)
    ]
    err = attention_error(
        backend, device=device, dtype=dtype, num_heads=heads[0], num_kv_heads=heads[1], head_dim=heads[2],
        block_size=block_size, shapes=shapes,
    )
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    say(f"{backend}_vs_float64_rel_err", f"{err:.2e} (tolerance {tolerance:.0e})")
    if not err < tolerance:
        failures.append(f"{backend} attention error {err:.2e}")
    if cuda and why_not is None:
        ok = graph_matches_eager(get_model("small"), device=device, block_size=block_size)
        say("cuda_graph_decode_equals_eager", ok)
        if not ok:
            failures.append("CUDA-graph decode differs from eager")

    # 4. decode benchmark
    pages = -(-context // block_size)
    runner = ModelRunner(
        shape, device=str(device), dtype=dtype, num_blocks=max(batch_sizes) * pages + 1, block_size=block_size,
        backend="triton_paged" if cuda and why_not is None else "sdpa_gather",
        cuda_graphs=cuda and why_not is None, max_graph_batch=max(batch_sizes),
    )
    weight_bytes = shape.num_params_read_per_step * dtype_bytes(dtype)
    floor_s = weight_bytes / copy_bw
    say("weight_GB", round(weight_bytes / 1e9, 3))
    say("floor_ms", round(floor_s * 1e3, 3))
    results = []
    header = ("batch", "ctx", "step ms", "cycle ms", "tok/s", "GB/s", "TFLOP/s", "x floor")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (6, 6, 9, 9, 10, 9, 8, 8), strict=True)))
    for batch in batch_sizes:
        seqs, step_s, cycle_s = decode_steps(runner, batch, context, warmup=3, iters=iters)
        r = DecodeResult(
            batch=batch, context=context, step_s=step_s, cycle_s=cycle_s, tokens_per_s=batch / step_s,
            bytes_per_s=step_bytes(shape, dtype, seqs) / step_s, flops_per_s=step_flops(shape, seqs) / step_s,
            floor_s=floor_s,
        )
        results.append(asdict(r))
        print(
            f"{batch:>6} {context:>6} {step_s * 1e3:>9.3f} {cycle_s * 1e3:>9.3f} {r.tokens_per_s:>10.0f} "
            f"{r.bytes_per_s / 1e9:>9.1f} {r.flops_per_s / 1e12:>8.3f} {step_s / floor_s:>8.2f}",
            flush=True,
        )
    report["decode"] = results
    ratio = results[0]["step_s"] / floor_s
    say("batch1_over_floor", f"{ratio:.2f} (target <= {args.target}: {'PASS' if ratio <= args.target else 'MISS'})")
    if cuda:
        say("nvidia_smi_after", _nvidia_smi())
    report["failures"] = failures
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(f"{'FAILED: ' + '; '.join(failures) if failures else 'correctness OK'}; wrote {args.out / 'gpu_check.json'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
