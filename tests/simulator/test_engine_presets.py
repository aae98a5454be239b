"""Engine presets: the shipped table loads and is sourced, bad input is one ConfigError naming file and
field, and every preset's host time grows with the step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.engines import (
    Basis,
    EngineTable,
    engines_path,
    get_engine,
    host_coefficients,
    load_engines,
)
from simulator.cost.profile import load_profile
from simulator.errors import ConfigError

PRESETS = ("vllm-v0", "vllm-v1", "vllm-v1-async", "sglang", "trtllm", "tgi")
PROFILE = "h200-llama-3-8b-tp1-analytic"


def _data() -> dict[str, Any]:
    return yaml.safe_load(engines_path().read_text())


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "engines.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _error(tmp_path: Path, data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        load_engines(_write(tmp_path, data))
    text = str(info.value)
    assert "\n" not in text
    assert str(tmp_path / "engines.yaml") in text
    return text


def test_shipped_table_loads_with_every_preset() -> None:
    table = load_engines()
    assert isinstance(table, EngineTable)
    assert set(PRESETS) <= set(table.engines)
    assert table.default == "vllm-v1-async"
    assert get_engine() is table.engines["vllm-v1-async"]
    assert table.default_source


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_sourced(name: str) -> None:
    preset = get_engine(name)
    assert preset.source.strip()
    assert "http" in preset.source or "/" in preset.source  # names a URL or a repository path


def test_overlap_follows_the_engine_design() -> None:
    overlapped = {name for name in PRESETS if get_engine(name).overlap_host}
    assert overlapped == {"vllm-v1-async", "sglang"}


def test_sync_and_async_vllm_v1_differ_only_in_overlap() -> None:
    sync, asyn = get_engine("vllm-v1"), get_engine("vllm-v1-async")
    assert (sync.h0_s, sync.per_seq_s, sync.per_token_s) == (asyn.h0_s, asyn.per_seq_s, asyn.per_token_s)
    assert not sync.overlap_host and asyn.overlap_host


def test_assumed_presets_say_so() -> None:
    for name in ("trtllm", "tgi"):
        preset = get_engine(name)
        assert {preset.basis.h0_s, preset.basis.per_seq_s, preset.basis.per_token_s} == {Basis.ASSUMED}
        assert "assumption" in preset.source


def test_host_coefficients_label_the_engine() -> None:
    host, overlap = host_coefficients("sglang")
    preset = get_engine("sglang")
    assert (host.h0_s, host.per_seq_s, host.per_token_s) == (preset.h0_s, preset.per_seq_s, preset.per_token_s)
    assert host.engine == "sglang"
    assert host.source == preset.source
    assert overlap is True
    default_host, default_overlap = host_coefficients()
    assert default_host.engine == "vllm-v1-async" and default_overlap is True


def test_unknown_name_suggests_and_lists() -> None:
    with pytest.raises(ConfigError) as info:
        get_engine("vllm-v1-asnyc")
    text = str(info.value)
    assert "unknown engine 'vllm-v1-asnyc'" in text
    assert "did you mean 'vllm-v1-async'" in text
    for name in PRESETS:
        assert name in text
    assert info.value.field == "engine"
    with pytest.raises(ConfigError, match="did you mean 'tgi'"):
        host_coefficients("tgl")


def test_missing_field_is_named(tmp_path: Path) -> None:
    data = _data()
    del data["engines"]["sglang"]["per_seq_s"]
    text = _error(tmp_path, data)
    assert "engines.sglang.per_seq_s" in text
    assert "required" in text.lower()


def test_unknown_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    data = _data()
    data["engines"]["tgi"]["h0"] = data["engines"]["tgi"].pop("h0_s")
    text = _error(tmp_path, data)
    assert "engines.tgi.h0" in text
    assert "did you mean 'h0_s'" in text


def test_negative_value_is_named(tmp_path: Path) -> None:
    data = _data()
    data["engines"]["trtllm"]["per_token_s"] = -1e-9
    text = _error(tmp_path, data)
    assert "engines.trtllm.per_token_s" in text
    assert "greater than or equal to 0" in text
    assert "-1e-09" in text


def test_empty_source_is_rejected(tmp_path: Path) -> None:
    data = _data()
    data["engines"]["vllm-v0"]["source"] = "   "
    assert "engines.vllm-v0.source" in _error(tmp_path, data)


def test_bad_basis_is_named(tmp_path: Path) -> None:
    data = _data()
    data["engines"]["vllm-v1"]["basis"]["h0_s"] = "guessed"
    text = _error(tmp_path, data)
    assert "engines.vllm-v1.basis.h0_s" in text


def test_default_must_be_a_preset(tmp_path: Path) -> None:
    data = _data()
    data["default"] = "vllm-v2"
    text = _error(tmp_path, data)
    assert "default: not a preset (did you mean 'vllm-v1'?)" in text
    assert "(got 'vllm-v2')" in text


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read engine table"):
        load_engines(tmp_path / "absent.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_engines(path)


@given(
    name=st.sampled_from(PRESETS),
    num_seqs=st.integers(1, 4096),
    extra_tokens=st.integers(0, 65536),
    more_seqs=st.integers(0, 512),
    more_tokens=st.integers(0, 65536),
)
def test_host_time_is_non_decreasing_in_seqs_and_tokens(
    name: str, num_seqs: int, extra_tokens: int, more_seqs: int, more_tokens: int
) -> None:
    """Priced by the simulator's own CostModel (the one copy of the host formula): a step with more
    sequences or more new tokens never costs less host time."""
    host, overlap = host_coefficients(name)
    profile = load_profile(PROFILE).model_copy(update={"host_s": host, "overlap_host": overlap})
    model = CostModel(profile)

    def shape(b: int, n: int) -> StepShape:
        # One prefill row and b - 1 decode rows: prefill tokens > 0, so no CUDA-graph padding applies.
        return StepShape(
            num_seqs=b,
            num_new_tokens=n,
            num_decode_seqs=b - 1,
            decode_context_sum=b - 1,
            num_prefill_tokens=n - (b - 1),
            prefill_attention_pairs=0.0,
        )

    b, n = num_seqs, num_seqs + extra_tokens
    base = model.host_time(shape(b, n))
    assert base > 0
    assert model.host_time(shape(b, n + more_tokens)) >= base
    assert model.host_time(shape(b + more_seqs, n + more_seqs + more_tokens)) >= base


# ----- the scenario picks the host term of the engine it runs -------------------------------------------

WORKLOAD = {"num_requests": 10, "arrival": {"process": "poisson", "rate_rps": 1.0},
            "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 10}}


def _replica(overrides: list[str]) -> Any:
    from simulator.scenario import load_mapping, resolve_replica

    raw = {"schema_version": 1, "name": "host", "workload": WORKLOAD,
           "fleet": {"profile": PROFILE}, "engine": {"preset": "vllm"}}
    return resolve_replica(load_mapping(raw, overrides).scenario)


def test_vllm_runs_async_with_its_host_work_overlapped() -> None:
    setup = _replica([])
    assert setup.scheduler.async_scheduling
    assert setup.profile.host_s.engine == "vllm-v1-async" and setup.profile.overlap_host


def test_synchronous_vllm_pays_its_host_work_between_steps() -> None:
    setup = _replica(["engine.async_scheduling=false"])
    assert not setup.scheduler.async_scheduling
    assert setup.profile.host_s.engine == "vllm-v1" and not setup.profile.overlap_host
    expected, overlap = host_coefficients("vllm-v1")
    assert setup.profile.host_s == expected and overlap is False


@pytest.mark.parametrize(("preset", "engine"), [("tgi", "tgi"), ("trtllm", "trtllm"), ("trtllm-max-util", "trtllm")])
def test_other_presets_pay_their_engines_host_work(preset: str, engine: str) -> None:
    setup = _replica([f"engine.preset={preset}"])
    assert not setup.scheduler.async_scheduling
    assert setup.profile.host_s.engine == engine
    assert setup.profile.overlap_host == get_engine(engine).overlap_host


def test_a_measured_profile_keeps_its_measured_host_term() -> None:
    from simulator.scenario import load_mapping, resolve_replica

    raw = {"schema_version": 1, "name": "host", "workload": WORKLOAD,
           "fleet": {"profile": "cpu-small-tp1-measured", "hardware": "cpu", "model": "small"},
           "engine": {"preset": "tgi"}}
    setup = resolve_replica(load_mapping(raw).scenario)
    assert setup.profile.host_s == load_profile("cpu-small-tp1-measured").host_s


def test_async_scheduling_yields_to_an_incompatible_option_unless_asked_for() -> None:
    assert not _replica(["engine.batching=static"]).scheduler.async_scheduling  # as vLLM turns it off
    with pytest.raises(ConfigError) as info:
        _replica(["engine.batching=static", "engine.async_scheduling=true"])
    assert info.value.field == "engine.async_scheduling"


@pytest.mark.parametrize(("hardware", "entry_point", "expected"), [
    ("H200", "api_server", (8192, 1024)),
    ("H200", "offline", (16384, 1024)),
    ("A100", "api_server", (2048, 256)),
    ("A100", "offline", (8192, 256)),
])
def test_vllm_batch_defaults_follow_the_gpu_and_the_entry_point(
    hardware: str, entry_point: str, expected: tuple[int, int],
) -> None:
    """vLLM's EngineArgs.get_batch_defaults: by device memory (>= 70 GiB, not an A100) and UsageContext."""
    setup = _replica([f"fleet.profile={hardware.lower()}-llama-3-8b-tp1-analytic", f"fleet.hardware={hardware}",
                      f"engine.entry_point={entry_point}"])
    assert (setup.scheduler.max_num_batched_tokens, setup.scheduler.max_num_seqs) == expected
