"""Every shipped scenario runs, matches its golden summary at small scale, and shows what it claims.

Golden files (``tests/simulator/golden/<scenario>.json``) hold the per-variant summaries of each shipped
scenario cut down to a few hundred requests, as SimPy checks its examples against expected output. A
change that moves any figure fails here with the list of figures that moved. When the change is meant
(a new cost model, a scheduling fix, a new Summary figure), regenerate and review the diff:

    FLEETSIM_REGEN_GOLDEN=1 .venv/bin/pytest tests/simulator/test_shipped_scenarios.py
    git diff tests/simulator/golden/
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from simulator.results.run_result import RunResult
from simulator.results.summary import Summary
from simulator.scenario import load_mapping, load_scenario
from simulator.simulation import run
from simulator.workload.traces import TRACES_TOKEN, traces_dir

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
GOLDEN = Path(__file__).resolve().parent / "golden"
REGEN = os.environ.get("FLEETSIM_REGEN_GOLDEN") == "1"

SMALL: dict[str, list[str]] = {
    "quickstart": ["workload.num_requests=200"],
    "batching": ["workload.num_requests=150"],
    "paging": ["workload.num_requests=150"],
    "routing": ["workload.num_requests=120"],
    "azure_conv": ["workload.num_requests=200"],
    "mooncake": ["workload.num_requests=60"],
    "presets": ["workload.num_requests=100"],
    "serve_cpu": ["workload.num_requests=100"],
    "moe": ["workload.num_requests=100"],
    "disaggregation": ["workload.num_requests=100"],
    "speculative": ["workload.num_requests=100"],
    "kv_tiers": ["workload.num_requests=40"],
    "day": ["workload.num_requests=400", "workload.arrival.period_s=600", "workload.arrival.peak_at_s=150",
            "workload.arrival.bursts=[]", "failures.node_failures=[{at_s: 120, node: 0}]"],
}
"""Each shipped scenario cut to a size that runs in about a second: the golden runs."""


def scenario_path(name: str) -> Path:
    path = SCENARIOS / f"{name}.yaml"
    if TRACES_TOKEN in path.read_text() and not traces_dir().is_dir():
        pytest.skip(f"shared traces not found at {traces_dir()} (set FLEETSIM_TRACES)")
    return path


def run_scenario(name: str, overrides: list[str]) -> RunResult:
    return run(load_scenario(scenario_path(name), overrides))


def summaries(result: RunResult) -> dict[str, Summary]:
    return {name: v.summary for name, v in result.variants.items()}


def test_every_shipped_scenario_has_a_golden_run() -> None:
    assert sorted(SMALL) == sorted(p.stem for p in SCENARIOS.glob("*.yaml"))


# ----- golden summaries ---------------------------------------------------------------------------------


def golden_diff(expected: dict[str, Any], produced: dict[str, Any]) -> list[str]:
    lines = []
    for variant in sorted(set(expected) | set(produced)):
        want, got = expected.get(variant), produced.get(variant)
        if want is None or got is None:
            lines.append(f"variant {variant}: expected {'absent' if want is None else 'present'}")
            continue
        for key in sorted(set(want) | set(got)):
            if want.get(key, "<absent>") != got.get(key, "<absent>"):
                lines.append(f"{variant}.{key}: expected {want.get(key, '<absent>')}, got {got.get(key, '<absent>')}")
    return lines


@pytest.mark.parametrize("name", sorted(SMALL))
def test_golden_summary(name: str) -> None:
    overrides = SMALL[name]
    result = run_scenario(name, overrides)
    # The variants section of summary.json, exactly as written (6 significant digits, NaN as null).
    produced = json.loads(result.summary_json())["variants"]
    for summary in summaries(result).values():
        assert summary.requests_completed + summary.requests_in_flight + summary.requests_rejected \
            + (summary.requests_failed or 0) == summary.requests_arrived
    path = GOLDEN / f"{name}.json"
    if REGEN:
        document = {
            "scenario": f"scenarios/{name}.yaml",
            "overrides": overrides,
            "regenerate": "FLEETSIM_REGEN_GOLDEN=1 .venv/bin/pytest tests/simulator/test_shipped_scenarios.py",
            "variants": produced,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, sort_keys=True, indent=2) + "\n", encoding="utf-8")
    assert path.is_file(), f"no golden file {path}; create it with FLEETSIM_REGEN_GOLDEN=1"
    golden = json.loads(path.read_text(encoding="utf-8"))
    assert golden["overrides"] == overrides, "the golden file was made with other overrides: regenerate it"
    diff = golden_diff(golden["variants"], produced)
    assert not diff, (
        f"{name}: summary differs from {path.relative_to(ROOT)} "
        "(if intended, regenerate with FLEETSIM_REGEN_GOLDEN=1 and review the diff):\n  " + "\n  ".join(diff)
    )


# ----- the claims the scenarios make, at reduced size -------------------------------------------------------

BATCHING_REQUESTS = 400
ROUTING_REQUESTS = 600
"""Cache hits build up over a session's turns: fewer requests leave the routers' hit rates too close."""


@pytest.fixture(scope="module")
def batching() -> dict[str, Summary]:
    return summaries(run_scenario("batching", [f"workload.num_requests={BATCHING_REQUESTS}"]))


@pytest.fixture(scope="module")
def paging() -> dict[str, Summary]:
    return summaries(run_scenario("paging", ["workload.num_requests=400"]))


@pytest.fixture(scope="module")
def routing() -> dict[str, Summary]:
    return summaries(run_scenario("routing", [f"workload.num_requests={ROUTING_REQUESTS}"]))


def test_continuous_batching_sustains_more_throughput_than_static(batching: dict[str, Summary]) -> None:
    static = batching["static"]
    for name in ("continuous", "chunked"):
        iteration_level = batching[name]
        assert iteration_level.requests_completed == static.requests_completed == BATCHING_REQUESTS
        assert iteration_level.throughput_tok_s > 1.4 * static.throughput_tok_s, name
        assert iteration_level.throughput_rps > 1.4 * static.throughput_rps, name
        # Static's queue grows without bound at this load: its requests wait for whole batches to end.
        assert static.ttft_p50_ms > 10 * iteration_level.ttft_p50_ms, name
        assert iteration_level.slo_attainment > 0.9 > static.slo_attainment


def test_paging_fits_more_concurrent_requests_than_contiguous(paging: dict[str, Summary]) -> None:
    contiguous, paged = paging["contiguous"], paging["paged"]
    # 4096 blocks x 16 tokens hold exactly 8 contiguous 8192-token slots.
    assert contiguous.running_peak == 8
    assert paged.running_peak >= 3 * contiguous.running_peak
    assert paged.running_mean > 2 * contiguous.running_mean
    # Contiguous slots are mostly empty; paged allocation wastes only the tail of each last block.
    assert contiguous.kv_waste_mean > 0.7
    assert paged.kv_waste_mean < 0.05
    assert paged.throughput_tok_s > 1.5 * contiguous.throughput_tok_s
    # Reserving prompt + output sits between the two.
    reserve = paging["reserve"]
    assert paged.kv_waste_mean < reserve.kv_waste_mean < contiguous.kv_waste_mean
    assert reserve.running_peak > contiguous.running_peak


def test_cache_aware_routing_raises_hits_and_cuts_ttft(routing: dict[str, Summary]) -> None:
    round_robin = routing["round_robin"]
    for name in ("session_affinity", "prefix_aware"):
        aware = routing[name]
        assert aware.requests_completed == round_robin.requests_completed == ROUTING_REQUESTS
        assert aware.prefix_hit_rate > round_robin.prefix_hit_rate + 0.1, name
        assert aware.ttft_p50_ms < 0.85 * round_robin.ttft_p50_ms, name
    # Load balancing alone does not find the caches.
    assert routing["least_requests"].prefix_hit_rate < routing["session_affinity"].prefix_hit_rate - 0.1


MOE_REQUESTS = 800
"""Enough of the 72 requests/s stream for Llama-3-8B's queues to build while the MoE keeps up."""


@pytest.fixture(scope="module")
def moe() -> dict[str, Summary]:
    return summaries(run_scenario("moe", [f"workload.num_requests={MOE_REQUESTS}"]))


def test_moe_meets_the_slo_where_the_dense_models_do_not(moe: dict[str, Summary]) -> None:
    dense_8b, dense_70b = moe["llama-3-8b-tp1-x4"], moe["llama-3-70b-tp4-x1"]
    qwen3 = [moe[name] for name in moe if name.startswith("qwen3-moe")]
    assert len(qwen3) == 4
    # Llama-3-8B computes 2.4x Qwen3's active parameters per token: at this load its steps fall behind.
    assert dense_8b.slo_attainment < 0.9 <= min(s.slo_attainment for s in qwen3)
    assert dense_70b.slo_attainment < 0.5  # one 4-GPU replica of a dense 70 B model is far from keeping up
    assert all(s.requests_completed == MOE_REQUESTS for s in qwen3)


def test_skew_and_expert_parallelism_move_tpot_the_stated_way(moe: dict[str, Summary]) -> None:
    # Skewed routing touches fewer distinct experts per step, so reads fewer bytes.
    assert moe["qwen3-moe-tp1-x4-skewed"].tpot_p50_ms <= moe["qwen3-moe-tp1-x4"].tpot_p50_ms
    # On one node EP gains no bytes (the busiest GPU's experts) and pays dispatch and combine: no faster than TP.
    assert moe["qwen3-moe-tp2-ep2-x2"].tpot_p50_ms >= moe["qwen3-moe-tp2-x2"].tpot_p50_ms



DISAGGREGATION = ["summarise_aggregated_2", "summarise_1p1d", "chat_aggregated_2", "chat_1p1d"]
"""The layouts on two GPUs, at full size: the chat case needs its 2,000 requests for the decode worker's
batch to reach its limit."""


def scenario_variants(name: str, keep: list[str], overrides: list[str]) -> Any:
    loaded = load_scenario(scenario_path(name), overrides)
    raw = {**loaded.raw, "variants": {k: loaded.scenario.variants[k] for k in keep}}
    return load_mapping(raw, source=loaded.source)


@pytest.fixture(scope="module")
def disaggregation() -> dict[str, Summary]:
    return summaries(run(scenario_variants("disaggregation", DISAGGREGATION, [])))


def goodput_per_gpu(summary: Summary) -> float:
    return summary.goodput_rps / summary.num_gpus


def test_disaggregation_pays_with_long_prompts_and_a_tight_tpot_slo(disaggregation: dict[str, Summary]) -> None:
    aggregated, split = disaggregation["summarise_aggregated_2"], disaggregation["summarise_1p1d"]
    assert split.slo_met and not aggregated.slo_met
    assert goodput_per_gpu(split) > 2 * goodput_per_gpu(aggregated)
    assert split.tpot_p99_ms < aggregated.tpot_p50_ms  # no prompt ever stalls a decode step
    assert split.requests_completed == aggregated.requests_completed


def test_disaggregation_does_not_pay_with_short_prompts_and_a_loose_slo(disaggregation: dict[str, Summary]) -> None:
    aggregated, split = disaggregation["chat_aggregated_2"], disaggregation["chat_1p1d"]
    assert aggregated.slo_met and not split.slo_met
    assert goodput_per_gpu(aggregated) > 1.5 * goodput_per_gpu(split)
    assert split.requests_completed == aggregated.requests_completed  # nothing lost while it queued


def test_the_step_traces_say_why() -> None:
    """Aggregated, a few decode tokens ride in steps that carry a long prompt, and those steps are ten
    times a decode step: the mean step a decode token waits for breaks the 12 ms TPOT SLO. The decode
    worker of 1P1D never carries a prompt."""
    from simulator.fleet.replica import Replica
    from simulator.results.step_trace import StepTrace

    traces: dict[str, StepTrace] = {}
    decode_ids: dict[str, list[int]] = {}

    def prepare(name: str, replicas: list[Replica]) -> None:
        traces[name] = StepTrace()
        decode_ids[name] = [r.replica_id for r in replicas if str(r.scheduler.config.role) != "prefill"]
        for replica in replicas:
            replica.on_plan = traces[name].recorder(replica.replica_id, replica.cost_model.step_time)

    loaded = scenario_variants("disaggregation", ["summarise_aggregated_2", "summarise_1p1d"],
                               ["workload.num_requests=300", "simulation.fast_path=false"])
    run(loaded, prepare=prepare)
    aggregated = traces["summarise_aggregated_2"].figures(decode_ids["summarise_aggregated_2"])
    split = traces["summarise_1p1d"].figures(decode_ids["summarise_1p1d"])
    assert 0.01 < aggregated.decode_tokens_with_prefill < 0.2
    assert aggregated.prefill_step_ms > 5 * aggregated.decode_only_step_ms
    assert aggregated.decode_step_ms > 12 > split.decode_step_ms
    assert split.decode_tokens_with_prefill == 0.0


SPECULATIVE = ["off-1rps", "k4-a0.7-1rps", "k4-a0.9-1rps", "off-12rps", "k4-a0.5-12rps", "k4-a0.9-12rps"]


@pytest.fixture(scope="module")
def speculative() -> dict[str, Summary]:
    return summaries(run(scenario_variants("speculative", SPECULATIVE, [])))


def test_speculation_pays_at_low_load_and_stops_paying_at_high_load(speculative: dict[str, Summary]) -> None:
    low_off, low_spec = speculative["off-1rps"], speculative["k4-a0.7-1rps"]
    # A few sequences per step: TPOT falls by about the tokens per step (2.77) net of a 4 x 5 % draft.
    assert 1.8 < low_off.tpot_p50_ms / low_spec.tpot_p50_ms < low_spec.spec_tokens_per_step
    high_off, high_weak, high_strong = (speculative[n] for n in ("off-12rps", "k4-a0.5-12rps", "k4-a0.9-12rps"))
    # A large batch is compute-bound: at α = 0.5 the rejected proposals are paid work and TPOT rises.
    assert high_weak.tpot_p50_ms > high_off.tpot_p50_ms
    # Even at α = 0.9 the gain shrinks with the batch.
    low_strong = speculative["k4-a0.9-1rps"]
    assert high_off.tpot_p50_ms / high_strong.tpot_p50_ms < low_off.tpot_p50_ms / low_strong.tpot_p50_ms


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "step-by-step"])
def test_long_document_sessions_run_to_the_end_on_one_replica(fast_path: bool) -> None:
    """kv_tiers' long-document chat on one replica: sessions' turns take over the runs their last turns left
    while the pool's queue is compacted under them (it once handed a later turn blocks other requests held,
    and the run stopped on a double free or on a run no longer queued). Every request accounted for, every
    block conserved (``check``)."""
    loaded = scenario_variants("kv_tiers", ["doc_gpu_only"],
                               ["fleet.replicas=1", "workload.num_requests=100", f"simulation.fast_path={fast_path}"])
    result = run(loaded, check=True)
    summary = result.variants["doc_gpu_only"].summary
    assert summary.requests_completed == summary.requests_arrived == 100
    assert summary.prefix_hit_rate > 0.5


def test_the_nightly_full_size_check_runs_and_fails_on_what_it_cannot_run() -> None:
    """``benchmarks/shipped.py`` (the full-size job beside this file's small runs): a line per scenario
    saying its check passed, exit 0; a scenario it cannot run is a FAILED line and exit 1."""
    import subprocess
    import sys

    def shipped(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "shipped.py"), *argv], capture_output=True,
                              text=True, check=False, timeout=300)

    done = shipped("quickstart", "paging", "--set", "workload.num_requests=30")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["quickstart", "paging"]
    assert all(line.endswith("check passed") for line in lines), lines
    done = shipped("quickstart", "--set", "fleet.replicas=0")
    assert done.returncode == 1 and "quickstart" in done.stdout and "FAILED" in done.stdout, done.stdout
