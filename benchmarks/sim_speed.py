"""Simulator speed: simulated requests per wall second, events per second, peak memory, scaling.

    python benchmarks/sim_speed.py                 # 10k and 100k on 16 and 64 replicas, plus hard cases
    python benchmarks/sim_speed.py --sizes 10000 100000 1000000 --replicas 16 64
    python benchmarks/sim_speed.py --repeat 5      # 5 rounds of every case: the fastest and the median

    # Instructions per simulated request: a noise-free figure for before/after comparisons (wall time on
    # a shared VM moves by +-30 % from run to run). Run under callgrind with instrumentation off; the
    # benchmark switches it on around each simulation only (workload generation, simulation, summary).
    valgrind --tool=callgrind --instr-atstart=no python benchmarks/sim_speed.py --instructions \
        --sizes 2000 --replicas 16 --no-hard
    # with valgrind's --cache-sim=yes as well, also simulated data-cache misses per request

The chat workload: Azure-2023-conversation prompt and output lengths (empirical, from the shared trace),
Poisson arrivals at a fixed load per replica. Prints one line per run and the scaling ratios
(time per request at the largest size / at the smallest; at 64 replicas / at 16).

The per-step hot path runs compiled when ``fleetsim build-native`` has built it for these sources (the
first line printed says which); ``FLEETSIM_PURE_PYTHON=1`` measures pure Python.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import simpy

from simulator import native
from simulator.fleet import fleet
from simulator.scenario import load_mapping
from simulator.simulation import run

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
    """Counts SimPy events processed, as ``clock.run_until`` reports them (the fleet's event loop, which
    dispatches the replicas' events itself rather than through ``Environment.step``)."""

    def __init__(self) -> None:
        self.count = 0
        self._run_until = fleet.run_until

    def __enter__(self) -> EventCounter:
        counter = self
        original = self._run_until

        def run_until(env: simpy.Environment, until: float | None = None) -> int:
            processed = original(env, until)
            counter.count += processed
            return processed

        fleet.run_until = run_until  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        fleet.run_until = self._run_until


class InstructionCounter:
    """Instructions executed inside a ``with`` block, when this process runs under
    ``valgrind --tool=callgrind --instr-atstart=no`` (a benchmark-only instrument): zero the counters and
    switch instrumentation on at entry; at exit switch it off, dump, and read the dump's total."""

    def __init__(self) -> None:
        self.count = 0
        self.events: dict[str, int] = {}
        """Every event callgrind counted (Ir; with --cache-sim=yes also cache misses: D1mr, DLmr, ...)."""
        self._pid = str(os.getpid())

    def _control(self, *args: str) -> None:
        done = subprocess.run(["callgrind_control", *args, self._pid], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit("--instructions needs valgrind --tool=callgrind --instr-atstart=no (see the docstring)")

    def __enter__(self) -> InstructionCounter:
        self._control("--zero")
        self._control("--instr=on")
        return self

    def __exit__(self, *exc: object) -> None:
        self._control("--instr=off")
        before = set(Path.cwd().glob(f"callgrind.out.{self._pid}.*"))
        self._control("--dump=sim_speed")
        (dump,) = set(Path.cwd().glob(f"callgrind.out.{self._pid}.*")) - before
        lines = dump.read_text().splitlines()
        names = next(line for line in lines if line.startswith("events:")).split()[1:]
        totals = [int(x) for x in [line for line in lines if line.startswith("totals:")][-1].split()[1:]]
        self.events = dict(zip(names, totals, strict=False))
        self.count = self.events["Ir"]
        dump.unlink()  # ours: one per case


def measure(raw: dict[str, Any], overrides: list[str] | None = None, count_events: bool = False,
            instructions: bool = False) -> dict[str, float]:
    """One case, in a forked child so that its peak RSS is its own (not an earlier, larger case's); in
    the process itself under callgrind, whose instrumentation is per process."""
    args = (raw, overrides, count_events, instructions)
    if instructions or "fork" not in multiprocessing.get_all_start_methods():
        return _measure(*args)
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        return pool.apply(_measure, args)


def _measure(raw: dict[str, Any], overrides: list[str] | None, count_events: bool,
             instructions: bool) -> dict[str, float]:
    events = 0
    instr = 0
    misses: dict[str, int] = {}
    loaded = load_mapping(raw, overrides or [])
    start = time.perf_counter()
    if instructions:
        with InstructionCounter() as instr_counter:
            result = run(loaded)
        instr = instr_counter.count
        misses = {k: v for k, v in instr_counter.events.items() if k in ("D1mr", "D1mw", "DLmr", "DLmw")}
    elif count_events:
        with EventCounter() as counter:
            result = run(loaded)
        events = counter.count
    else:
        result = run(loaded)
    wall = time.perf_counter() - start
    summary = next(iter(result.variants.values())).summary.to_dict()
    n = summary["requests_arrived"]
    return {
        "requests": n,
        "wall_s": wall,
        "wall_median_s": wall,
        "req_per_s": n / wall,
        "events_per_s": events / wall if count_events else float("nan"),
        "instructions_per_request": instr / n if instructions else float("nan"),
        **{f"{name}_per_request": count / n for name, count in misses.items()},
        "completed": summary["requests_completed"],
        "preemptions": summary["preemptions"],
        "prefix_hit_rate": summary["prefix_hit_rate"],
        "ttft_p50_ms": summary["ttft_p50_ms"] or float("nan"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def line(label: str, m: dict[str, float]) -> str:
    text = (f"{label:34s} {m['requests']:>9,.0f} req  {m['wall_s']:7.2f} s  {m['req_per_s']:>9,.0f} req/s  "
            f"{m['events_per_s']:>10,.0f} ev/s  peak RSS {m['peak_rss_mb']:6.0f} MB  "
            f"preempt {m['preemptions']:.0f}  hit {m['prefix_hit_rate']:.2f}")
    if m["wall_median_s"] != m["wall_s"]:
        text += f"  (median {m['wall_median_s']:.2f} s)"
    if m["instructions_per_request"] == m["instructions_per_request"]:  # not NaN
        text += f"  {m['instructions_per_request']:,.0f} instructions/req"
    misses = [(k.removesuffix("_per_request"), v) for k, v in m.items() if k.endswith("mr_per_request")
              or k.endswith("mw_per_request")]
    if misses:  # callgrind --cache-sim=yes: simulated cache misses (D1: first level, DL: last level)
        text += "  misses/req " + " ".join(f"{k} {v:,.0f}" for k, v in misses)
    return text


def best_of(results: list[dict[str, float]]) -> dict[str, float]:
    """One case over its rounds: the fastest round's figures, the median wall time, the largest RSS."""
    best = dict(min(results, key=lambda m: m["wall_s"]))
    best["wall_median_s"] = statistics.median(m["wall_s"] for m in results)
    best["peak_rss_mb"] = max(m["peak_rss_mb"] for m in results)
    return best


def sessions_scenario(num_requests: int, rate_per_replica: float) -> dict[str, Any]:
    """Multi-turn sessions sharing system prompts, prefix caching on, session-affinity routing."""
    raw = chat_scenario(num_requests, 16, rate_per_replica)
    raw["workload"] = {
        "num_requests": num_requests,
        "arrival": {"process": "poisson", "rate_rps": 16 * rate_per_replica / 4},
        "prompt_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 2000},
        "output_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 1500},
        "system_prompts": {"num_prompts": 8, "tokens": 600},
        "sessions": {"turns": {"dist": "uniform", "low": 2, "high": 6}, "think_time_s": 10,
                     "response_time_estimate_s": 4},
    }
    raw["engine"] = {"preset": "vllm"}
    raw["router"] = {"policy": "session_affinity"}
    return raw


def overload_scenario(num_requests: int, rate_per_replica: float) -> dict[str, Any]:
    """Chunked prefill at 3x the load on a small KV pool: preemptions."""
    raw = chat_scenario(num_requests, 16, rate_per_replica * 3)
    raw["engine"] = {"preset": "vllm", "kv": {"num_blocks": 6000}, "max_num_seqs": 128}
    return raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--replicas", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rate-per-replica", type=float, default=8.0, help="requests/s per replica")
    parser.add_argument("--no-hard", action="store_true", help="skip the prefix-caching and overload runs")
    parser.add_argument("--step-by-step", action="store_true", help="disable the decode-run fast path")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a scenario override applied to every case (e.g. engine.async_scheduling=false)")
    parser.add_argument("--no-events", dest="events", action="store_false",
                        help="do not count SimPy events")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds: run every case once per round; report each case's fastest round (and median)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per request (run under callgrind: see the docstring)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    fast = ([] if not args.step_by_step else ["simulation.fast_path=false"]) + args.overrides
    options = (fast, args.events, args.instructions)
    build = "compiled with mypyc (fleetsim build-native)" if native.active() else "pure Python"
    print(f"hot path: {build}; Python {sys.version.split()[0]}", flush=True)
    # Read the trace and warm every code path once, untimed: a small case's figure should be the
    # simulation's, not the trace parse a long run amortises (each case runs in a child that inherits it).
    run(load_mapping(chat_scenario(200, 4, args.rate_per_replica), fast))
    cases: list[tuple[str, tuple[int, int] | None, dict[str, Any]]] = [
        (f"chat {replicas} replicas", (replicas, size), chat_scenario(size, replicas, args.rate_per_replica))
        for replicas in args.replicas for size in args.sizes
    ]
    small, large = min(args.sizes), max(args.sizes)
    if not args.no_hard:
        cases += [("sessions + prefix cache + affinity", None, sessions_scenario(small, args.rate_per_replica)),
                  ("chunked, overload (preemptions)", None, overload_scenario(small, args.rate_per_replica))]
    # Rounds: every case once per round, so that a slow spell of the machine (wall time on a shared VM
    # moves by up to 2x within minutes) hits all cases alike instead of all repeats of one.
    rounds: list[list[dict[str, float]]] = [[] for _ in cases]
    for round_index in range(args.repeat):
        for (label, _, raw), results in zip(cases, rounds, strict=True):
            results.append(measure(raw, *options))
            prefix = f"  round {round_index + 1}/{args.repeat}: " if args.repeat > 1 else ""
            print(prefix + line(label, results[-1]), flush=True)  # as each case ends: long runs show progress
    if args.repeat > 1:
        print(f"fastest of {args.repeat} rounds:")
    per_request: dict[tuple[int, int], float] = {}
    for (label, key, _), results in zip(cases, rounds, strict=True):
        m = best_of(results)
        if key is not None:
            per_request[key] = m["wall_s"] / m["requests"]
        if args.repeat > 1:
            print(line(label, m), flush=True)
    for replicas in args.replicas:
        if small != large:
            ratio = per_request[(replicas, large)] / per_request[(replicas, small)]
            print(f"scaling in requests ({replicas} replicas): time/request at {large:,} / at {small:,} = {ratio:.2f}")
    if len(args.replicas) > 1:
        lo, hi = min(args.replicas), max(args.replicas)
        for size in args.sizes:
            ratio = per_request[(hi, size)] / per_request[(lo, size)]
            print(f"scaling in replicas ({size:,} requests): time/request at {hi} / at {lo} replicas = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
