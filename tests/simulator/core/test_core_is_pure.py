"""simulator/core runs inside the real engine and the simulator: standard library only, no I/O."""

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[3] / "simulator" / "core"
FORBIDDEN = {"torch", "simpy", "yaml", "numpy", "pandas", "scipy", "pydantic", "streamlit"}
IO_MODULES = {"io", "os", "pathlib", "socket", "subprocess", "shutil", "tempfile", "urllib", "http",
              "sqlite3", "csv", "json", "pickle", "logging", "sys", "time", "random"}


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_only_stdlib_and_itself() -> None:
    files = sorted(CORE.glob("*.py"))
    assert files
    for path in files:
        for name in _imported_modules(path):
            assert name == "simulator" or name == "__future__" or name in sys.stdlib_module_names, (
                f"{path.name} imports {name}"
            )
            assert name not in IO_MODULES, f"{path.name} imports the I/O module {name}"


def test_importing_core_loads_no_heavy_module() -> None:
    code = (
        "import sys, simulator.core.scheduler, simulator.core.presets;"
        f"bad = sorted(m for m in {sorted(FORBIDDEN)!r} if m in sys.modules);"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
