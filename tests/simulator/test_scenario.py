"""The scenario loader: strict schema, one ConfigError naming file and field, --set overrides, variants."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from simulator.core.config import Batching, KVPolicy
from simulator.errors import ConfigError
from simulator.scenario import (
    apply_override,
    deep_merge,
    expand_dotted,
    load_mapping,
    load_scenario,
    resolve_replica,
)

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.yaml"))

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "tiny",
    "workload": {
        "num_requests": 20,
        "arrival": {"process": "poisson", "rate_rps": 5},
        "prompt_tokens": {"dist": "fixed", "value": 100},
        "output_tokens": {"dist": "fixed", "value": 10},
    },
    "fleet": {"profile": "h200-llama-3-8b-tp1-analytic"},
}


def write(tmp_path: Path, data: dict[str, Any] | str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def with_(overrides: dict[str, Any]) -> dict[str, Any]:
    """BASE with dotted-key overrides merged in."""
    return deep_merge(BASE, expand_dotted(overrides))


def load_error(tmp_path: Path, data: dict[str, Any] | str, *overrides: str) -> ConfigError:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_scenario(path, list(overrides))
    error = info.value
    assert error.file == str(path), f"the error does not name the file: {error}"
    assert "\n" not in str(error)
    return error


# ----- shipped scenarios --------------------------------------------------------------------------------


def test_scenarios_are_shipped() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {"quickstart", "batching", "paging", "routing", "azure_conv", "mooncake", "presets"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenario_loads_and_asks_a_question(path: Path) -> None:
    loaded = load_scenario(path)
    scenario = loaded.scenario
    assert scenario.name == path.stem
    assert "?" in scenario.description, "each shipped scenario answers one question, stated in description"
    for variant in loaded.variants().values():
        resolve_replica(variant)


# ----- bad input: one error naming file and field -----------------------------------------------------------


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, "schema_version: 1\nname: x\nworkload: {num_requests: 3\n")
    assert "not valid YAML" in error.message
    assert "line" in error.message


def test_a_scenario_must_be_a_mapping(tmp_path: Path) -> None:
    error = load_error(tmp_path, "- just\n- a list\n")
    assert "mapping" in error.message


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read scenario"):
        load_scenario(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("overrides", "field", "suggestion"),
    [
        ({"engine.batchng": "static"}, "engine.batchng", "batching"),
        ({"engine.kv.blocksize": 16}, "engine.kv.blocksize", "block_size"),
        ({"fleet.replica": 2}, "fleet.replica", "replicas"),
        ({"worklaod": {}}, "worklaod", "workload"),
    ],
)
def test_unknown_key_suggests_the_closest(tmp_path: Path, overrides: dict[str, Any], field: str,
                                          suggestion: str) -> None:
    error = load_error(tmp_path, with_(overrides))
    assert error.field == field
    assert f"did you mean {suggestion!r}" in error.message


def test_wrong_type_names_field_and_value(tmp_path: Path) -> None:
    error = load_error(tmp_path, with_({"engine.max_num_seqs": "lots"}))
    assert error.field == "engine.max_num_seqs"
    assert "'lots'" in error.message


def test_unknown_policy_name_lists_the_choices(tmp_path: Path) -> None:
    error = load_error(tmp_path, with_({"engine.batching": "dynamic"}))
    assert error.field == "engine.batching"
    assert "'chunked'" in error.message and "'dynamic'" in error.message


def test_block_size_must_be_a_power_of_two(tmp_path: Path) -> None:
    error = load_error(tmp_path, with_({"engine.kv.block_size": 24}))
    assert error.field == "engine.kv.block_size"
    assert "power of two" in error.message


def test_model_that_does_not_fit_memory(tmp_path: Path) -> None:
    data = with_({"fleet": {"hardware": "H100", "model": "llama-3-70b", "tp": 1, "profile": None}})
    error = load_error(tmp_path, data)
    assert error.field == "fleet.tp"
    assert "does not fit" in error.message and "H100" in error.message


def test_contiguous_slot_larger_than_the_pool(tmp_path: Path) -> None:
    data = with_({"engine.kv.policy": "contiguous", "engine.kv.num_blocks": 100, "engine.max_model_len": 8192})
    error = load_error(tmp_path, data)
    assert error.field == "engine.max_model_len"


def test_profile_that_does_not_match_the_fleet(tmp_path: Path) -> None:
    error = load_error(tmp_path, with_({"fleet.hardware": "H100"}))
    assert error.field == "fleet.profile"
    assert "does not match" in error.message


def test_a_profile_file_that_is_binary_or_holds_an_absurd_time_is_one_line_naming_it(tmp_path: Path) -> None:
    from simulator.cost.profile import resolve_profile_path

    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x00\x01\xff\xfe binary")
    text = resolve_profile_path("h200-llama-3-8b-tp1-analytic").read_text()
    absurd = tmp_path / "absurd.yaml"
    absurd.write_text(text.replace("weight_s:", "weight_s: 1.0e+308 #", 1))
    for profile, field, needle in ((binary, "fleet.profile", "not a text file"),
                                   (absurd, "fleet.profile (device_s.weight_s)", "less than or equal to 3600")):
        with pytest.raises(ConfigError) as info:
            load_scenario(write(tmp_path, with_({"fleet.profile": str(profile)})))
        error = info.value
        assert error.file == str(profile) and error.field == field and needle in error.message, str(error)
        assert "\n" not in str(error)


def test_trace_and_synthetic_lengths_are_exclusive(tmp_path: Path) -> None:
    data = with_({"workload.trace": {"format": "azure", "path": "x.csv"}})
    error = load_error(tmp_path, data)
    assert error.field is not None and error.field.startswith("workload")


def test_broken_variant_names_the_variant(tmp_path: Path) -> None:
    error = load_error(tmp_path, with_({"variants": {"fast": {"engine.batching": "warp"}}}))
    assert error.field == "variants.fast.engine.batching"


def test_impossible_variant_names_the_variant(tmp_path: Path) -> None:
    data = with_({"variants": {"ok": {}, "big": {"fleet": {"model": "llama-3-70b", "profile": None}}}})
    error = load_error(tmp_path, data)
    assert error.field == "variants.big.fleet.tp"


# ----- --set overrides and seed -------------------------------------------------------------------------


def test_override_values_parse_as_yaml() -> None:
    raw = apply_override({}, "engine.kv.num_blocks=512")
    raw = apply_override(raw, "engine.prefix_caching=false")
    raw = apply_override(raw, "workload.system_prompts={num_prompts: 3, tokens: 64}")
    raw = apply_override(raw, "name=a=b")
    assert raw == {
        "engine": {"kv": {"num_blocks": 512}, "prefix_caching": False},
        "workload": {"system_prompts": {"num_prompts": 3, "tokens": 64}},
        "name": "a=b",
    }


@pytest.mark.parametrize("item", ["no-equals-sign", "=value"])
def test_malformed_override(item: str) -> None:
    with pytest.raises(ConfigError, match="--set expects"):
        apply_override({}, item)


def test_overrides_apply_before_validation(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    loaded = load_scenario(path, ["engine.batching=static", "fleet.replicas=3", "workload.num_requests=7"])
    assert loaded.scenario.engine.batching is Batching.STATIC
    assert loaded.scenario.fleet.replicas == 3
    assert loaded.scenario.workload.num_requests == 7
    error = load_error(tmp_path, BASE, "fleet.replicas=0")
    assert error.field == "fleet.replicas"
    error = load_error(tmp_path, BASE, "engine.kv.bogus=1")
    assert error.field == "engine.kv.bogus"


def test_seed_override_wins(tmp_path: Path) -> None:
    path = write(tmp_path, {**BASE, "seed": 3})
    assert load_scenario(path).scenario.seed == 3
    assert load_scenario(path, seed=11).scenario.seed == 11
    assert load_scenario(path, ["seed=5"], seed=11).scenario.seed == 11


def test_load_mapping_does_not_touch_the_callers_mapping() -> None:
    raw = copy.deepcopy(BASE)
    load_mapping(raw, ["engine.batching=static"])
    assert raw == BASE


# ----- variants and derived settings -------------------------------------------------------------------------


def test_variants_override_the_base_and_nothing_else() -> None:
    loaded = load_mapping(with_({
        "engine.preset": "vllm",
        "variants": {
            "static": {"engine.batching": "static"},
            "small_pool": {"engine": {"kv": {"num_blocks": 300}}},
        },
    }))
    variants = loaded.variants()
    assert list(variants) == ["static", "small_pool"]
    assert variants["static"].engine.batching is Batching.STATIC
    assert variants["static"].engine.kv.num_blocks is None
    assert variants["small_pool"].engine.batching is None
    assert variants["small_pool"].engine.kv.num_blocks == 300
    assert all(v.variants == {} for v in variants.values())
    assert resolve_replica(variants["small_pool"]).scheduler.num_blocks == 300


def test_a_scenario_without_variants_is_one_base_variant() -> None:
    assert list(load_mapping(BASE).variants()) == ["base"]


def test_scenario_is_frozen() -> None:
    scenario = load_mapping(BASE).scenario
    with pytest.raises(pydantic.ValidationError):
        scenario.engine.batching = Batching.STATIC  # type: ignore[misc]


def test_preset_then_explicit_knobs() -> None:
    config = resolve_replica(load_mapping(with_({"engine.preset": "tgi"})).scenario).scheduler
    assert config.batching is Batching.CONTINUOUS and config.kv_policy is KVPolicy.RESERVE
    config = resolve_replica(load_mapping(with_({"engine.preset": "tgi", "engine.kv.policy": "paged",
                                                 "engine.max_num_seqs": 7})).scenario).scheduler
    assert config.batching is Batching.CONTINUOUS and config.kv_policy is KVPolicy.PAGED
    assert config.max_num_seqs == 7


def test_memory_fraction_sizes_the_pool() -> None:
    blocks = {
        fraction: resolve_replica(load_mapping(with_({"engine.kv.memory_fraction": fraction})).scenario)
        .scheduler.num_blocks
        for fraction in (0.5, 0.9)
    }
    assert 0 < blocks[0.5] < blocks[0.9]


def test_kv_blocks_beyond_the_gpus_memory_are_refused() -> None:
    """kv.num_blocks may shrink the pool, never grow it past what the device holds beside the weights."""
    with pytest.raises(ConfigError, match=r"exceed what .* memory holds") as info:
        load_mapping(with_({"engine.kv.num_blocks": 10**12}))
    assert info.value.field == "engine.kv.num_blocks"
    assert load_mapping(with_({"engine.kv.num_blocks": 64})).scenario.engine.kv.num_blocks == 64


def test_a_run_that_cannot_fit_in_memory_is_refused_with_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    from simulator import scenario as scenario_module

    monkeypatch.setattr(scenario_module, "available_memory_bytes", lambda: 8 * 2**30)
    with pytest.raises(ConfigError, match=r"would need about 20\.7 GiB .* has 8\.0 GiB available") as info:
        load_mapping(with_({"workload.num_requests": 10_000_000}))
    assert info.value.field == "workload.num_requests"
    assert load_mapping(with_({"workload.num_requests": 1_000_000})).scenario.workload.num_requests == 1_000_000
    # A duration-limited stream is estimated from its peak rate.
    duration = with_({"workload.duration_s": 10**6, "workload.arrival": {"process": "poisson", "rate_rps": 100}})
    del duration["workload"]["num_requests"]
    with pytest.raises(ConfigError, match="would need about") as info:
        load_mapping(duration)
    assert info.value.field == "workload.duration_s"


def test_default_profile_skips_the_projects_own_engine_unless_nothing_else_matches() -> None:
    """H200 / Llama-3-8B / tp 1 ships both an analytic profile (a serving engine's figures) and one measured
    on this project's engine (its Python loop: a 36 ms floor on prefill steps): a scenario naming only the
    hardware gets the serving engine's; by name it gets the engine's. On the CPU the engine's is the only
    one, so it is chosen."""
    from simulator.cost.profile import FLEETSIM_ENGINE, load_profile
    from simulator.scenario import FleetConfig, pick_profile

    measured = load_profile("h200-llama-3-8b-tp1-measured")
    assert measured.is_measured and measured.measured_on == FLEETSIM_ENGINE
    assert pick_profile(FleetConfig(hardware="H200", model="llama-3-8b", tp=1)).name == "h200-llama-3-8b-tp1-analytic"
    named = FleetConfig(hardware="H200", model="llama-3-8b", tp=1, profile="h200-llama-3-8b-tp1-measured")
    assert pick_profile(named) == measured
    assert pick_profile(FleetConfig(hardware="CPU", model="small", tp=1)).name == "cpu-small-tp1-measured"


@pytest.mark.parametrize("override", [{"": 0}, {"engine.": "static"}, {"engine": 1, "engine.batching": "static"},
                                      {"": 0, ".": 0}], ids=["empty", "empty-part", "value-then-section", "fuzzed"])
def test_a_variant_with_keys_that_cannot_nest_is_one_config_error(override: dict[str, Any]) -> None:
    """Found by the scenario fuzzer: ``{"": 0, ".": 0}`` as a variant stopped on a TypeError (a section
    wanted where a value already was)."""
    raw = {**BASE, "variants": {"a": override}}
    with pytest.raises(ConfigError) as refused:
        load_mapping(raw)
    assert "variants.a" in str(refused.value) and "\n" not in str(refused.value)


def test_replicas_that_fail_faster_than_they_start_need_a_horizon(tmp_path: Path) -> None:
    """A replica failing every 11 s on average while a replacement takes at least 80 s to start: most never
    get ready, and without a horizon the run might never end (the fuzz's 120 s timeouts)."""
    error = load_error(tmp_path, with_({"failures": {"mtbf_h": 0.003}}))
    assert "mtbf_h" in str(error) and "horizon" in error.message
    load_scenario(write(tmp_path, with_({"failures": {"mtbf_h": 0.003}, "simulation.horizon_s": 60})))
    load_scenario(write(tmp_path, with_({"failures": {"mtbf_h": 0.05}})))  # 180 s: replacements get ready
