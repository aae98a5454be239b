"""The prefix-cache block pool alone: nanoseconds per block to hand out, index and free KV blocks.

    python benchmarks/block_pool.py                      # pools of 3,000 and 30,000 blocks
    python benchmarks/block_pool.py --blocks 50000 --requests 20000 --blocks-per-request 120
    python benchmarks/block_pool.py --private           # the requests' blocks private (marked, freed as runs)

With the prefix cache on, every block a request holds is handed out (evicting the hash it held), indexed
under its own hash and freed again, one at a time: that per-block work is what a cache-bound simulation
spends most of its time on (``benchmarks/sim_speed.py``'s sessions cases, ``benchmarks/day.py speed``).
Requests of ``--blocks-per-request`` blocks with random (unshared) hashes go through a pool, ``--live``
of them holding blocks at a time, so that once the pool has filled every block handed out evicts one.
Prints the three operations' costs per block; the compiled build runs when ``fleetsim build-native`` has
built it (the first line says which). ``--private``: the blocks are each request's own (a chat request's
prompt and answer), marked instead of indexed and freed as one run (``docs/architecture.md``), which
hands out and evicts the same blocks.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque

from simulator import native
from simulator.core.block_pool import BlockPool


def measure(num_blocks: int, num_requests: int, per_request: int, live: int, seed: int = 0, *,
            private: bool = False) -> dict[str, float]:
    """Seconds per block of ``get_new_blocks``, ``cache_range`` and ``free_blocks`` over the requests."""
    rng = random.Random(seed)
    hashes = [tuple(rng.getrandbits(63) for _ in range(per_request)) for _ in range(num_requests)]
    pool = BlockPool(num_blocks)
    held: deque[list[int]] = deque()
    clock = time.perf_counter
    spent = {"hand out": 0.0, "index": 0.0, "free": 0.0}
    for chain in hashes:
        if len(held) >= live:
            table = held.popleft()
            start = clock()
            if private:
                pool.free_marked_table(table, 0, per_request)
            else:
                table.reverse()  # tail first, as a request frees
                pool.free_blocks(table)
            spent["free"] += clock() - start
        start = clock()
        table = pool.get_new_blocks(per_request)
        spent["hand out"] += clock() - start
        start = clock()
        pool.cache_range(table, chain, 0, per_request, 0 if private else per_request)
        spent["index"] += clock() - start
        held.append(table)
    count = num_requests * per_request
    return {name: seconds / count for name, seconds in spent.items()} | {"evictions": pool.num_evictions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, nargs="+", default=[3_000, 30_000], help="pool sizes")
    parser.add_argument("--requests", type=int, default=4_000)
    parser.add_argument("--blocks-per-request", type=int, default=100)
    parser.add_argument("--live", type=int, default=20, help="requests holding blocks at a time")
    parser.add_argument("--private", action="store_true", help="each request's blocks its own: marked, freed as runs")
    args = parser.parse_args()
    if args.live * args.blocks_per_request > min(args.blocks):
        raise SystemExit("--live x --blocks-per-request must fit the smallest pool")
    print(f"hot path: {'compiled' if native.active() else 'pure Python'}")
    for num_blocks in args.blocks:
        m = measure(num_blocks, args.requests, args.blocks_per_request, args.live, private=args.private)
        figures = "  ".join(f"{name} {m[name] * 1e9:6.0f} ns" for name in ("hand out", "index", "free"))
        print(f"pool of {num_blocks:>7,} blocks: {figures} per block  ({m['evictions']:,.0f} evictions)")


if __name__ == "__main__":
    main()
