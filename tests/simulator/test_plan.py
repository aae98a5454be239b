"""Capacity planning: the searches against brute force, monotonicity in replicas and in load, the
noise verdict, sensitivity, plan.json, and the ``fleetsim plan`` command."""

from __future__ import annotations

import functools
import json
import math
import operator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from simulator.cli import main as cli
from simulator.errors import ConfigError
from simulator.planning.criteria import Criterion, parse_search, parse_slo
from simulator.planning.plan import _verdict, plan
from simulator.planning.plan_report import plan_figures, save_plan_report
from simulator.planning.plan_result import Evaluation, PlanResult, ReplicaAnswer
from simulator.planning.search import largest_passing_factor, smallest_passing
from simulator.results.intervals import MetricCI
from simulator.scenario import deep_merge, expand_dotted, load_mapping
from simulator.simulation import run

SMALL: dict[str, Any] = {
    "schema_version": 1,
    "name": "small",
    "seed": 0,
    "workload": {
        "num_requests": 120,
        "arrival": {"process": "poisson", "rate_rps": 30},
        "prompt_tokens": {"dist": "lognormal", "median": 900, "sigma": 0.9, "min": 16, "max": 8000},
        "output_tokens": {"dist": "lognormal", "median": 80, "sigma": 0.6, "min": 1, "max": 600},
    },
    "fleet": {"replicas": 1, "profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm"},
    "router": {"policy": "least_requests"},
    "slo": {"ttft_ms": 300, "tpot_ms": 30, "target_attainment": 0.9},
}
QUICK: dict[str, Any] = {"knee": False, "sensitivity": (), "workers": 1, "max_replicas": 6}


def attainment(raw: dict[str, Any], **overrides: Any) -> float:
    loaded = load_mapping(deep_merge(raw, expand_dotted(overrides)))
    return run(loaded).variants["base"].summary.slo_attainment


# ----- the searches, pure ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_n", [1, 5, 17, 64])
@pytest.mark.parametrize("start", [1, 3, 10])
def test_smallest_passing_equals_scan(max_n: int, start: int) -> None:
    for threshold in range(1, max_n + 3):
        calls: list[int] = []

        def passes(n: int, t: int = threshold, log: list[int] = calls) -> bool:
            assert 1 <= n <= max_n
            log.append(n)
            return n >= t

        expected = next((n for n in range(1, max_n + 1) if n >= threshold), None)
        assert smallest_passing(passes, max_n=max_n, start=start) == expected
        assert len(calls) <= 2 * math.ceil(math.log2(max_n + 1)) + 2  # O(log n), not a scan


def test_smallest_passing_probes_exponentially_from_one() -> None:
    seen: list[int] = []

    def passes(n: int) -> bool:
        seen.append(n)
        return n >= 11

    smallest_passing(passes, max_n=64)
    assert seen[:5] == [1, 2, 4, 8, 16]  # then bisection between 8 and 16
    assert seen[5:] == [12, 10, 11]


def test_largest_passing_factor_brackets_the_knee() -> None:
    for knee in (0.003, 0.3, 1.0, 7.5):
        ok, bad = largest_passing_factor(functools.partial(operator.ge, knee), start=1.0, rel_tol=0.01)
        assert bad is not None and ok <= knee < bad and bad / ok <= 1.01
    assert largest_passing_factor(lambda f: False, bounds=(0.25, 4.0)) == (0.0, 0.25)
    assert largest_passing_factor(lambda f: True, bounds=(0.25, 4.0)) == (4.0, None)


def test_parse_slo_and_search() -> None:
    slo = parse_slo("ttft_ms=500,tpot_ms=50,target=0.95")
    assert (slo.ttft_ms, slo.tpot_ms, slo.target_attainment) == (500, 50, 0.95)
    assert parse_slo("ttft_p99_ms=1000").ttft_p99_ms == 1000
    with pytest.raises(ConfigError, match="--slo"):
        parse_slo("ttft_msec=5")
    assert parse_search(["engine.max_num_batched_tokens=2048,8192", "router.policy=random"]) == {
        "engine.max_num_batched_tokens": [2048, 8192],
        "router.policy": ["random"],
    }
    with pytest.raises(ConfigError, match="max-replicas"):
        parse_search(["fleet.replicas=1,2"])


def _evaluation(low: float, high: float) -> Evaluation:
    ci = {"slo_attainment": MetricCI(mean=(low + high) / 2, low=low, high=high, num_samples=3)}
    return Evaluation(summaries=[], ci=ci, passes=(low + high) / 2 >= 0.9)


def test_verdict_says_when_the_answer_is_within_noise() -> None:
    crit = [Criterion(metric="slo_attainment", threshold=0.9, at_least=True)]

    def answer(at: Evaluation, below: Evaluation | None) -> ReplicaAnswer:
        return ReplicaAnswer(knobs={}, cost_factor=1.0, replicas=4, at=at, below=below)

    text, noisy = _verdict(answer(_evaluation(0.88, 0.96), _evaluation(0.5, 0.6)), crit, 3)
    assert noisy and text.startswith("within noise: 4 or 5")
    text, noisy = _verdict(answer(_evaluation(0.95, 0.99), _evaluation(0.85, 0.91)), crit, 3)
    assert noisy and text.startswith("within noise: 3 or 4")
    text, noisy = _verdict(answer(_evaluation(0.95, 0.99), _evaluation(0.5, 0.6)), crit, 3)
    assert not noisy and "clear" in text


# ----- monotonicity and brute force on real simulations ---------------------------------------------------


def test_attainment_is_monotone_in_replicas_for_a_fixed_stream() -> None:
    values = [attainment(SMALL, **{"fleet.replicas": n}) for n in (1, 2, 3, 4)]
    assert values == sorted(values), values
    assert values[0] < 0.9 <= values[-1]  # the range spans the target, so the check is not vacuous


def test_plan_equals_brute_force_scan_over_knobs_and_replicas() -> None:
    search = {"engine.max_num_batched_tokens": [512, 8192]}
    result = plan(SMALL, seeds=1, search=search, **QUICK)
    best: tuple[float, int, dict[str, Any]] | None = None
    for value in search["engine.max_num_batched_tokens"]:
        for n in range(1, 7):
            knobs = {"engine.max_num_batched_tokens": value}
            summary = run(load_mapping(deep_merge(SMALL, expand_dotted({**knobs, "fleet.replicas": n})))).variants[
                "base"].summary
            if summary.slo_attainment >= 0.9:  # the smallest passing count for this knob value
                candidate = (summary.cost_per_mtok_usd, n, knobs)
                best = candidate if best is None or candidate[:2] < best[:2] else best
                break
    assert best is not None
    assert (result.replicas, result.knobs) == (best[1], best[2])
    assert result.answer.cost_per_mtok_usd == pytest.approx(best[0])


def test_more_load_never_needs_fewer_replicas() -> None:
    found = [plan(SMALL, seeds=1, load_factor=f, **QUICK).replicas for f in (0.5, 1.0, 2.0)]
    answers = [a for a in found if a is not None]
    assert len(answers) == len(found)
    assert answers == sorted(answers), answers
    assert answers[0] < answers[-1]


def test_plan_with_seeds_knee_sensitivity_and_json(tmp_path: Path) -> None:
    raw = deep_merge(SMALL, {"workload": {"num_requests": 80}})
    result = plan(raw, seeds=2, workers=1, max_replicas=6)
    n = result.replicas
    assert n is not None
    assert result.answer.at is not None and result.answer.at.ci["slo_attainment"].num_samples == 2
    assert result.verdict.startswith(("within noise", f"{n} replica"))
    # Slower steps never need fewer replicas, faster ones never more.
    slow, fast = result.sensitivity[1.1].replicas, result.sensitivity[0.9].replicas
    assert fast is not None and slow is not None and fast <= n <= slow
    # The knee: one replica passes at the knee's rate, fails a little above it.
    assert result.knee is not None and result.knee.failing_rate_rps is not None
    assert 0 < result.knee.rate_rps < result.knee.failing_rate_rps <= result.knee.rate_rps * 1.06
    knee_trials = result.trials[result.trials["purpose"] == "knee"]
    assert set(knee_trials["replicas"]) == {1}
    path = result.save(tmp_path)
    doc = json.loads(path.read_text())
    assert doc["answer"]["replicas"] == n and doc["verdict"] == result.verdict
    assert set(doc["sensitivity"]) == {"0.9", "1.1"} and doc["knee"]["rate_rps"] > 0
    assert (tmp_path / "trials.csv").exists()
    assert f"answer: {n} replica(s)" in result.text()
    assert "2 seeds are too few for a confidence interval" in result.text()
    check_plan_page(result, tmp_path)


def check_plan_page(result: PlanResult, folder: Path) -> None:
    """plan.html: the answer's latency-replicas curve is the seed mean of its trials with the seeds' range as
    error bars, the SLO and the answer are marked, sensitivity curves ride along, and plotly is inlined."""
    figures = plan_figures(result)
    assert {"latency-ttft_p99_ms", "latency-tpot_p99_ms", "attainment", "knee"} <= set(figures)
    ttft = figures["latency-ttft_p99_ms"]
    main, *others = ttft["data"]
    rows = result.trials[(result.trials["purpose"] == "replicas")]
    means = rows.groupby("replicas")["ttft_p99_ms"].agg(["mean", "min", "max"])
    assert list(main["x"]) == list(means.index) and np.allclose(main["y"], means["mean"])
    assert np.allclose(main["error_y"]["array"] + main["y"], means["max"])
    assert np.allclose(main["y"] - main["error_y"]["arrayminus"], means["min"])
    assert result.replicas in main["x"] and len(others) == 2  # steps x0.9 and x1.1
    assert {t["name"] for t in others} == {"step times x0.9", "step times x1.1"}
    shapes = ttft["layout"]["shapes"]
    assert any(sh["y0"] == 300 and sh["y1"] == 300 for sh in shapes), "the per-request TTFT SLO line"
    assert any(sh["x0"] == result.replicas == sh["x1"] for sh in shapes), "the answer's line"
    page = save_plan_report(result, folder).read_text()
    assert "<script src=" not in page and len(page) > 1_000_000  # offline: plotly.js inlined once
    assert page.count("<script>/**") == 1 and page.count("plotly.js v") == 1 and 'id="latency-ttft_p99_ms"' in page


def test_unreachable_slo_has_no_answer() -> None:
    result = plan(SMALL, slo="ttft_ms=1,target=0.99", seeds=1, **{**QUICK, "max_replicas": 2})
    assert result.replicas is None and result.verdict.startswith("no answer")


# ----- the command ---------------------------------------------------------------------------------------


@pytest.fixture()
def plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.PLUGINS, "plan", "simulator.cli.plan")


def test_cli_plan_prints_the_answer_and_writes_plan_json(plugin: None, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "small.yaml"
    scenario.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "out"
    code = cli.main(["plan", str(scenario), "--slo", "ttft_ms=300,tpot_ms=30,target=0.9", "--seeds", "1",
                     "--no-knee", "--max-replicas", "6", "--workers", "1", "--set", "workload.num_requests=60",
                     "--out", str(out), "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    doc = json.loads((out / "plan.json").read_text())
    assert f"answer: {doc['answer']['replicas']} replica(s)" in printed
    assert "if step times are x1.1" in printed
    assert f"page: {out / 'plan.html'}" in printed and 'id="attainment"' in (out / "plan.html").read_text()


def test_cli_plan_bad_input_is_one_line(plugin: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "small.yaml"
    scenario.write_text(yaml.safe_dump(SMALL))
    assert cli.main(["plan", str(scenario), "--slo", "ttft=fast"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("fleetsim: error:") and len(err.strip().splitlines()) == 1
    assert cli.main(["plan", str(scenario), "--search", "engine.max_num_seqs=0"]) == cli.EXIT_USAGE
    assert "max_num_seqs" in capsys.readouterr().err


def test_a_given_slo_merges_with_the_scenarios() -> None:
    """--slo ttft_ms=500 replaces the TTFT limit and keeps the scenario's TPOT limit and target."""
    from simulator.planning.plan import loaded_scenario, planned_scenario

    loaded, _ = planned_scenario(loaded_scenario(SMALL, ()), slo="ttft_ms=500", variant=None)
    assert loaded.scenario.slo is not None
    assert (loaded.scenario.slo.ttft_ms, loaded.scenario.slo.tpot_ms, loaded.scenario.slo.target_attainment) == (
        500, 30, 0.9)
    loaded, _ = planned_scenario(loaded_scenario(SMALL, ()), slo="target=0.5", variant=None)
    assert loaded.scenario.slo is not None and loaded.scenario.slo.ttft_ms == 300
    assert loaded.scenario.slo.target_attainment == 0.5


def test_a_printed_interval_is_never_negative() -> None:
    from simulator.planning.plan_result import ci_text
    from simulator.results.intervals import metric_interval

    # The TPOT p99 of two seeds that printed "82.2 [-6.5, 170.8] ms" under a Student-t interval.
    two = metric_interval(np.array([75.3, 89.1]))
    assert ci_text(two, ".1f") == "82.2 (seeds 75.3 to 89.1)"
    share = metric_interval(np.array([0.97, 1.0, 0.99, 1.0]))
    text = ci_text(share, ".3f")
    low, high = (float(x) for x in text[text.index("[") + 1 : -1].split(", "))
    assert 0.97 <= low <= high <= 1.0
    assert ci_text(metric_interval(np.array([5.0])), ".0f") == "5"


@pytest.mark.parametrize(("options", "needle"), [({"load_factor": math.inf}, "load_factor"),
                                                 ({"load_factor": 0.0}, "load_factor"),
                                                 ({"seeds": 10**30}, "seeds"), ({"seeds": 0}, "seeds"),
                                                 ({"seeds": [-1]}, "seeds")])
def test_impossible_load_factors_and_seeds_are_refused_before_any_simulation(options: dict[str, Any],
                                                                             needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan(SMALL, **{**QUICK, **options})
    assert info.value.field == needle
