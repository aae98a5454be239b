"""Speculative decoding in the simulator: settings checked at load, acceptance drawn by seed, steps priced
with their verification and drafting, tokens per step and TPOT that follow acceptance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.cli.main import main
from simulator.core.speculation import expected_tokens
from simulator.cost.speculation import DraftMethod, SpeculativeConfig
from simulator.errors import ConfigError
from simulator.results.summary import Summary
from simulator.scenario import load_mapping, load_scenario, resolve_replica
from simulator.simulation import run

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "spec",
    "workload": {
        "num_requests": 12,
        "arrival": {"process": "poisson", "rate_rps": 0.05},  # one request at a time: batch 1
        "prompt_tokens": {"dist": "fixed", "value": 200},
        "output_tokens": {"dist": "fixed", "value": 120},
    },
    "fleet": {"profile": "h200-llama-3-8b-tp1-analytic"},
    "engine": {"preset": "vllm"},
}


def spec(k: int = 4, **fields: Any) -> dict[str, Any]:
    return {"method": "ngram", "num_speculative_tokens": k, "acceptance_rate": 0.7, **fields}


def summaries(variants: dict[str, dict[str, Any]], **top: Any) -> dict[str, Summary]:
    result = run(load_mapping({**BASE, **top, "variants": variants}))
    return {name: v.summary for name, v in result.variants.items()}


def test_speculation_cuts_batch_one_tpot_by_the_tokens_per_step() -> None:
    out = summaries({"off": {}, "a0.7": {"engine.speculative": spec()},
                     "a0.3": {"engine.speculative": spec(acceptance_rate=0.3)}})
    off, fast, slow = out["off"], out["a0.7"], out["a0.3"]
    assert fast.spec_tokens_per_step == pytest.approx(expected_tokens(0.7, 4), rel=0.08)
    assert slow.spec_tokens_per_step == pytest.approx(expected_tokens(0.3, 4), rel=0.08)
    assert 0 < slow.spec_acceptance_rate < fast.spec_acceptance_rate < 1
    # n-gram drafting is free: the TPOT cut is the tokens per step over the verification's extra cost.
    assert off.tpot_mean_ms / fast.tpot_mean_ms > 0.85 * fast.spec_tokens_per_step
    assert off.tpot_mean_ms > slow.tpot_mean_ms > fast.tpot_mean_ms
    assert fast.output_tokens == off.output_tokens  # exactly each request's outputs
    assert "spec_tokens_per_step" not in off.to_dict() and "spec_tokens_per_step" in fast.to_dict()


@pytest.mark.parametrize("horizon_s", [None, 2.5])
def test_a_prompts_last_chunk_of_one_token_samples_the_first_token_without_drafts(horizon_s: float | None) -> None:
    """Two tokens of budget: a 2-token prompt's last chunk is a single token, shaped like a decode. It gets no
    proposals (nothing is drafted before the first token) and its step logs the first token; drafted, the
    verifier's accepted tokens made its output count skip 1 and the first token went unlogged until the finish
    (with a horizon between them, an in-flight request with tokens and no first token: the run check failed)."""
    raw = {**BASE, "seed": 1,
           "workload": {"num_requests": 5, "arrival": {"process": "poisson", "rate_rps": 54.0},
                        "prompt_tokens": {"dist": "uniform", "low": 1, "high": 2},
                        "output_tokens": {"dist": "fixed", "value": 300}},
           "engine": {"max_num_batched_tokens": 2, "speculative": spec(k=1, acceptance_rate=0.5)},
           "simulation": {"horizon_s": horizon_s}}
    columns = run(load_mapping(raw), check=True).variants["base"].requests.columns()
    first, finish = columns["first_token_s"], columns["finish_s"]
    assert (columns["prompt_tokens"] == 2).any()
    finished = finish == finish  # not NaN
    assert finished.any() and (first[finished] < finish[finished]).all()


def test_a_draft_costs_its_fraction_of_the_step() -> None:
    out = summaries({"free": {"engine.speculative": spec()},
                     "dear": {"engine.speculative": spec(method="draft_model", draft_cost_fraction=0.5)}})
    assert out["dear"].spec_tokens_per_step == out["free"].spec_tokens_per_step  # the same draws
    assert out["dear"].tpot_mean_ms > 1.5 * out["free"].tpot_mean_ms


def test_draws_depend_on_the_seed_only() -> None:
    variants = {"spec": {"engine.speculative": spec()}}
    first, again = summaries(variants), summaries(variants)
    assert first["spec"].to_dict() == again["spec"].to_dict()
    other = summaries(variants, seed=1)
    assert other["spec"].spec_acceptance_rate != first["spec"].spec_acceptance_rate
    # The fast-path switch changes nothing: speculation always runs step by step.
    slow = summaries({"spec": {"engine.speculative": spec(), "simulation.fast_path": False}})
    assert slow["spec"].to_dict() == first["spec"].to_dict()


def test_the_vllm_preset_yields_async_scheduling_and_k_zero_is_off() -> None:
    config = resolve_replica(load_mapping({**BASE, "engine": {"preset": "vllm", "speculative": spec()}}).scenario
                             ).scheduler
    assert config.speculation is not None and not config.async_scheduling
    assert config.speculation.acceptance_rates == (0.7,) * 4
    off = resolve_replica(load_mapping({**BASE, "engine": {"preset": "vllm", "speculative": spec(0)}}).scenario)
    assert off.scheduler.speculation is None and off.scheduler.async_scheduling


def test_per_position_rates_repeat_the_last_and_methods_price_their_draft() -> None:
    from simulator.cost.profile import load_profile

    profile = load_profile("h200-llama-3-8b-tp1-analytic")
    config = SpeculativeConfig(num_speculative_tokens=4, acceptance_rates=(0.9, 0.7))
    resolved = config.resolve(profile, seed=3)
    assert resolved is not None and resolved.acceptance_rates == (0.9, 0.7, 0.7, 0.7)
    assert resolved.draft_cost_fraction == pytest.approx(1 / 32)  # eagle: one of Llama-3-8B's 32 layers
    ngram = SpeculativeConfig(method=DraftMethod.NGRAM, num_speculative_tokens=2, acceptance_rate=0.5)
    assert ngram.draft_fraction(profile) == 0.0


@pytest.mark.parametrize(("speculative", "field", "needle"), [
    (spec(-1), "num_speculative_tokens", "greater than or equal to 0"),
    (spec(acceptance_rate=1.2), "acceptance_rate", "less than or equal to 1"),
    (spec(acceptance_rate=-0.1), "acceptance_rate", "greater than or equal to 0"),
    ({"num_speculative_tokens": 2, "acceptance_rates": [0.9, 0.8, 0.7]}, "speculative", "3 rates for"),
    ({"num_speculative_tokens": 2, "acceptance_rates": [0.9, 1.5]}, "speculative", "must lie in [0, 1]"),
    ({"num_speculative_tokens": 2}, "speculative", "exactly one of acceptance_rate"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "acceptance_rate": 0.5}, "speculative",
     "needs draft_cost_fraction"),
])
def test_bad_speculation_is_one_line_naming_the_field(tmp_path: Path, speculative: dict[str, Any], field: str,
                                                        needle: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "engine": {"speculative": speculative}}))
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    message = str(info.value)
    assert "\n" not in message and field in message and needle in message and "s.yaml" in message


@pytest.mark.parametrize(("engine", "field"), [
    ({"async_scheduling": True, "speculative": spec()}, "engine.async_scheduling"),
    ({"batching": "continuous", "speculative": spec()}, "engine.speculative"),
])
def test_incompatible_settings_name_their_field(tmp_path: Path, engine: dict[str, Any], field: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "engine": engine}))
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.field == field


def test_the_command_line_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "engine": {"speculative": spec(acceptance_rate=2)}}))
    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "acceptance_rate" in err


def test_a_measured_table_gives_the_rates(tmp_path: Path) -> None:
    table = tmp_path / "rates.yaml"
    table.write_text("acceptance_rates: [0.9, 0.6]\nsource: measured\n")
    engine = {"preset": "vllm", "speculative": {"num_speculative_tokens": 3, "acceptance_table": str(table)}}
    config = resolve_replica(load_mapping({**BASE, "engine": engine}).scenario).scheduler
    assert config.speculation is not None and config.speculation.acceptance_rates == (0.9, 0.6, 0.6)


@pytest.mark.parametrize(("text", "needle"), [
    (None, "cannot read acceptance table"),
    ("acceptance_rates: 0.5\n", "a list of numbers"),
    ("acceptance_rates: [0.5, 0.4, 0.3, 0.2]\n", "4 rates for num_speculative_tokens 3"),
    ("acceptance_rates: [0.5, 7]\n", "must lie in [0, 1]"),
    ("[unclosed\n", "not valid YAML"),
])
def test_a_bad_table_is_one_line_naming_it(tmp_path: Path, text: str | None, needle: str) -> None:
    table = tmp_path / "rates.yaml"
    if text is not None:
        table.write_text(text)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "engine": {"speculative": {"num_speculative_tokens": 3,
                                                                      "acceptance_table": str(table)}}}))
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    message = str(info.value)
    assert "\n" not in message and needle in message and "acceptance_table" in message and "rates.yaml" in message


def test_rates_and_a_table_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        SpeculativeConfig(num_speculative_tokens=2, acceptance_rate=0.5, acceptance_table="t.yaml")
