"""Mutated scenarios never end in a traceback: ``fleetsim run`` exits 0, or 2 with one line on stderr.

Each case takes a shipped scenario and applies a few hypothesis-chosen mutations (a leaf replaced by a
value of another type or an extreme one, a key dropped, an unknown key added, a section replaced by a
scalar or a list, deep nesting, any field of the scenario schema set to an extreme or odd value), then
runs it cut to a few requests on two replicas (the size limits are the loader's own business and are
tested elsewhere).
"""

from __future__ import annotations

import copy
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from simulator.cli.main import EXIT_USAGE, main
from simulator.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (ROOT / "scenarios").glob("*.yaml") if "${traces}" not in p.read_text())

odd_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.lists(st.integers(-5, 5), max_size=3), st.dictionaries(st.text(max_size=5),
                                                                                     st.integers(), max_size=2),
    st.sampled_from(["", "-1", "1e309", "nan", "../../etc/passwd", "poisson", "paged", "vllm", "0"]),
)


MAX_NESTING = 150
"""Deepest a mutated document gets. Past the loader's 64 levels, so that refusal is exercised; well short of
where the harness's own ``yaml.safe_dump`` (recursive, ~3 frames a level) meets Python's recursion limit:
about 330 levels in a plain process and fewer under pytest-xdist's deeper stack. Two 200-level nests on one
path used to reach 400, so the harness itself raised RecursionError before fleetsim saw the file, and only
in parallel runs; rerun alone the same case passed."""


def depth(value: Any) -> int:
    """Levels of lists and mappings in ``value`` (iteratively: the value may be deep)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            stack.extend((child, level) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def schema_fields(model: type[BaseModel] = Scenario, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field a scenario may set (sections walked, a union of sections taken as one field): the
    'field' mutation sets one of them, present in the shipped file or not."""
    out: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        sections = [a for a in (typing.get_args(info.annotation) or (info.annotation,))
                    if isinstance(a, type) and issubclass(a, BaseModel)]
        out += schema_fields(sections[0], (*prefix, name)) if len(sections) == 1 else [(*prefix, name)]
    return out


FIELDS = schema_fields()
extreme_numbers = st.sampled_from([0, -1, 1, 2, 1e-300, 1e-9, 1e-3, 0.5, 1e3, 1e6, 1e9, 1e12, 1e300, 2**31, 2**63,
                                   10**7, 16_000_000])


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
        action = data.draw(st.sampled_from(["replace", "drop", "unknown", "nest", "field"]), label="action")
        if action == "field":
            set_field(doc, data.draw(st.sampled_from(FIELDS), label="field"),
                      data.draw(st.one_of(extreme_numbers, odd_values), label="value"))
        elif action == "replace":
            parent[key] = data.draw(odd_values, label="value")
        elif action == "drop" and isinstance(parent, dict):
            del parent[key]
        elif action == "unknown" and isinstance(parent, dict):
            parent[data.draw(st.text(min_size=1, max_size=8), label="new key")] = data.draw(odd_values)
        elif action == "nest" and (room := MAX_NESTING - depth(doc)) > 0:
            nested: Any = parent[key]
            for _ in range(data.draw(st.integers(1, room), label="depth")):
                nested = [nested]
            parent[key] = nested
    return doc


def set_field(doc: dict[str, Any], field: tuple[str, ...], value: Any) -> None:
    """``doc[a][b]... = value``, making the sections on the way (a section that is not a mapping stays)."""
    parent: Any = doc
    for part in field[:-1]:
        if not isinstance(parent, dict):
            return
        parent = parent.setdefault(part, {})
    if isinstance(parent, dict):
        parent[field[-1]] = value


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_harness_can_write_every_document_it_makes(data: st.DataObject) -> None:
    """Mutations alone (fast): the deepest document stays within MAX_NESTING, and yaml.safe_dump writes it
    with a fifth of the recursion limit already used (a deep caller's stack, as under xdist)."""
    import sys

    doc = mutate(yaml.safe_load(data.draw(st.sampled_from(SHIPPED)).read_text()), data)
    assert depth(doc) <= MAX_NESTING

    def at_depth(levels: int) -> str:
        return at_depth(levels - 1) if levels else yaml.safe_dump(doc)

    at_depth(sys.getrecursionlimit() // 5)


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


QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


@pytest.mark.parametrize(("override", "code", "message"), [
    ("simulation.sample_interval_s=1e-7", EXIT_USAGE, "time-series points, more than 10,000,000"),  # hung
    ("simulation.horizon_s=1e12", EXIT_USAGE, "(the horizon_s)"),  # hung filling the grid to the horizon
    ("simulation.cost_factor=1e300", EXIT_USAGE, "(the least the run can last)"),
    ("simulation.warmup_s=1e300", EXIT_USAGE, "within simulation.warmup_s"),  # ValueError traceback
    ("simulation={horizon_s: 5, warmup_s: 10}", EXIT_USAGE, "warmup_s (10) must be shorter than horizon_s (5)"),
    ("simulation.warmup_s=5", 0, ""),  # TypeError traceback printing an attainment of None
    ("simulation.horizon_s=1e-300", 0, ""),  # the same
    ("router={policy: session_affinity, virtual_nodes: 100000000}", EXIT_USAGE, "hash-ring points"),
    ("workload.system_prompts={num_prompts: 1000000000, tokens: 100}", EXIT_USAGE,
     "less than or equal to 1000000"),  # killed for memory
], ids=["fine-grid", "far-horizon", "slow-steps", "warmup-past-the-run", "warmup-past-horizon", "no-attainment",
        "tiny-horizon", "huge-ring", "billion-prompts"])
def test_fields_the_fuzzer_now_sets_are_one_line_or_run(override: str, code: int, message: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """What the 'field' mutation found once it could set fields the shipped files lack (each a hang, a
    memory kill or a traceback before)."""
    assert main(["run", str(QUICKSTART), "--quiet", "--summary-only", "--out", str(tmp_path / "out"), "--set",
                 "workload.num_requests=20", "--set", "fleet.replicas=2", "--set", override]) == code
    err = capsys.readouterr().err
    if code == EXIT_USAGE:
        assert err.count("\n") == 1 and err.startswith("fleetsim: error: ") and message in err, err
    else:
        assert "Traceback" not in err
