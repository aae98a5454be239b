"""Lazy chains: a session's turn may hold its hashes past its chain's first block as a tail, derived only where
read (``Workload.iter_specs(lazy_chains=True)``, chosen by ``fleet._lazy_chains``). The specs equal the eager
ones hash for hash, and a run gives the very same results either way, on every path that reads the tail: a
chain indexed after all, a turn preempted or swapped out, a walk of the prefix-aware router past the values,
a node failure's retries."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.fleet import fleet
from simulator.fleet.replica import Replica
from simulator.results.run_result import VariantResult
from simulator.scenario import load_mapping
from simulator.simulation import run
from simulator.workload.config import WorkloadConfig
from simulator.workload.generate import generate
from simulator.workload.workload import Workload

SESSIONS = {"turns": {"dist": "uniform", "low": 1, "high": 5}, "think_time_s": 1, "response_time_estimate_s": 0.5}

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "lazy-chains",
    "seed": 4,
    "workload": {
        "num_requests": 400,
        "arrival": {"process": "poisson", "rate_rps": 30},
        "prompt_tokens": {"dist": "lognormal", "median": 150, "sigma": 0.6, "max": 1200},
        "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.8, "max": 600},
        "system_prompts": {"num_prompts": 3, "tokens": 200},
        "sessions": SESSIONS,
    },
    "fleet": {"replicas": 3, "profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm"},
    "router": {"policy": "session_affinity"},
}

OVERLOAD = ["engine.kv.num_blocks=500", "engine.max_num_seqs=24", "workload.arrival.rate_rps=120"]

CASES: dict[str, list[str]] = {
    "affinity": [],
    "prefix-aware": ["router.policy=prefix_aware"],
    "least-requests": ["router.policy=least_requests"],
    "no-system-prompt": ["workload.system_prompts=null"],
    "overload-affinity": OVERLOAD,
    "overload-least-kv": [*OVERLOAD, "router.policy=least_kv"],
    "overload-prefix-aware-step-by-step": [*OVERLOAD, "router.policy=prefix_aware", "simulation.fast_path=false"],
    "overload-sync": [*OVERLOAD, "engine.async_scheduling=false", "router.policy=round_robin"],
    "swap": ["engine.preset=tgi", "engine.kv.policy=paged", "engine.kv.preemption=swap", "engine.kv.num_blocks=400",
             "workload.arrival.rate_rps=80"],
}


def _run(overrides: list[str], *, lazy: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[VariantResult, bool]:
    """The run's only variant, and whether its specs held lazy chains."""
    chosen: list[bool] = []

    def note(variant: str, replicas: Sequence[Replica]) -> None:
        chosen.append(fleet._lazy_chains(list(replicas), None))

    with monkeypatch.context() as patch:
        patch.setattr(fleet, "LAZY_CHAINS", lazy)
        result = run(load_mapping(BASE, overrides), prepare=note)
    return next(iter(result.variants.values())), all(chosen)


@pytest.mark.parametrize("case", sorted(CASES))
def test_lazy_chains_change_no_result(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    eager, eager_chose = _run(CASES[case], lazy=False, monkeypatch=monkeypatch)
    lazy, lazy_chose = _run(CASES[case], lazy=True, monkeypatch=monkeypatch)
    assert not eager_chose and lazy_chose, "the run did not hold lazy chains: the test would prove nothing"
    if "overload" in case or "swap" in case:
        assert eager.summary.preemptions > 0, "no preemption: the case tests nothing of its own"
    for column, values in eager.requests.columns().items():
        np.testing.assert_array_equal(lazy.requests.columns()[column], values, err_msg=column)
    for eager_series, series in zip(eager.series, lazy.series, strict=True):
        for column, values in eager_series.columns().items():
            np.testing.assert_array_equal(series.columns()[column], values, err_msg=column)
    assert lazy.summary.to_dict() == eager.summary.to_dict()


@pytest.mark.parametrize("overrides", [["kv_tiers={tiers: [{name: host, kind: host, capacity_gib: 1, read_gb_s: 25, "
                                        "write_gb_s: 25, latency_us: 10}]}"],
                                       ["fleet.pools={prefill: {role: prefill, replicas: 1}, decode: {role: decode, "
                                        "replicas: 2}}", "disaggregation={link: {preset: nvlink4}}",
                                        "router.policy=least_requests"]])
def test_no_lazy_chains_where_every_turn_would_derive_them(overrides: list[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """KV tiers read every hash; a prefill worker's requests leave unfinished: specs there hold values."""
    chosen: list[bool] = []
    real = Workload.iter_specs

    def spy(self: Workload, *, block_hashes: bool = True, lazy_chains: bool = False) -> Any:
        chosen.append(lazy_chains)
        return real(self, block_hashes=block_hashes, lazy_chains=lazy_chains)

    monkeypatch.setattr(Workload, "iter_specs", spy)
    result = run(load_mapping(BASE, overrides))
    assert chosen and not any(chosen)
    assert next(iter(result.variants.values())).summary.requests_completed > 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), turns_high=st.integers(1, 6), prompts=st.integers(0, 3),
       system_tokens=st.sampled_from([0, 15, 16, 200]), median=st.integers(5, 400))
def test_lazy_specs_equal_the_eager_ones(seed: int, turns_high: int, prompts: int, system_tokens: int,
                                         median: int) -> None:
    fields: dict[str, Any] = {
        "num_requests": 60, "arrival": {"process": "poisson", "rate_rps": 5.0},
        "prompt_tokens": {"dist": "lognormal", "median": median, "sigma": 0.8, "max": 2000},
        "output_tokens": {"dist": "lognormal", "median": median, "sigma": 0.8, "max": 800},
        "sessions": {"turns": {"dist": "uniform", "low": 1, "high": turns_high}, "think_time_s": 1,
                     "response_time_estimate_s": 1}}
    if prompts and system_tokens:
        fields["system_prompts"] = {"num_prompts": prompts, "tokens": system_tokens}
    workload = generate(WorkloadConfig.model_validate(fields), seed=seed, block_size=16)
    eager = list(workload.iter_specs())
    lazy = list(workload.iter_specs(lazy_chains=True))
    for before, after in zip(eager, lazy, strict=True):
        assert after.num_hashed_blocks == before.num_hashed_blocks
        assert after.num_lookup_blocks == before.num_lookup_blocks
        chain = after.chain_from
        assert chain is not None
        assert len(after.known_hashes) <= max(chain + 1, 0) or len(after.known_hashes) == before.num_hashed_blocks
        assert after.known_hashes == before.block_hashes[:len(after.known_hashes)]
        assert after == before  # reads (derives) every hash
