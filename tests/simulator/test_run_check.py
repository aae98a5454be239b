"""The run check (``fleetsim run --check``, on in the whole suite): it passes on every policy mix, with and
without a horizon, and each invariant it names fails when a finished run's state is broken that way."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simulator import simulation
from simulator.cli.main import main
from simulator.fleet.replica import Replica
from simulator.results.invariants import InvariantError
from simulator.results.request_log import RequestOutcome
from simulator.results.run_result import RunResult
from simulator.scenario import load_mapping
from simulator.simulation import run

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "run-check",
    "seed": 5,
    "workload": {
        "num_requests": 150,
        "arrival": {"process": "poisson", "rate_rps": 150},
        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 3000},
        "output_tokens": {"dist": "lognormal", "median": 80, "sigma": 0.8, "max": 600},
    },
    "fleet": {"replicas": 2, "profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm", "kv": {"num_blocks": 300}},
    "router": {"policy": "least_requests"},
}
HORIZON = "simulation.horizon_s=1.5"
"""Cuts the run with requests waiting, running and swapped out."""
CASES: dict[str, list[str]] = {
    "recompute": [],
    "swap": ["engine.kv.preemption=swap"],
    "prefix-cache": ["engine.prefix_caching=true", "workload.system_prompts={num_prompts: 2, tokens: 256}"],
    "step-by-step": ["simulation.fast_path=false"],
    "static-contiguous": ["engine.batching=static", "engine.kv.policy=contiguous", "engine.max_model_len=4096",
                          "engine.kv.num_blocks=2048"],
    "reserve": ["engine.kv.policy=reserve", "engine.kv.num_blocks=600"],
    "rejections-network": ["engine.max_model_len=512", "network.latency_ms=20"],
}

Sabotage = Callable[[list[Replica]], None]


def simulate(overrides: Sequence[str], sabotage: Sabotage | None = None) -> RunResult:
    """BASE with overrides, checked; ``sabotage`` breaks the replicas' state after the clock stops."""
    loaded = load_mapping(BASE, list(overrides))
    inspect = None if sabotage is None else (lambda name, replicas: sabotage(list(replicas)))
    return run(loaded, inspect=inspect, check=True)


@pytest.mark.parametrize("horizon", [False, True], ids=["to-the-end", "cut"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_check_passes_on_every_policy_mix(case: str, horizon: bool) -> None:
    result = simulate([*CASES[case], *([HORIZON] if horizon else [])])
    log = result.variants["base"].requests
    outcomes = log.outcomes()
    c = log.columns()
    if horizon and case != "static-contiguous":
        assert outcomes[RequestOutcome.IN_FLIGHT].any(), "the horizon must leave requests in flight"
    completed = outcomes[RequestOutcome.COMPLETED]
    assert np.array_equal(c["produced_tokens"][completed], c["output_tokens"][completed])
    in_flight = outcomes[RequestOutcome.IN_FLIGHT]
    assert (c["produced_tokens"][in_flight] < c["output_tokens"][in_flight]).all()


def live_request(replicas: list[Replica]) -> tuple[Replica, Any]:
    for replica in replicas:
        for request in replica.scheduler.running:
            if request.num_output_tokens > 0:
                return replica, request
    raise AssertionError("no running request with an output token at the horizon")


def drop_a_request(replicas: list[Replica]) -> None:
    replica, request = live_request(replicas)
    del replica.scheduler.requests[request.request_id]


def finish_twice(replicas: list[Replica]) -> None:
    log = replicas[0].log
    rid = int(np.flatnonzero(~np.isnan(log.columns()["finish_s"]))[0])
    log.on_finish(rid, float(log.finish_s[rid]), 0, 0)


def leak_a_block(replicas: list[Replica]) -> None:
    replicas[0].scheduler.kv.pool.get_new_blocks(1)


def claim_all_tokens(replicas: list[Replica]) -> None:
    _, request = live_request(replicas)
    request.num_output_tokens = request.max_output_tokens


def finish_a_token_short(replicas: list[Replica]) -> None:
    """As if a replica had finished a request one token early: the count it reported at the finish."""
    log = replicas[0].log
    rid = int(np.flatnonzero(~np.isnan(log.columns()["finish_s"]))[0])
    log.produced_tokens[rid] = log.output_tokens[rid] - 1


def lose_host_blocks(replicas: list[Replica]) -> None:
    replicas[1].scheduler.num_host_blocks_used += 1


def first_token_after_finish(replicas: list[Replica]) -> None:
    log = replicas[0].log
    rid = int(np.flatnonzero(~np.isnan(log.columns()["finish_s"]))[0])
    log.first_token_s[rid] = log.finish_s[rid] + 1.0


def finish_before_arrival(replicas: list[Replica]) -> None:
    log = replicas[0].log
    rid = int(np.flatnonzero(~np.isnan(log.columns()["finish_s"]))[-1])
    log.finish_s[rid] = -1.0


def serve_a_rejected_request(replicas: list[Replica]) -> None:
    log = replicas[0].log
    rid = int(np.flatnonzero(log.columns()["rejected"])[0])
    log.on_first_token(rid, 1.0)


@pytest.mark.parametrize(
    ("overrides", "sabotage", "message"),
    [
        ([HORIZON], drop_a_request, "in flight but held by no replica (lost): 1 request(s), e.g. id"),
        ([], finish_twice, "finish events for 150 finished requests: a request finished more than once"),
        ([], leak_a_block, "replica 0: 1 KV blocks still in use with no request left"),
        (["engine.prefix_caching=true"], leak_a_block, "whose reference count differs from the block tables"),
        ([HORIZON], claim_all_tokens, "in flight with every token produced"),
        ([], finish_a_token_short, "completed with produced tokens != requested: 1 request(s)"),
        ([HORIZON, "engine.kv.preemption=swap"], lose_host_blocks, "host blocks in use, the swapped requests need"),
        ([], first_token_after_finish, "ttft > e2e: 1 request(s)"),
        ([], finish_before_arrival, "e2e negative: 1 request(s)"),
        (["engine.max_model_len=512"], serve_a_rejected_request, "rejected yet finished or served"),
    ],
    ids=["lost", "double-finish", "kv-leak", "kv-refcount", "tokens", "finished-short", "host-blocks",
         "ttft-after-e2e", "negative", "rejected-served"],
)
def test_each_invariant_fails_when_its_state_is_broken(overrides: list[str], sabotage: Sabotage,
                                                        message: str) -> None:
    with pytest.raises(InvariantError) as caught:
        simulate(overrides, sabotage)
    text = str(caught.value)
    assert text.startswith("run check failed (base): ") and message in text, text
    assert "\n" not in text


def test_fleetsim_run_check_passes_and_a_broken_run_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"
    args = ["run", str(scenario), "--set", "workload.num_requests=60", "--quiet", "--no-report", "--check"]
    assert main([*args, "--out", str(tmp_path / "ok")]) == 0
    assert "run check passed: 1 variant(s)" in capsys.readouterr().out
    requests = pd.read_parquet(tmp_path / "ok" / "requests.parquet")
    assert (requests["produced_tokens"] == requests["output_tokens"]).all()

    real = simulation.replica_end

    def broken(replica: Replica, handoff: Any = None) -> Any:
        end = real(replica, handoff)
        return type(end)(**{**{f: getattr(end, f) for f in end.__slots__}, "num_used_blocks": 7})

    monkeypatch.setattr(simulation, "replica_end", broken)
    assert main([*args, "--out", str(tmp_path / "broken")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fleetsim: error: run check failed (base): replica 0: 7 KV blocks in use, 0 referenced")
    assert err.count("\n") == 1 and not (tmp_path / "broken").exists()
