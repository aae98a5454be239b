"""simulator/core runs inside the real engine and the simulator: standard library only, no I/O."""

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[3] / "simulator" / "core"
FORBIDDEN = {"torch", "simpy", "yaml", "numpy", "pandas", "scipy", "pydantic", "streamlit"}
IO_MODULES = {"io", "os", "pathlib", "socket", "subprocess", "shutil", "tempfile", "urllib", "http",
              "sqlite3", "csv", "json", "pickle", "logging", "sys", "time", "random"}


TYPE_ONLY = {"mypy_extensions", "librt"}
"""Allowed under ``if TYPE_CHECKING:`` only: ``i64`` annotations, machine integers in the compiled build, and
``librt.vecs``' ``vec[i64]``, arrays of them (mypyc compiles its uses to its runtime's C calls; interpreted,
the core holds plain lists instead)."""


def _names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return {node.module.split(".")[0]}
    return set()


def _imported_modules(path: Path) -> tuple[set[str], set[str]]:
    """(modules imported at run time, modules imported for type checking only)."""
    tree = ast.parse(path.read_text())
    type_only_nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            type_only_nodes.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    runtime: set[str] = set()
    type_only: set[str] = set()
    for node in ast.walk(tree):
        (type_only if id(node) in type_only_nodes else runtime).update(_names(node))
    return runtime, type_only


def test_core_imports_only_stdlib_and_itself() -> None:
    files = sorted(CORE.glob("*.py"))
    assert files
    for path in files:
        runtime, type_only = _imported_modules(path)
        for name in runtime:
            assert name == "simulator" or name == "__future__" or name in sys.stdlib_module_names, (
                f"{path.name} imports {name}"
            )
            assert name not in IO_MODULES, f"{path.name} imports the I/O module {name}"
        for name in type_only:
            assert name == "simulator" or name in sys.stdlib_module_names or name in TYPE_ONLY, (
                f"{path.name} imports {name} for type checking"
            )


def test_importing_core_loads_no_heavy_module() -> None:
    code = (
        "import sys, simulator.core.scheduler, simulator.core.presets;"
        f"bad = sorted(m for m in {sorted(FORBIDDEN)!r} if m in sys.modules);"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
