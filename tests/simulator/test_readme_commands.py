"""Every command the README advertises runs, at small scale, after exactly the install the README gives for
it: nothing more importable than fleetsim's base dependencies plus the extras its row names.

Each command runs as ``fleetsim ...`` in a fresh folder, in a subprocess whose ``sitecustomize`` makes every
module of a distribution outside that install unimportable (``sys.modules[name] = None``: ``import`` raises
ModuleNotFoundError and ``find_spec`` answers None, as on a machine without the package). The blocker rides on
PYTHONPATH, so the processes a command starts (plan and sweep workers, Ray, the Streamlit server) are held to
the same install. The table is read from README.md: a row without a case here fails, as does a case whose
install differs from what its row says.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from simulator.workload.trace_sources import traces_dir

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SCENARIOS = ROOT / "scenarios"
VIDUR = ROOT.parent / "shared" / "data" / "profiling" / "vidur"
OWN = {"simulator", "calibration", "dashboard"}
SMALL = ["--set", "workload.num_requests=40", "--quiet"]


@dataclass(frozen=True)
class Case:
    readme: str
    """The command exactly as README.md writes it."""
    argv: tuple[str, ...]
    """What runs: the README's command at small scale (``{scenarios}`` is the shipped scenarios folder)."""
    extras: frozenset[str] = frozenset()
    """The extras the README's row says to install."""
    expect: str = ""
    """A file the command must have written (relative to its folder)."""
    prints: str = ""
    """Text the command must print."""
    needs: str = ""
    """shared data the command reads: 'traces' or 'vidur' (skipped, saying so, without it)."""


def run_case(readme: str, scenario: str, expect: str, *, needs: str = "") -> Case:
    return Case(readme, ("run", f"{{scenarios}}/{scenario}.yaml", "--out", "out", *SMALL), expect=expect,
                needs=needs)


CASES: dict[str, Case] = {
    "quickstart": run_case("fleetsim run scenarios/quickstart.yaml", "quickstart", "out/report.html"),
    "batching": run_case("fleetsim run scenarios/batching.yaml", "batching", "out/report.html"),
    "paging": run_case("fleetsim run scenarios/paging.yaml", "paging", "out/report.html"),
    "routing": run_case("fleetsim run scenarios/routing.yaml", "routing", "out/report.html"),
    "presets": run_case("fleetsim run scenarios/presets.yaml", "presets", "out/report.html"),
    "moe": run_case("fleetsim run scenarios/moe.yaml", "moe", "out/report.html"),
    "disaggregation": run_case("fleetsim run scenarios/disaggregation.yaml", "disaggregation", "out/report.html"),
    "speculative": run_case("fleetsim run scenarios/speculative.yaml", "speculative", "out/report.html"),
    "day": run_case("fleetsim run scenarios/day.yaml", "day", "out/decisions.csv"),
    "azure_conv": run_case("fleetsim run scenarios/azure_conv.yaml", "azure_conv", "out/report.html",
                           needs="traces"),
    "mooncake": run_case("mooncake.yaml", "mooncake", "out/report.html", needs="traces"),
    "kv_tiers": run_case("fleetsim run scenarios/kv_tiers.yaml", "kv_tiers", "out/report.html", needs="traces"),
    "plan": Case("fleetsim plan SCENARIO --slo ttft_ms=500,tpot_ms=50",
                 ("plan", "{scenarios}/quickstart.yaml", "--slo", "ttft_ms=500,tpot_ms=50", "--set",
                  "workload.num_requests=60", "--max-replicas", "4", "--out", "out", "--quiet"),
                 expect="out/plan.html"),
    "plan-layouts": Case(
        "fleetsim plan SCENARIO --layouts aggregated,disaggregated [--pool-hardware decode=A100,H100] "
        "[--objective cost]",
        ("plan", "{scenarios}/quickstart.yaml", "--layouts", "aggregated,disaggregated", "--slo",
         "ttft_ms=500,tpot_ms=50", "--set", "workload.num_requests=60", "--max-gpus", "4", "--out", "out",
         "--quiet"), expect="out/layouts.json"),
    "sweep": Case("fleetsim sweep scenarios/grids/quickstart_grid.yaml [--executor ray]",
                  ("sweep", "grid.yaml", "--workers", "2", "--out", "out", "--quiet"), expect="out/sweep.csv"),
    "sweep-ray": Case("fleetsim sweep scenarios/grids/quickstart_grid.yaml [--executor ray]",
                      ("sweep", "grid.yaml", "--executor", "ray", "--workers", "2", "--out", "out", "--quiet"),
                      extras=frozenset({"ray"}), expect="out/sweep.csv"),
    "dashboard": Case("fleetsim dashboard", ("dashboard", "--headless"), extras=frozenset({"dashboard"})),
    "calibrate": Case("fleetsim calibrate --device cpu --model small --out P.yaml",
                      ("calibrate", "--device", "cpu", "--model", "tiny", "--grid", "ci", "--out", "P.yaml",
                       "--quiet"), extras=frozenset({"engine"}), expect="P.yaml"),
    "from-published": Case(
        "fleetsim calibrate --from-published vidur --hardware A100 --model llama-2-70b --tp 8 --out P.yaml",
        ("calibrate", "--from-published", "vidur", "--hardware", "A100", "--model", "llama-2-70b", "--tp", "8",
         "--out", "P.yaml"), expect="P.yaml", needs="vidur"),
    "validate": Case("fleetsim validate --profile P.yaml ...",
                     ("validate", "--profile", "P.yaml", "--num-requests", "10", "--quiet"),
                     extras=frozenset({"engine"}), prints="verdict:"),
    "profiles": Case("fleetsim profiles", ("profiles",), prints="h200-llama-3-8b-tp1-analytic"),
    "policies": Case("fleetsim policies", ("policies",), prints="router"),
    "traces": Case("fleetsim traces", ("traces",), prints="azure_llm_2023_conv.csv"),
    "version": Case("fleetsim --version", ("--version",), prints="fleetsim "),
}


# ----- what the README says ------------------------------------------------------------------------------


def readme_commands() -> dict[str, str]:
    """Every advertised command -> the README text that says how to install for it (its table row; the
    quick start and the 'Also' paragraph name none beyond the base install)."""
    text = README.read_text(encoding="utf-8")
    found: dict[str, str] = {}
    quick = re.search(r"```bash\n(.*?)```", text, re.S)
    assert quick is not None
    for line in quick.group(1).splitlines():
        if "fleetsim run" in line:
            found[line.split("&&")[1].split("#")[0].strip()] = line
    table = text[text.index("## The questions it answers") : text.index("## Dashboard")]
    for row in table.splitlines():
        if row.startswith("| `"):
            first = row.split(" | ")[0]
            for command in re.findall(r"`([^`]+)`", first):
                found[command] = row
    also = table[table.index("Also ") :]
    for command in re.findall(r"`(fleetsim [a-z-]+)`", also.split("Options common")[0]):
        found[command] = ""
    return found


def extras_named(row: str) -> set[str]:
    return set(re.findall(r"\.\[(\w+)\]", row)) | set(re.findall(r"the `(\w+)` extra", row))


def test_every_readme_command_has_a_case_with_the_install_its_row_names() -> None:
    commands = readme_commands()
    assert {case.readme for case in CASES.values()} == set(commands), "README and the cases disagree"
    for name, case in CASES.items():
        row = commands[case.readme]
        named = extras_named(row)
        if "[--executor ray]" in case.readme:  # the row names Ray's extra for the Ray executor only
            assert named == {"ray"} and case.extras == ({"ray"} if "ray" in case.argv else set()), name
        else:
            assert named == set(case.extras), (name, named, case.extras)


# ----- exactly that install ------------------------------------------------------------------------------


def installed_closure(extras: frozenset[str]) -> set[str]:
    """Distributions ``pip install -e '.[extras]'`` brings in: fleetsim's requirements with those extras,
    and theirs, transitively (by canonical name)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [("fleetsim", extras)]
    while todo:
        name, wanted = todo.pop()
        key = (canonicalize_name(name), wanted)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue  # a platform-conditional requirement that is not installed here
        for text in requires:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in (wanted or {""})):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return {name for name, _ in seen}


def blocked_modules(extras: frozenset[str]) -> dict[str, str]:
    """Top-level module -> the folder its distribution installed it in, for every module that the install
    with ``extras`` would not have."""
    allowed = installed_closure(extras)
    # Only what pip installed: once this process has imported Ray, its vendored copies (ray/thirdparty_files:
    # colorama, psutil, each with its dist-info) are on sys.path too, and blocking them would break Ray.
    installed = {Path(p).resolve() for p in site.getsitepackages()}
    blocked: dict[str, str] = {}
    for module, dists in packages_distributions().items():
        if module in OWN or not module.isidentifier() or any(canonicalize_name(d) in allowed for d in dists):
            continue
        where = Path(str(distribution(dists[0]).locate_file(""))).resolve()
        if where in installed:
            blocked[module] = str(where)
    return blocked


# Python's path finder, but a blocked module is looked for everywhere except where its distribution put it:
# a copy vendored inside an allowed package (Ray ships psutil) is still found, and find_spec answers None
# for the rest, as it would on a machine without that distribution.
BLOCKER = """import importlib.machinery, json, os, sys
from pathlib import Path

_BLOCKED = json.loads(os.environ.get("FLEETSIM_README_BLOCKED", "{}"))


class _InstallFinder(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        spec = super().find_spec(fullname, path, target)
        where = _BLOCKED.get(fullname)
        if spec is None or where is None or not spec.origin and not spec.submodule_search_locations:
            return spec
        places = [spec.origin or "", *(spec.submodule_search_locations or [])]
        if not any(Path(p).resolve().parent == Path(where) for p in places if p):
            return spec
        elsewhere = [p for p in (path or sys.path) if Path(p or ".").resolve() != Path(where)]
        return super().find_spec(fullname, elsewhere, target)


sys.meta_path[:] = [_InstallFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""


def environment(folder: Path, extras: frozenset[str]) -> dict[str, str]:
    shim = folder / ".install"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COV_CORE_SOURCE")}
    return {**env, "PYTHONPATH": str(shim), "FLEETSIM_README_BLOCKED": json.dumps(blocked_modules(extras)),
            "FLEETSIM_NO_NATIVE_NOTICE": "1"}


def fleetsim() -> list[str]:
    script = Path(sys.executable).with_name("fleetsim")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "simulator.cli.main"]


def test_the_blocker_blocks_what_the_install_lacks(tmp_path: Path) -> None:
    """The harness itself: under the base install torch, streamlit, ray and pytest are missing and the
    engine command says which extra it needs; numpy (a base dependency) imports."""
    base = blocked_modules(frozenset())
    assert {"torch", "streamlit", "ray", "pytest", "hypothesis"} <= set(base) and "numpy" not in base
    assert "torch" not in blocked_modules(frozenset({"engine"}))
    code = ("import importlib.util, numpy; print([importlib.util.find_spec(m) is None "
            "for m in ('torch', 'streamlit', 'ray')])")
    done = subprocess.run([sys.executable, "-c", code], env=environment(tmp_path, frozenset()), capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "[True, True, True]", done.stderr
    folder = tmp_path / "cli"
    folder.mkdir()
    done = subprocess.run([*fleetsim(), "calibrate", "--device", "cpu", "--model", "tiny", "--out", "P.yaml"],
                          cwd=folder, env=environment(folder, frozenset()), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "pip install -e '.[engine]'" in done.stderr and "Traceback" not in done.stderr


# ----- the commands --------------------------------------------------------------------------------------


def small_grid(folder: Path) -> Path:
    """The README's grid with two values per axis and 40 requests per task."""
    grid = yaml.safe_load((SCENARIOS / "grids" / "quickstart_grid.yaml").read_text())
    grid["scenario"] = str((SCENARIOS / "grids" / grid["scenario"]).resolve())
    grid["grid"] = {key: values[:2] for key, values in grid["grid"].items()}
    grid["set"]["workload.num_requests"] = 40
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve_dashboard(argv: list[str], folder: Path, env: dict[str, str]) -> str:
    """Start the dashboard as the README says, wait until it answers, stop it; what it answered."""
    port = free_port()
    server = subprocess.Popen([*argv, "--port", str(port)], cwd=folder, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as answer:
                    return str(answer.read().decode())
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the dashboard did not answer (exit {server.poll()}): "
                                f"{server.stderr.read() if server.stderr else ''}")
                time.sleep(0.3)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.parametrize("name", list(CASES))
def test_readme_command_runs_after_its_install(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    if case.needs == "traces" and not traces_dir().is_dir():
        pytest.skip(f"shared traces not found at {traces_dir()} (`fleetsim traces --download all` gets them)")
    if case.needs == "vidur" and not VIDUR.is_dir():
        pytest.skip(f"Vidur's published measurements not found at {VIDUR}")
    if "ray" in case.extras and shutil.which("ray", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("ray is not installed here")
    env = environment(tmp_path, case.extras)
    if name == "sweep" or name == "sweep-ray":
        small_grid(tmp_path)
    argv = [*fleetsim(), *(a.replace("{scenarios}", str(SCENARIOS)) for a in case.argv)]
    if name == "dashboard":
        assert serve_dashboard(argv, tmp_path, env).strip() == "ok"
        return
    if name == "validate":  # a profile of this engine first, as the README's calibrate row makes one
        calibrate = CASES["calibrate"]
        done = subprocess.run([*fleetsim(), *calibrate.argv], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    if case.expect:
        assert (tmp_path / case.expect).is_file(), sorted(p.name for p in tmp_path.rglob("*"))
    assert case.prints in done.stdout, done.stdout[-2000:]
