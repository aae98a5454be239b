"""Mutated scenarios never end in a traceback: ``fleetsim run`` exits 0, or 2 with one line on stderr.

Each case takes a shipped scenario and applies a few hypothesis-chosen mutations (a leaf replaced by a
value of another type or an extreme one, a key dropped, an unknown key added, a section replaced by a
scalar or a list, deep nesting), then runs it cut to a few requests on two replicas (the size limits are
the loader's own business and are tested elsewhere).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simulator.cli.main import EXIT_USAGE, main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (ROOT / "scenarios").glob("*.yaml") if "${traces}" not in p.read_text())

odd_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.lists(st.integers(-5, 5), max_size=3), st.dictionaries(st.text(max_size=5),
                                                                                     st.integers(), max_size=2),
    st.sampled_from(["", "-1", "1e309", "nan", "../../etc/passwd", "poisson", "paged", "vllm", "0"]),
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def mutate(raw: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    doc = copy.deepcopy(raw)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        where = data.draw(st.sampled_from(paths(doc)[1:]), label="path")
        parent: Any = doc
        for part in where[:-1]:
            parent = parent[part]
        key = where[-1]
        action = data.draw(st.sampled_from(["replace", "drop", "unknown", "nest"]), label="action")
        if action == "replace":
            parent[key] = data.draw(odd_values, label="value")
        elif action == "drop" and isinstance(parent, dict):
            del parent[key]
        elif action == "unknown" and isinstance(parent, dict):
            parent[data.draw(st.text(min_size=1, max_size=8), label="new key")] = data.draw(odd_values)
        elif action == "nest":
            nested: Any = parent[key]
            for _ in range(data.draw(st.integers(1, 200), label="depth")):
                nested = [nested]
            parent[key] = nested
    return doc


@pytest.mark.skipif(not SHIPPED, reason="no shipped scenario without a trace")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_scenario_is_run_or_one_line(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    source = data.draw(st.sampled_from(SHIPPED), label="scenario")
    doc = mutate(yaml.safe_load(source.read_text()), data)
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "mutated.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    capsys.readouterr()
    code = main(["run", str(path), "--quiet", "--out", str(folder / "out"),
                 "--set", "workload.num_requests=20", "--set", "fleet.replicas=2"])
    err = capsys.readouterr().err
    event(f"exit {code}")
    assert code in (0, EXIT_USAGE), err
    if code == EXIT_USAGE:
        assert err.count("\n") == 1 and err.startswith("fleetsim: error: "), err
        assert len(err) < 2000, err[:200]
