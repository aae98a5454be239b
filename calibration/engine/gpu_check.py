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


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckPlan:
    """What one run checks: Llama-3-8B bf16 shapes on a GPU, or the tiny fp32 rehearsal (``--dry-run``)."""

    dry_run: bool
    device: torch.device
    shape: ModelShape
    """Model of the decode benchmark."""
    dtype: torch.dtype
    batch_sizes: list[int]
    """Decode batches benchmarked; the first is held to the floor."""
    context: int
    """Context tokens of every decode row."""
    iters: int
    """Timed steps per batch size."""
    target: float
    """Largest allowed batch-1 decode step / floor."""
    out: Path
    """Folder of gpu_check.json."""
    block_size: int = 16

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


class CheckReport:
    """What the check finds, printed as each figure comes and saved to gpu_check.json at the end."""

    def __init__(self, plan: CheckPlan) -> None:
        self.data: dict[str, Any] = {"dry_run": plan.dry_run, "device": str(plan.device), "model": plan.shape.name,
                                     "dtype": str(plan.dtype)}
        self.failures: list[str] = []  # failed correctness checks; a missed speed target is not one

    def say(self, key: str, value: Any) -> None:
        self.data[key] = value
        print(f"{key}: {value}", flush=True)

    def save(self, out: Path) -> int:
        """Write gpu_check.json; the exit status: 1 if a correctness check failed."""
        self.data["failures"] = self.failures
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.json").write_text(json.dumps(self.data, indent=2))
        failures = self.failures
        print(f"{'FAILED: ' + '; '.join(failures) if failures else 'correctness OK'}; wrote {out / 'gpu_check.json'}")
        return 1 if failures else 0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (or the given device)")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu in dry-run mode")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check_out"))
    parser.add_argument("--batch-sizes", default="1,32,256")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--target", type=float, default=1.25, help="batch-1 decode / floor must be <= this")
    return parser.parse_args(argv)


def _plan(args: argparse.Namespace, device: torch.device) -> CheckPlan:
    dry = args.dry_run
    return CheckPlan(
        dry_run=dry, device=device, shape=get_model("tiny" if dry else "llama-3-8b"),
        dtype=torch.float32 if dry else torch.bfloat16,
        batch_sizes=[1, 2, 4] if dry else [int(b) for b in args.batch_sizes.split(",")],
        context=48 if dry else args.context, iters=3 if dry else args.iters, target=args.target, out=args.out,
    )


def check_ceilings(plan: CheckPlan, report: CheckReport) -> float:
    """Step 2: device copy bandwidth and a square GEMM's FLOP/s; returns the copy bandwidth, bytes/s."""
    copy_bw = copy_bandwidth(plan.device, (1 << 30) if plan.cuda else (8 << 20))
    gemm = matmul_flops(plan.device, 8192 if plan.cuda else 256, plan.dtype)
    report.say("copy_bandwidth_GBps", round(copy_bw / 1e9, 1))
    report.say("gemm_TFLOPs", round(gemm / 1e12, 3))
    return copy_bw


def check_correctness(plan: CheckPlan, report: CheckReport) -> bool:
    """Step 3: the attention backend against the float64 reference, and CUDA-graph decode against eager;
    returns whether the Triton backend can run here."""
    dry, device = plan.dry_run, plan.device
    why_not = _triton_runnable(device)
    backend = "triton_paged" if why_not is None else "sdpa_gather"  # the CPU rehearsal checks the reference path
    if why_not is not None:
        report.say("triton_skipped", why_not)
    heads = (4, 2, 16) if dry else (32, 8, 128)
    shapes = [(0, 37), (40, 1), (100, 1), (33, 20), (0, 1), (5, 1)] if dry else [
        (0, 300), (1000, 1), (4000, 1), (517, 64), (33, 1), (12000, 1)
    ]
    err = attention_error(
        backend, device=device, dtype=plan.dtype, num_heads=heads[0], num_kv_heads=heads[1], head_dim=heads[2],
        block_size=plan.block_size, shapes=shapes,
    )
    tolerance = 1e-4 if plan.dtype == torch.float32 else 2e-2
    report.say(f"{backend}_vs_float64_rel_err", f"{err:.2e} (tolerance {tolerance:.0e})")
    if not err < tolerance:
        report.failures.append(f"{backend} attention error {err:.2e}")
    if plan.cuda and why_not is None:
        ok = graph_matches_eager(get_model("small"), device=device, block_size=plan.block_size)
        report.say("cuda_graph_decode_equals_eager", ok)
        if not ok:
            report.failures.append("CUDA-graph decode differs from eager")
    return why_not is None


def check_decode(plan: CheckPlan, report: CheckReport, *, copy_bw: float, triton: bool) -> None:
    """Step 4: decode steps at each batch size (CUDA graphs and Triton decode when they run), batch 1
    against the floor weight bytes / copy bandwidth."""
    shape, dtype, context, batch_sizes = plan.shape, plan.dtype, plan.context, plan.batch_sizes
    pages = -(-context // plan.block_size)
    runner = ModelRunner(
        shape, device=str(plan.device), dtype=dtype, num_blocks=max(batch_sizes) * pages + 1,
        block_size=plan.block_size, backend="triton_paged" if plan.cuda and triton else "sdpa_gather",
        cuda_graphs=plan.cuda and triton, max_graph_batch=max(batch_sizes),
    )
    weight_bytes = shape.num_params_read_per_step * dtype_bytes(dtype)
    floor_s = weight_bytes / copy_bw
    report.say("weight_GB", round(weight_bytes / 1e9, 3))
    report.say("floor_ms", round(floor_s * 1e3, 3))
    results = []
    header = ("batch", "ctx", "step ms", "cycle ms", "tok/s", "GB/s", "TFLOP/s", "x floor")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (6, 6, 9, 9, 10, 9, 8, 8), strict=True)))
    for batch in batch_sizes:
        seqs, step_s, cycle_s = decode_steps(runner, batch, context, warmup=3, iters=plan.iters)
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
    report.data["decode"] = results
    ratio = results[0]["step_s"] / floor_s
    verdict = "PASS" if ratio <= plan.target else "MISS"
    report.say("batch1_over_floor", f"{ratio:.2f} (target <= {plan.target}: {verdict})")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    device = torch.device(args.device or ("cpu" if args.dry_run else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run for the CPU rehearsal", file=sys.stderr)
        return 2
    plan = _plan(args, device)
    report = CheckReport(plan)
    # 1. environment
    report.say("torch", torch.__version__)
    report.say("device_name", torch.cuda.get_device_name(device) if plan.cuda else "cpu")
    if plan.cuda:
        report.say("nvidia_smi_before", _nvidia_smi())
    copy_bw = check_ceilings(plan, report)  # 2.
    triton = check_correctness(plan, report)  # 3.
    check_decode(plan, report, copy_bw=copy_bw, triton=triton)  # 4.
    if plan.cuda:
        report.say("nvidia_smi_after", _nvidia_smi())
    return report.save(plan.out)


if __name__ == "__main__":
    sys.exit(main())
