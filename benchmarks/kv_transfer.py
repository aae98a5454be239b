"""KV transfer between two engines in one process: what copying n blocks from one paged pool into another
costs (``KVCache.copy_blocks_to``, the engine pair's transfer), and the line through it, t = latency +
n * bytes per block / bandwidth: the ``in_process`` link of ``calibration/links.yaml``.

    python benchmarks/kv_transfer.py                              # small model, fp32, CPU, block 16
    python benchmarks/kv_transfer.py --device cuda --model llama-3-8b --dtype bf16

Blocks are scattered (random ids on both sides, as a block table maps them). Each size is copied
``--repeat`` times after a warm-up and the median kept; the fit minimises the relative error over the
medians.
Numbers, never pass/fail.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from calibration.engine.configs import MODELS, get_model
from calibration.engine.kv_cache import KVCache, block_bytes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def copy_seconds(source: KVCache, target: KVCache, num_blocks: int, repeat: int, rng: random.Random) -> float:
    """Median wall-clock seconds of copying ``num_blocks`` scattered blocks from ``source`` to ``target``."""
    times = []
    for attempt in range(repeat + 1):
        src = rng.sample(range(source.num_blocks), num_blocks)
        dst = rng.sample(range(target.num_blocks), num_blocks)
        if target.device.type == "cuda":
            torch.cuda.synchronize(target.device)
        start = time.perf_counter()
        source.copy_blocks_to(target, src, dst)
        if target.device.type == "cuda":
            torch.cuda.synchronize(target.device)
        if attempt:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def fit_line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the line through the points with the least squared relative error (each point
    weighted 1/y^2: the small copies, where the fixed cost shows, count as much as the large ones)."""
    w = [1.0 / (y * y) for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs, strict=True))
    sy = sum(wi * y for wi, y in zip(w, ys, strict=True))
    sxx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys, strict=True))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return (sy - slope * sx) / sw, slope


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="small", choices=sorted(MODELS))
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--blocks", type=_ints, default=_ints("1,2,4,8,16,32,64,128,256"))
    parser.add_argument("--pool-blocks", type=int, default=1024, help="blocks in each engine's pool")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the CI machine has 2 cores)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")]
    shape = get_model(args.model)
    source = KVCache(shape, num_blocks=args.pool_blocks, block_size=args.block_size, dtype=dtype, device=args.device)
    target = KVCache(shape, num_blocks=args.pool_blocks, block_size=args.block_size, dtype=dtype, device=args.device)
    source.pool.normal_()
    per_block = block_bytes(shape, args.block_size, dtype)
    rng = random.Random(0)
    print(f"{args.model} {dtype} block {args.block_size} on {args.device}: {per_block:,} bytes per block, "
          f"{torch.get_num_threads()} thread(s)")
    print(f"{'blocks':>7} {'median us':>10} {'us/block':>9} {'GB/s':>7}")
    medians = []
    for n in args.blocks:
        seconds = copy_seconds(source, target, n, args.repeat, rng)
        medians.append(seconds)
        print(f"{n:7d} {seconds * 1e6:10.1f} {seconds * 1e6 / n:9.2f} {n * per_block / seconds / 1e9:7.2f}")
    latency_s, slope_s = fit_line(args.blocks, medians)
    print(f"fit: t = {latency_s * 1e6:.1f} us + n x {slope_s * 1e6:.2f} us per block -> bandwidth "
          f"{per_block / slope_s / 1e9:.2f} GB/s, latency {latency_s * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
