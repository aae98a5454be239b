"""Imports run one way: the layers of ``docs/architecture.md``, checked on every module's source.

Bottom to top: ``core`` (the shared serving core) and the foundation modules (``errors``, ``yaml_text``,
``native``); then ``cost``, ``workload`` and ``results``, which import only what is below them (never one
another); then ``fleet``; ``scenario``; ``variant_workers``; ``simulation``; ``planning``; and ``cli`` and
``api`` on top. The
simulator never imports ``calibration`` or ``dashboard``; ``calibration`` never imports ``dashboard``.
And no two modules import each other, directly or round a longer circle.

Imports are read with ``ast`` from the files (function-level and ``TYPE_CHECKING`` imports included: a
dependency is a dependency even when it is deferred), so a lazy import cannot hide an arrow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("simulator", "calibration", "dashboard")

LAYERS: dict[str, int] = {
    "simulator.core": 0,
    "simulator.errors": 0,
    "simulator.yaml_text": 0,
    "simulator.native": 0,
    "simulator.worker_pool": 0,
    "simulator": 1,  # the package file: it only installs the native loader
    "simulator.cost": 2,
    "simulator.workload": 2,
    "simulator.results": 2,
    "simulator.fleet": 3,
    "simulator.scenario": 4,
    "simulator.variant_workers": 5,
    "simulator.simulation": 6,
    "simulator.planning": 7,
    "simulator.native_training": 7,  # runs simulations; the build starts it as a process, never imports it
    "simulator.cli": 8,
    "simulator.api": 8,
    "calibration": 9,
    "dashboard": 10,
}
"""Each unit (a sub-package or a top-level module) and its layer: a unit imports only units of a lower
layer, or itself. Units of one layer are peers and do not import each other."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "simulator": ("calibration", "dashboard"),
    "calibration": ("dashboard",),
}
"""Packages that must never import these, whatever the layers say (the pre-stop hook checks it too)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, name: str) -> set[str]:
    """Every project module ``path`` imports (``from a.b import c`` counts as a.b and, if it is one, a.b.c)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif _is_import_module_call(node):
            found.add(node.args[0].value)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def _is_import_module_call(node: ast.AST) -> bool:
    """``importlib.import_module("a.b")`` (or ``import_module("a.b")``) with a literal name."""
    return (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def project_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (only names that are modules or packages of the project)."""
    paths = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {name: {m for m in imported_modules(path, name) if m in paths and m != name}
            for name, path in sorted(paths.items())}


def unit_of(module: str, layers: Mapping[str, int] = LAYERS) -> str:
    """The longest unit name that is ``module`` or a package above it."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        candidate = ".".join(parts[:k])
        if candidate in layers:
            return candidate
    raise KeyError(f"{module} belongs to no unit of LAYERS: add it to the table (and to docs/architecture.md)")


def upward_arrows(graph: Mapping[str, Iterable[str]], layers: Mapping[str, int] = LAYERS) -> list[str]:
    """Every import from a unit to a unit of its own layer or a higher one (``a -> b``)."""
    bad = []
    for module, targets in graph.items():
        unit = unit_of(module, layers)
        for target in sorted(targets):
            other = unit_of(target, layers)
            if other != unit and layers[other] >= layers[unit]:
                bad.append(f"{module} ({unit}, layer {layers[unit]}) -> {target} ({other}, layer {layers[other]})")
    return bad


def forbidden_arrows(graph: Mapping[str, Iterable[str]]) -> list[str]:
    return [f"{module} -> {target}" for module, targets in graph.items() for target in sorted(targets)
            if target.split(".")[0] in FORBIDDEN.get(module.split(".")[0], ())]


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return project_graph()


def test_every_module_belongs_to_a_layer(graph: dict[str, set[str]]) -> None:
    for module in graph:
        unit_of(module)


def test_no_import_runs_back_up(graph: dict[str, set[str]]) -> None:
    assert upward_arrows(graph) == []


def test_the_simulator_never_imports_calibration_or_dashboard(graph: dict[str, set[str]]) -> None:
    assert forbidden_arrows(graph) == []


def test_no_import_circle(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_the_checks_catch_what_they_look_for() -> None:
    """The checks themselves can fail: an arrow up, an arrow between peers, a forbidden import, a circle."""
    graph = {
        "simulator.results.report": {"simulator.results.run_result"},
        "simulator.results.run_result": {"simulator.results.report", "simulator.fleet.replica"},
        "simulator.cost.profile": {"simulator.workload.traces"},
        "simulator.fleet.replica": {"simulator.core.step"},
        "simulator.scenario": {"calibration.cli"},
    }
    layer = "simulator.{} (simulator.{}, layer {}) -> {} ({}, layer {})".format
    assert upward_arrows(graph) == [
        layer("results.run_result", "results", 2, "simulator.fleet.replica", "simulator.fleet", 3),
        layer("cost.profile", "cost", 2, "simulator.workload.traces", "simulator.workload", 2),
        layer("scenario", "scenario", 4, "calibration.cli", "calibration", 9),
    ]
    assert forbidden_arrows(graph) == ["simulator.scenario -> calibration.cli"]
    assert cycles(graph) == [["simulator.results.report", "simulator.results.run_result"]]


def test_lazy_and_dynamic_imports_are_seen(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import importlib\n"
        "def f():\n"
        "    from simulator.fleet import replica\n"
        "    importlib.import_module('calibration.cli')\n",
        encoding="utf-8",
    )
    assert imported_modules(source, "simulator.x") == {"simulator.fleet", "simulator.fleet.replica", "calibration.cli"}
