"""YAML input is bounded before it is built: alias bombs, self-referring aliases and deep nesting are one
error, never expanded into memory; everything else loads exactly as PyYAML's safe loader loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import yaml_text
from simulator.cli.main import EXIT_USAGE, main


def billion_laughs(levels: int = 9) -> str:
    """Each level a list of ten aliases of the one before: 10**levels values from a few hundred bytes."""
    lines = ["lol0: &lol0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for k in range(1, levels):
        lines.append(f"lol{k}: &lol{k} [" + ", ".join([f"*lol{k - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_before_it_is_expanded() -> None:
    with pytest.raises(yaml_text.YAMLLimitError, match="once its aliases are expanded"):
        yaml_text.safe_load(billion_laughs())


def test_a_small_alias_tree_still_loads() -> None:
    assert yaml_text.safe_load(billion_laughs(levels=2))["lol1"] == [["lol"] * 10] * 10


def test_an_alias_that_contains_itself_is_refused() -> None:
    with pytest.raises(yaml_text.YAMLLimitError, match="contains it"):
        yaml_text.safe_load("a: &a [1, *a]")


DEEP_LISTS = "[" * 200 + "]" * 200
DEEP_MAPPINGS = "a:\n" + "".join("  " * k + f" k{k}:\n" for k in range(1, 100))


@pytest.mark.parametrize("text", [DEEP_LISTS, DEEP_MAPPINGS])
def test_deep_nesting_is_refused(text: str) -> None:
    with pytest.raises(yaml_text.YAMLLimitError, match="nested deeper"):
        yaml_text.safe_load(text)


def test_the_limits_are_tight() -> None:
    """Exactly MAX_DEPTH levels load; one more does not."""
    depth = yaml_text.MAX_DEPTH
    assert yaml_text.safe_load("[" * (depth - 1) + "1" + "]" * (depth - 1)) is not None
    with pytest.raises(yaml_text.YAMLLimitError):
        yaml_text.safe_load("[" * depth + "1" + "]" * depth)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=40,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_same_values_as_pyyaml(value: Any) -> None:
    text = yaml.safe_dump(value)
    assert yaml_text.safe_load(text) == yaml.safe_load(text)


@pytest.mark.parametrize("text", ["seed: 0\nname: x\nseed: 5\n", "a:\n  b: 1\n  b: 2\n", "- {x: 1, x: 1}\n"])
def test_a_key_given_twice_in_one_mapping_is_refused_naming_its_line(text: str) -> None:
    with pytest.raises(yaml_text.YAMLLimitError, match="given twice") as info:
        yaml_text.safe_load(text)
    assert "line " in str(info.value)


def test_merge_keys_and_one_key_in_different_mappings_still_load() -> None:
    text = "base: &b {x: 1}\nfirst: {<<: *b, y: 2}\nsecond: {<<: *b, y: 3}\n"
    assert yaml_text.safe_load(text) == yaml.safe_load(text)


@pytest.mark.parametrize("content", [billion_laughs().encode(), b"\xff\xfe\x00binary\x00", b"a: &a [*a]\n",
                                     b"schema_version: 1\nseed: 0\nseed: 5\n"])
def test_hostile_scenario_files_are_one_line(content: bytes, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content)
    assert main(["run", str(path), "--quiet", "--out", str(tmp_path / "out")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fleetsim: error: ") and str(path) in err
    assert len(err) < 300 and not (tmp_path / "out").exists()
