"""Simulator speed: simulated requests per wall second, events per second, peak memory, scaling.

    python benchmarks/sim_speed.py                 # 10k and 100k on 16 and 64 replicas, plus hard cases
    python benchmarks/sim_speed.py --sizes 10000 100000 1000000 --replicas 16 64

The chat workload: Azure-2023-conversation prompt and output lengths (empirical, from the shared trace),
Poisson arrivals at a fixed load per replica. Prints one line per run and the scaling ratios
(time per request at the largest size / at the smallest; at 64 replicas / at 16).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any

import simpy

from simulator.fleet import run
from simulator.scenario import load_mapping

TRACE = "${traces}/azure_llm_2023_conv.csv"


def chat_scenario(num_requests: int, replicas: int, rate_per_replica: float, **extra: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "name": f"speed-{num_requests}-{replicas}",
        "seed": 1,
        "workload": {
            "num_requests": num_requests,
            "arrival": {"process": "poisson", "rate_rps": rate_per_replica * replicas},
            "prompt_tokens": {"dist": "empirical", "format": "azure", "path": TRACE, "column": "prompt_tokens"},
            "output_tokens": {"dist": "empirical", "format": "azure", "path": TRACE, "column": "output_tokens"},
        },
        "fleet": {"replicas": replicas, "profile": "h200-llama-3-8b-tp1-analytic"},
        "engine": {"preset": "vllm", "prefix_caching": False},
        "router": {"policy": "least_requests"},
        "simulation": {"sample_interval_s": 10.0},
        **extra,
    }


class EventCounter:
    """Counts SimPy events processed, by wrapping Environment.step (a benchmark-only instrument)."""

    def __init__(self) -> None:
        self.count = 0
        self._step = simpy.Environment.step

    def __enter__(self) -> EventCounter:
        counter = self
        original = self._step

        def step(env: simpy.Environment) -> None:
            counter.count += 1
            original(env)

        simpy.Environment.step = step  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        simpy.Environment.step = self._step  # type: ignore[method-assign]


def measure(raw: dict[str, Any], overrides: list[str] | None = None, count_events: bool = False) -> dict[str, float]:
    loaded = load_mapping(raw, overrides or [])
    start = time.perf_counter()
    if count_events:
        with EventCounter() as counter:
            result = run(loaded)
        events = counter.count
    else:
        result = run(loaded)
        events = 0
    wall = time.perf_counter() - start
    summary = next(iter(result.variants.values())).summary.to_dict()
    n = summary["requests_arrived"]
    return {
        "requests": n,
        "wall_s": wall,
        "req_per_s": n / wall,
        "events_per_s": events / wall if count_events else float("nan"),
        "completed": summary["requests_completed"],
        "preemptions": summary["preemptions"],
        "prefix_hit_rate": summary["prefix_hit_rate"],
        "ttft_p50_ms": summary["ttft_p50_ms"] or float("nan"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def line(label: str, m: dict[str, float]) -> str:
    return (f"{label:34s} {m['requests']:>9,.0f} req  {m['wall_s']:7.2f} s  {m['req_per_s']:>9,.0f} req/s  "
            f"{m['events_per_s']:>10,.0f} ev/s  peak RSS {m['peak_rss_mb']:6.0f} MB  "
            f"preempt {m['preemptions']:.0f}  hit {m['prefix_hit_rate']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--replicas", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rate-per-replica", type=float, default=8.0, help="requests/s per replica")
    parser.add_argument("--no-hard", action="store_true", help="skip the prefix-caching and overload runs")
    parser.add_argument("--step-by-step", action="store_true", help="disable the decode-run fast path")
    parser.add_argument("--no-events", dest="events", action="store_false",
                        help="do not count SimPy events (counting wraps Environment.step: a few %% slower)")
    args = parser.parse_args(argv)
    fast = [] if not args.step_by_step else ["simulation.fast_path=false"]
    per_request: dict[tuple[int, int], float] = {}
    for replicas in args.replicas:
        for size in args.sizes:
            m = measure(chat_scenario(size, replicas, args.rate_per_replica), fast, args.events)
            per_request[(replicas, size)] = m["wall_s"] / m["requests"]
            print(line(f"chat {replicas} replicas", m), flush=True)
    small, large = min(args.sizes), max(args.sizes)
    for replicas in args.replicas:
        if small != large:
            ratio = per_request[(replicas, large)] / per_request[(replicas, small)]
            print(f"scaling in requests ({replicas} replicas): time/request at {large:,} / at {small:,} = {ratio:.2f}")
    if len(args.replicas) > 1:
        lo, hi = min(args.replicas), max(args.replicas)
        for size in args.sizes:
            ratio = per_request[(hi, size)] / per_request[(lo, size)]
            print(f"scaling in replicas ({size:,} requests): time/request at {hi} / at {lo} replicas = {ratio:.2f}")
    if not args.no_hard:
        sessions = chat_scenario(small, 16, args.rate_per_replica)
        sessions["workload"] = {
            "num_requests": small,
            "arrival": {"process": "poisson", "rate_rps": 16 * args.rate_per_replica / 4},
            "prompt_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 2000},
            "output_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 1500},
            "system_prompts": {"num_prompts": 8, "tokens": 600},
            "sessions": {"turns": {"dist": "uniform", "low": 2, "high": 6}, "think_time_s": 10,
                         "response_time_estimate_s": 4},
        }
        sessions["engine"] = {"preset": "vllm"}
        sessions["router"] = {"policy": "session_affinity"}
        print(line("sessions + prefix cache + affinity", measure(sessions, fast, args.events)), flush=True)
        overload = chat_scenario(small, 16, args.rate_per_replica * 3)
        overload["engine"] = {"preset": "vllm", "kv": {"num_blocks": 6000}, "max_num_seqs": 128}
        print(line("chunked, overload (preemptions)", measure(overload, fast, args.events)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
