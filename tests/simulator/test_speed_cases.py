"""The speed benchmark's own cases (``benchmarks/sim_speed.py``: chat, the realistic sessions case routed by
affinity or by prefix, its overloaded variant, chat with speculative decoding) give on the decode-run fast
path exactly what they give step by step: the speed the benchmark reports is that of the reference's answer.
Cut to a few thousand requests on four replicas, each still takes the paths it measures (prefix hits,
preemptions, fast runs; speculation, which the fast path declines, step by step on both)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from test_fast_path import assert_same_results

from simulator.fleet.replica import Replica
from simulator.scenario import load_mapping
from simulator.simulation import run
from simulator.workload.trace_sources import traces_dir

ROOT = Path(__file__).resolve().parents[2]
CHAT_TRACE = traces_dir() / "azure_llm_2023_conv.csv"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sim_speed", ROOT / "benchmarks" / "sim_speed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SIM_SPEED = _benchmark()

SIZE = {"chat": 2000, "sessions+affinity": 2000, "sessions+prefix-aware": 2000, "overload": 3000, "speculative": 1000}
"""Requests per case: the overloaded one needs enough for its small pools to fill and preempt."""

REPLICAS = 4


def test_every_benchmark_case_is_covered() -> None:
    assert set(SIZE) == set(SIM_SPEED.CASES)


@pytest.mark.parametrize("case", sorted(SIZE))
def test_a_benchmark_case_gives_the_step_by_step_results(case: str) -> None:
    if case in ("chat", "speculative") and not CHAT_TRACE.is_file():
        pytest.skip(f"the chat case reads Azure's conversation trace, not found at {CHAT_TRACE}")
    raw: dict[str, Any] = SIM_SPEED.CASES[case](SIZE[case], REPLICAS, 8.0)
    fast_steps: dict[bool, int] = {}
    results = {}
    for fast in (False, True):

        def count(variant: str, replicas: Sequence[Replica], fast: bool = fast) -> None:
            fast_steps[fast] = sum(r.num_fast_steps for r in replicas)

        loaded = load_mapping(raw, [f"simulation.fast_path={str(fast).lower()}"])
        results[fast] = run(loaded, inspect=count, check=True).variants["base"]
    assert fast_steps[False] == 0
    if case == "speculative":  # the fast path declines speculation: the flag must change nothing
        assert fast_steps[True] == 0 and results[True].summary.spec_acceptance_rate > 0
    else:
        assert fast_steps[True] > 0, "the fast path was not the one compared"
    summary = results[True].summary
    assert summary.requests_completed == SIZE[case]
    if case not in ("chat", "speculative"):
        assert summary.prefix_hit_rate > 0.3, "the sessions' prefixes were not hit: the cache path went unmeasured"
    if case == "overload":
        assert summary.preemptions > 0, "the overloaded case did not preempt"
    assert_same_results(results[False], results[True])
