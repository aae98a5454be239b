"""Profile schema: shipped profiles load, bad input is one ConfigError naming file and field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.cost.profile import (
    Profile,
    ProfileKind,
    get_accelerator,
    list_profiles,
    load_hardware,
    load_profile,
    parse_profile,
    profiles_dir,
)
from simulator.errors import ConfigError

DEFAULT = "h200-llama-3-8b-tp1-analytic"


def _data() -> dict[str, Any]:
    return yaml.safe_load((profiles_dir() / f"{DEFAULT}.yaml").read_text())


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_shipped_profile_loads_and_is_labelled() -> None:
    names = list_profiles()
    assert DEFAULT in names
    for name in names:
        profile = load_profile(name)
        assert profile.name == name
        if profile.kind is ProfileKind.ANALYTIC:
            assert "not measured" in profile.label


def test_load_by_path_equals_load_by_name() -> None:
    assert load_profile(profiles_dir() / f"{DEFAULT}.yaml") == load_profile(DEFAULT)


def test_a_profile_file_is_read_once_per_version(tmp_path: Path) -> None:
    """Runs of a sweep share one validated profile; editing the file is seen at the next load."""
    data = _data()
    path = _write(tmp_path, data)
    first = load_profile(path)
    assert load_profile(path) is first
    data["name"] = "edited"
    path.write_text(yaml.safe_dump(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))  # even on a coarse clock
    edited = load_profile(path)
    assert edited.name == "edited" and first.name != "edited"


def test_yaml_round_trip(tmp_path: Path) -> None:
    profile = load_profile(DEFAULT)
    assert load_profile(profile.save(tmp_path / "x.yaml")) == profile


def test_unknown_key_suggests_closest(tmp_path: Path) -> None:
    data = _data()
    data["device_s"]["per_tokn_s"] = data["device_s"].pop("per_token_s")
    with pytest.raises(ConfigError) as info:
        load_profile(_write(tmp_path, data))
    err = info.value
    assert err.file is not None and err.file.endswith("p.yaml")
    assert err.field == "device_s.per_tokn_s"
    assert "unknown key 'per_tokn_s'" in err.message and "did you mean 'per_token_s'" in err.message


def test_top_level_unknown_key(tmp_path: Path) -> None:
    data = _data()
    data["hardwar"] = "H200"
    with pytest.raises(ConfigError, match=r"did you mean 'hardware'"):
        load_profile(_write(tmp_path, data))


def test_wrong_type_names_field_and_value(tmp_path: Path) -> None:
    data = _data()
    data["memory"]["kv_capacity_tokens"] = "lots"
    with pytest.raises(ConfigError) as info:
        load_profile(_write(tmp_path, data))
    assert info.value.field == "memory.kv_capacity_tokens"
    assert "'lots'" in info.value.message


def test_negative_coefficient_rejected() -> None:
    data = _data()
    data["device_s"]["weight_s"] = -1.0
    with pytest.raises(ConfigError) as info:
        parse_profile(data, file="x.yaml")
    assert info.value.field == "device_s.weight_s"


def test_missing_field_and_bad_kind() -> None:
    data = _data()
    del data["memory"]
    with pytest.raises(ConfigError) as info:
        parse_profile(data)
    assert info.value.field == "memory"
    data = _data()
    data["kind"] = "guessed"
    with pytest.raises(ConfigError) as info:
        parse_profile(data)
    assert info.value.field == "kind"


def test_derived_from_only_on_analytic() -> None:
    data = _data()
    data["kind"] = "measured"
    data["derived_from"] = "h200-llama-3-8b-tp1-measured"
    with pytest.raises(ConfigError, match="derived_from"):
        parse_profile(data)


def test_unknown_name_suggests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'h200-llama-3-8b-tp1-analytic'"):
        load_profile("h200-llama-3-8b-tp1-analytc")
    with pytest.raises(ConfigError, match="not found"):
        load_profile(tmp_path / "nope.yaml")


def test_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_profile(path)


def test_profile_is_frozen() -> None:
    profile = load_profile(DEFAULT)
    with pytest.raises(Exception, match="frozen"):
        profile.tp = 2  # type: ignore[misc]


def test_kv_capacity_blocks() -> None:
    profile = load_profile(DEFAULT)
    tokens = profile.memory.kv_capacity_tokens
    assert profile.kv_capacity_blocks(16) == tokens // 16
    assert profile.kv_capacity_tokens() == tokens
    # Less memory for the engine: fewer blocks, by exactly the bytes taken away.
    smaller = profile.kv_capacity_tokens(0.8)
    expected = tokens - int(0.1 * profile.memory.device_memory_bytes) // profile.memory.kv_bytes_per_token
    assert abs(smaller - expected) <= 1
    with pytest.raises(ValueError):
        profile.kv_capacity_blocks(0)


def test_schema_fields_have_docstrings() -> None:
    """Every field of the profile schema is followed by its docstring in the source (read with ast: pydantic
    is not asked to extract them at import, which costs every run's start-up)."""
    import ast
    import inspect
    import itertools

    tree = ast.parse(inspect.getsource(Profile))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {
        node.target.id for node, after in itertools.pairwise(body)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)
    }
    assert set(Profile.model_fields) - documented == set()


def test_hardware_table_every_figure_sourced() -> None:
    table = load_hardware()
    assert {"H100", "H200", "A100", "L40S", "B200"} <= set(table)
    h200 = get_accelerator("H200", table)
    assert h200.hbm_bytes > 100e9
    assert get_accelerator("h200", table) == h200
    with pytest.raises(ConfigError, match="did you mean 'H200'"):
        get_accelerator("H20O", table)


def test_hardware_figure_without_source_rejected(tmp_path: Path) -> None:
    from simulator.cost.profile import hardware_path

    data = yaml.safe_load(hardware_path().read_text())
    del data["accelerators"]["H200"]["sources"]["memory_bandwidth_Bps"]
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="memory_bandwidth_Bps"):
        load_hardware(path)
