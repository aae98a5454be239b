"""Random scenarios give the same results on the decode-run fast path as one event per step.

``test_fast_path.py`` holds the fast path to the reference on hand-picked cases; this draws the settings
that change what a run may skip: the engine preset, async scheduling, chunked prefill's budget, the seats,
a small KV pool (preemption), one-token blocks, prefix caching with sessions sharing system prompts or
with Mooncake's recorded prefixes (where the trace is present), KV tiers with tiny capacities (their
eviction orders move at every admission try), the router, a horizon. Each drawn scenario runs twice, step
by step and on the fast path, each with the run check (``check=True``), and every per-request column,
replica series and summary figure must agree (``assert_same_results``).

A fuzzer of this kind (an earlier session's script, since lost) found the KV-tier divergence fixed in
``eec2931``, once in ~17,000 scenarios; that case keeps its own reproducer in ``test_kv_tiers.py``. CI
draws a few dozen scenarios; ``FLEETSIM_FUZZ_EXAMPLES=5000`` draws more (milliseconds to a second each,
compiled).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st
from test_fast_path import assert_same_results

from simulator.errors import ConfigError
from simulator.fleet.replica import Replica
from simulator.scenario import load_mapping
from simulator.simulation import run
from simulator.workload.traces import traces_dir

EXAMPLES = int(os.environ.get("FLEETSIM_FUZZ_EXAMPLES", "40"))
MOONCAKE = traces_dir() / "mooncake_fast25_conversation.jsonl"
"""Drawn from when present (the shared traces folder; ``FLEETSIM_TRACES``), as other tests read it."""


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """A small scenario whose settings are drawn (some combinations are refused by the loader: rejected)."""
    preset = draw(st.sampled_from(["vllm", "vllm", "vllm", "tgi", "trtllm"]))
    engine: dict[str, Any] = {"preset": preset, "kv": {}}
    if preset == "vllm":
        engine["async_scheduling"] = draw(st.booleans())
    engine["prefix_caching"] = draw(st.booleans())
    engine["max_num_seqs"] = draw(st.sampled_from([4, 16, 64, 256]))
    engine["max_num_batched_tokens"] = draw(st.sampled_from([256, 1024, 2048, 8192]))
    # Blocks of one token too (each prompt then a chain of hundreds, a tier's few MiB hundreds of blocks).
    block_size = draw(st.sampled_from([1, 16, 16]))
    engine["kv"]["block_size"] = block_size
    engine["kv"]["num_blocks"] = draw(st.sampled_from([200, 400, 1000, 5000])) * 16 // block_size
    if preset != "vllm" and draw(st.booleans()):
        engine["kv"]["preemption"] = "swap"
    workload: dict[str, Any] = {
        "num_requests": draw(st.integers(10, 150)),
        "arrival": {"process": "poisson", "rate_rps": draw(st.sampled_from([2.0, 10.0, 40.0, 150.0]))},
        "prompt_tokens": {"dist": "lognormal", "median": draw(st.sampled_from([8, 60, 300, 1200])), "sigma": 0.7,
                          "max": 3000},
        "output_tokens": {"dist": "lognormal", "median": draw(st.sampled_from([3, 20, 120])), "sigma": 0.8,
                          "max": 600},
    }
    sessions = draw(st.booleans())
    if MOONCAKE.is_file() and draw(st.integers(0, 4)) == 0:
        # Mooncake's recorded prefixes (hash ids shared across requests, long prompts): the heads that cannot
        # fit and the tier hits the synthetic sessions rarely make together.
        sessions = False
        workload = {"num_requests": workload["num_requests"] // 2,
                    "trace": {"format": "mooncake", "path": str(MOONCAKE), "max_prompt_tokens": 32000,
                              "rate_rps": workload["arrival"]["rate_rps"]}}
        engine["kv"]["num_blocks"] *= 4
    elif sessions:
        workload["sessions"] = {"turns": {"dist": "uniform", "low": 2, "high": 5}, "think_time_s": 1.0,
                                "response_time_estimate_s": 0.5}
        workload["system_prompts"] = {"num_prompts": draw(st.integers(1, 4)),
                                      "tokens": draw(st.sampled_from([16, 200, 900]))}
    routers = ["least_requests", "least_kv", "round_robin", "prefix_aware"] + (["session_affinity"] if sessions else [])
    raw: dict[str, Any] = {
        "schema_version": 1,
        "name": "fuzz",
        "seed": draw(st.integers(0, 2**16)),
        "workload": workload,
        "fleet": {"replicas": draw(st.integers(1, 3)), "profile": "h200-llama-3-8b-tp1-analytic"},
        "engine": engine,
        "router": {"policy": draw(st.sampled_from(routers))},
        "simulation": {"sample_interval_s": draw(st.sampled_from([0.05, 1.0]))},
    }
    if engine["prefix_caching"] and draw(st.booleans()):
        # Tiers a few blocks deep (a block of Llama-3-8B is 2 MiB): evictions at every offer.
        tiers = [{"name": "host", "kind": "host", "capacity_gib": draw(st.sampled_from([0.01, 0.05, 0.5])),
                  "read_gb_s": 25, "write_gb_s": 25, "eviction": draw(st.sampled_from(["lru", "fifo"]))}]
        if draw(st.booleans()):
            tiers.append({"name": "ssd", "kind": "disk", "capacity_gib": 0.1, "read_gb_s": 6.5, "write_gb_s": 3.5})
        raw["kv_tiers"] = {"tiers": tiers}
        if draw(st.booleans()):
            raw["kv_tiers"]["shared_store"] = {"name": "store", "kind": "remote", "capacity_gib": 0.2,
                                               "read_gb_s": 12, "write_gb_s": 12, "source": "compute"}
    if draw(st.booleans()):
        raw["simulation"]["horizon_s"] = draw(st.sampled_from([1.0, 5.0]))
    return raw


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(raw=scenarios())
def test_a_random_scenario_runs_the_same_on_the_fast_path(raw: dict[str, Any]) -> None:
    results = {}
    fast_steps: list[int] = []

    def count_fast_steps(variant: str, replicas: Sequence[Replica]) -> None:
        fast_steps.append(sum(r.num_fast_steps for r in replicas))

    for fast in (False, True):
        try:
            loaded = load_mapping(raw, [f"simulation.fast_path={str(fast).lower()}"])
        except ConfigError:
            reject()  # a combination the loader refuses (e.g. a pool too small for the longest prompt)
        results[fast] = run(loaded, check=True, inspect=count_fast_steps).variants["base"]
    assert fast_steps[0] == 0, "the step-by-step reference took decode runs"
    event("tiers" if "kv_tiers" in raw else "no tiers")
    event("decode runs taken" if fast_steps[1] else "no decode run (nothing to compare but the steps)")
    assert_same_results(results[False], results[True])
