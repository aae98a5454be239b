"""Simulator speed: simulated requests per wall second, events per second, peak memory, scaling.

    python benchmarks/sim_speed.py                 # every case at 10k and 100k on 16 and 64 replicas
    python benchmarks/sim_speed.py --sizes 10000 100000 1000000 --replicas 16 --cases sessions+affinity
    python benchmarks/sim_speed.py --compare --sizes 10000 --replicas 16   # pure Python, then compiled
    python benchmarks/sim_speed.py --repeat 5      # 5 rounds of every case: the fastest and the median

    # Instructions per simulated request: a noise-free figure for before/after comparisons (wall time on
    # a shared VM moves by +-30 % from run to run). Run under callgrind with instrumentation off; the
    # benchmark switches it on around each simulation only (workload generation, simulation, summary).
    valgrind --tool=callgrind --instr-atstart=no python benchmarks/sim_speed.py --instructions \
        --sizes 2000 --replicas 16 --no-hard
    # with valgrind's --cache-sim=yes as well, also simulated data-cache misses per request; add
    # --LL=524288,8,64 (this machine's L2 per core; callgrind models no L3) for L2 misses as the DL columns

The cases (``CASES``): chat (Azure-2023-conversation prompt and output lengths, empirical from the shared
trace, no prefix cache), the realistic case with vLLM's defaults (chunked prefill, prefix caching, async
scheduling) on multi-turn sessions sharing system prompts, routed by session affinity or by prefix, and
that at 3x the load on a small KV pool (preemptions), and chat with speculative decoding; Poisson arrivals at
a fixed load per replica. Prints
one line per run (simulated requests per wall second and per CPU second — the CPU figure is the one a busy
machine leaves steady —, SimPy events per request, peak RSS, preemptions, hit rate) and the
scaling ratios (CPU time per request at the largest size / at the next largest and / at the smallest;
at 64 replicas / at 16).

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
from simulator.native_training import sessions_workload
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


_NOT_UNDER_CALLGRIND = ("--instructions needs this process under callgrind: "
                        "valgrind --tool=callgrind --instr-atstart=no python benchmarks/sim_speed.py --instructions")


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
            raise SystemExit(_NOT_UNDER_CALLGRIND)

    def __enter__(self) -> InstructionCounter:
        self._control("--zero")
        self._control("--instr=on")
        return self

    def __exit__(self, *exc: object) -> None:
        self._control("--instr=off")
        before = set(Path.cwd().glob(f"callgrind.out.{self._pid}.*"))
        self._control("--dump=sim_speed")
        dumps = set(Path.cwd().glob(f"callgrind.out.{self._pid}.*")) - before
        if len(dumps) != 1:  # callgrind_control answers 0 even when no callgrind runs this process
            raise SystemExit(_NOT_UNDER_CALLGRIND)
        (dump,) = dumps
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
    cpu_start = time.process_time()
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
    cpu = time.process_time() - cpu_start
    summary = next(iter(result.variants.values())).summary.to_dict()
    n = summary["requests_arrived"]
    return {
        "requests": n,
        "wall_s": wall,
        "wall_median_s": wall,
        "req_per_s": n / wall,
        "cpu_s": cpu,
        "req_per_cpu_s": n / cpu,
        "events_per_s": events / wall if count_events else float("nan"),
        "events_per_request": events / n if count_events else float("nan"),
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
            f"({m['req_per_cpu_s']:>9,.0f} per CPU s)  "
            f"{m['events_per_request']:>5.1f} ev/req  peak RSS {m['peak_rss_mb']:6.0f} MB  "
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


def sessions_scenario(num_requests: int, replicas: int, rate_per_replica: float,
                      router: str = "session_affinity") -> dict[str, Any]:
    """The realistic case: vLLM's defaults (chunked prefill, prefix caching, async scheduling), multi-turn
    sessions sharing system prompts (the routing.yaml shape), routed by session affinity or prefix."""
    raw = chat_scenario(num_requests, replicas, rate_per_replica)
    raw["workload"] = sessions_workload(num_requests, replicas * rate_per_replica / 4)
    raw["engine"] = {"preset": "vllm"}
    raw["router"] = {"policy": router}
    return raw


def overload_scenario(num_requests: int, replicas: int, rate_per_replica: float) -> dict[str, Any]:
    """The realistic case at 3x the load on a small KV pool: preemptions."""
    raw = sessions_scenario(num_requests, replicas, rate_per_replica * 3)
    raw["engine"] = {"preset": "vllm", "kv": {"num_blocks": 1500}, "max_num_seqs": 128}
    return raw


def speculative_scenario(num_requests: int, replicas: int, rate_per_replica: float) -> dict[str, Any]:
    """Chat with speculative decoding (a draft model proposing 4 tokens, each accepted with probability 0.7):
    every step its own event (the decode-run fast path declines speculation), acceptance drawn per row."""
    raw = chat_scenario(num_requests, replicas, rate_per_replica)
    raw["engine"] = {"preset": "vllm", "async_scheduling": False, "prefix_caching": False,
                     "speculative": {"method": "draft_model", "num_speculative_tokens": 4, "acceptance_rate": 0.7,
                                     "draft_cost_fraction": 0.05}}
    return raw


CASES: dict[str, Any] = {
    "chat": lambda n, r, rate: chat_scenario(n, r, rate),
    "sessions+affinity": lambda n, r, rate: sessions_scenario(n, r, rate),
    "sessions+prefix-aware": lambda n, r, rate: sessions_scenario(n, r, rate, router="prefix_aware"),
    "overload": lambda n, r, rate: overload_scenario(n, r, rate),
    "speculative": lambda n, r, rate: speculative_scenario(n, r, rate),
}
"""Each case builds its scenario from (requests, replicas, requests/s per replica). ``chat``: Azure
conversation lengths, no prefix cache. ``sessions+*``: the realistic case (vLLM's defaults: chunked prefill,
prefix caching, async scheduling; multi-turn sessions with shared system prompts). ``overload``: that at
3x the load on a small KV pool (preemptions). ``speculative``: chat with a draft model's 4 proposals per step
(step by step: the decode-run fast path declines speculation)."""


def compare(argv: list[str]) -> int:
    """Run the benchmark twice, pure Python then compiled, and print the speed-up per case."""
    runs = {}
    for label, env in (("pure", {native.PURE_ENV: "1"}), ("native", {})):
        command = [sys.executable, __file__, *argv]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, check=False)
        if done.returncode != 0:
            print(done.stdout + done.stderr)
            return done.returncode
        print(f"--- {label}\n{done.stdout}", end="", flush=True)
        runs[label] = {ln.split("  ")[0].strip(): ln for ln in done.stdout.splitlines() if " req/s" in ln}
    print("--- native / pure (simulated requests per second)")
    for key, pure_line in runs["pure"].items():
        native_line = runs["native"].get(key)
        if native_line is None:
            continue
        rate = [float(line.split(" req/s")[0].split()[-1].replace(",", "")) for line in (pure_line, native_line)]
        print(f"{key:44s} {rate[0]:>9,.0f} -> {rate[1]:>9,.0f} req/s  x{rate[1] / rate[0]:.1f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--replicas", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rate-per-replica", type=float, default=8.0, help="requests/s per replica")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES),
                        help="which cases to run (default: all)")
    parser.add_argument("--no-hard", action="store_true", help="the chat case only (no prefix cache, no overload)")
    parser.add_argument("--step-by-step", action="store_true", help="disable the decode-run fast path")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a scenario override applied to every case (e.g. engine.async_scheduling=false)")
    parser.add_argument("--no-events", dest="events", action="store_false",
                        help="do not count SimPy events")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds: run every case once per round; report each case's fastest round (and median)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per request (run under callgrind: see the docstring)")
    parser.add_argument("--compare", action="store_true", help="run everything pure Python, then compiled")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.compare:
        return compare([a for a in argv if a != "--compare"])
    fast = ([] if not args.step_by_step else ["simulation.fast_path=false"]) + args.overrides
    options = (fast, args.events, args.instructions)
    loaded = native.loaded_from()
    build = (f"compiled with mypyc{native.build_kind(loaded)} (fleetsim build-native)" if loaded is not None
             else "pure Python")
    print(f"hot path: {build}; Python {sys.version.split()[0]}", flush=True)
    # Read the trace and warm every code path once, untimed: a small case's figure should be the
    # simulation's, not the trace parse a long run amortises (each case runs in a child that inherits it).
    run(load_mapping(chat_scenario(200, 4, args.rate_per_replica), fast))
    names = ["chat"] if args.no_hard else args.cases
    cases: list[tuple[str, tuple[str, int, int], dict[str, Any]]] = [
        (f"{name} {replicas} replicas", (name, replicas, size), CASES[name](size, replicas, args.rate_per_replica))
        for name in names for replicas in args.replicas for size in args.sizes
    ]
    small, large = min(args.sizes), max(args.sizes)
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
    per_request: dict[tuple[str, int, int], float] = {}
    for (label, key, _), results in zip(cases, rounds, strict=True):
        m = best_of(results)
        per_request[key] = m["cpu_s"] / m["requests"]
        if args.repeat > 1:
            print(line(label, m), flush=True)
    for name in names:
        for replicas in args.replicas:
            # Against the smallest size, and against the next largest (the 1 M / 100 k): a run whose
            # cost per request grows with its length shows it between its two longest runs first.
            below = sorted({size for size in args.sizes if size < large}, reverse=True)
            for base in below[:1] + ([small] if len(below) > 1 else []):
                ratio = per_request[(name, replicas, large)] / per_request[(name, replicas, base)]
                print(f"scaling in requests ({name}, {replicas} replicas): time/request at {large:,} / at "
                      f"{base:,} = {ratio:.2f}")
        if len(args.replicas) > 1:
            lo, hi = min(args.replicas), max(args.replicas)
            for size in args.sizes:
                ratio = per_request[(name, hi, size)] / per_request[(name, lo, size)]
                print(f"scaling in replicas ({name}, {size:,} requests): time/request at {hi} / at {lo} replicas "
                      f"= {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
