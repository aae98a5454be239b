"""Host offload of KV blocks in the real engine: what an eviction's copy to host memory and a tier hit's
load back cost (``calibration/engine/kv_offload.HostKVBlocks``, the path the engine runs), fitted to
t = latency + n * bytes per block / bandwidth and printed as a ``kv_tiers`` tier a scenario can use.

    python benchmarks/kv_offload.py                               # small model, fp32, CPU, block 16
    python benchmarks/kv_offload.py --device cuda --model llama-3-8b --dtype bf16

An eviction copies one block (the core evicts block by block); a load copies n scattered blocks into
fresh device blocks. Each size runs ``--repeat`` times after a warm-up, the median kept; the fit minimises
the relative error over the medians (``benchmarks/kv_transfer.fit_line``). Numbers, never pass/fail.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from calibration.engine.configs import MODELS, get_model
from calibration.engine.kv_cache import KVCache, block_bytes
from calibration.engine.kv_offload import HostKVBlocks, MeasuredTierCost
from simulator.core.kv_tiers import KVTiers, LoadOp, TierSpec, TierStore

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark's copy timing and line fit
from kv_transfer import DTYPES, _ints, fit_line


def _median_s(run: Callable[[], None], repeat: int, cuda: bool) -> float:
    times = []
    for attempt in range(repeat + 1):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        if attempt:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="small", choices=sorted(MODELS))
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--blocks", type=_ints, default=_ints("1,2,4,8,16,32,64,128"))
    parser.add_argument("--pool-blocks", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the CI machine has 2 cores)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")]
    cuda = args.device.startswith("cuda")
    shape = get_model(args.model)
    cache = KVCache(shape, num_blocks=args.pool_blocks, block_size=args.block_size, dtype=dtype, device=args.device)
    cache.pool.normal_()
    per_block = block_bytes(shape, args.block_size, dtype)
    cost = MeasuredTierCost(block_bytes=per_block, read_bytes_per_s=1e12, latency_s=0.0, prefill_s_per_token=1.0)
    tiers = KVTiers([TierStore(TierSpec(name="host"))], cost, block_size=args.block_size)
    host = HostKVBlocks(tiers, cache.swap_out, cache.swap_in)
    rng = random.Random(0)
    print(f"{args.model} {dtype} block {args.block_size} on {args.device}: {per_block:,} bytes per block, "
          f"{torch.get_num_threads()} thread(s)")

    hashes = list(range(max(args.blocks)))
    for h in hashes:
        host.on_evict(h, rng.randrange(args.pool_blocks))
    evict_s = _median_s(lambda: host.on_evict(10**9, rng.randrange(args.pool_blocks)), args.repeat, cuda)
    print(f"offload on eviction: {evict_s * 1e6:.1f} us per block -> {per_block / evict_s / 1e9:.2f} GB/s")

    print(f"{'blocks':>7} {'median us':>10} {'us/block':>9} {'GB/s':>7}   (load from host into scattered blocks)")
    medians = []
    for n in args.blocks:
        def load(n: int = n) -> None:
            ids = tuple(rng.sample(range(args.pool_blocks), n))
            host._load(LoadOp(0, ids, tuple(hashes[:n]), (0,) * n, 0.0))
        seconds = _median_s(load, args.repeat, cuda)
        medians.append(seconds)
        print(f"{n:7d} {seconds * 1e6:10.1f} {seconds * 1e6 / n:9.2f} {n * per_block / seconds / 1e9:7.2f}")
    latency_s, slope_s = fit_line(args.blocks, medians)
    read_gb_s = per_block / slope_s / 1e9
    write_gb_s = per_block / evict_s / 1e9
    print(f"fit: t = {latency_s * 1e6:.1f} us + n x {slope_s * 1e6:.2f} us per block")
    print(f"as a tier: {{name: host, kind: host, read_gb_s: {read_gb_s:.3g}, write_gb_s: {write_gb_s:.3g}, "
          f"latency_us: {max(latency_s, 0.0) * 1e6:.3g}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
