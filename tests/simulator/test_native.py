"""The optional mypyc build of the hot path: used only for exactly the sources on disk, and it gives the
same per-request results as pure Python (it is the same code, compiled)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from simulator import native

# Runs a few fast-path test scenarios (preemption, prefix caching, swap, an MoE profile), a disaggregated one
# (prefill and decode pools, decode-side preemption) and one through KV tiers and a shared store, and saves
# every per-request column; and the speed benchmark's realistic case and its overloaded variant (prefix
# caching on multi-turn sessions, session affinity; preemptions), and speculative decoding (its acceptance
# draws run on 32-bit halves compiled, on Python ints interpreted).
RUN = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
import simulator.native
from simulator.simulation import run
from simulator.scenario import load_mapping
from test_fast_path import BASE, CASES
from test_disaggregation import FAST_CASES, scenario
from test_kv_tiers import STORE, sessions_through_tiers
from test_speed_cases import SIM_SPEED
columns = {{}}
for case in ("chunked", "overload-preemption", "sessions-prefix", "tgi-swap", "moe-ep-sync"):
    result = run(load_mapping(BASE, CASES[case])).variants["base"]
    for name, values in result.requests.columns().items():
        columns[case + "/" + name] = values
result = run(load_mapping(scenario(), FAST_CASES["decode-preemption"])).variants["base"]
for name, values in result.requests.columns().items():
    columns["disaggregated/" + name] = values
result = run(load_mapping(sessions_through_tiers(STORE))).variants["tiers"]
for name, values in result.requests.columns().items():
    columns["tiers/" + name] = values
speculative = ["engine.async_scheduling=false", "engine.speculative={{method: draft_model, "
               "num_speculative_tokens: 3, acceptance_rate: 0.7, draft_cost_fraction: 0.05}}"]
result = run(load_mapping(BASE, speculative)).variants["base"]
for name, values in result.requests.columns().items():
    columns["speculative/" + name] = values
for case in ("sessions+affinity", "overload"):
    result = run(load_mapping(SIM_SPEED.CASES[case](1500, 4, 8.0))).variants["base"]
    for name, values in result.requests.columns().items():
        columns[case + "/" + name] = values
np.savez({out!r}, **columns)
print("active" if simulator.native.active() else "pure")
"""


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in (native.AUTO_ENV, native.NOTICE_ENV)}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          check=True)


def _python(code: str, **env: str) -> str:
    return _run_python(code, **env).stdout.strip()


def test_no_build_for_these_sources_means_pure_python(tmp_path: Path) -> None:
    # A build folder for other sources (a stale digest) is never loaded.
    stale = tmp_path / "0123456789abcdef0123"
    stale.mkdir()
    (stale / "manifest.json").write_text(json.dumps({"digest": stale.name, "files": {}}))
    code = "import simulator.native as n, simulator.core.scheduler as s; print(n.active(), s.__file__)"
    active, path = _python(code, FLEETSIM_NATIVE_CACHE=str(tmp_path), FLEETSIM_PURE_PYTHON="").split()
    assert active == "False" and path.endswith("scheduler.py")


def test_digest_follows_the_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "simulator"
    shutil.copytree(Path(native.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(native, "_PACKAGE_ROOT", tmp_path)
    before = native.source_digest()
    scheduler = copy / "core" / "scheduler.py"
    scheduler.write_text(scheduler.read_text() + "\n# an edit\n")
    assert native.source_digest() != before


def test_a_build_serves_only_environments_with_its_runtime_library(monkeypatch: pytest.MonkeyPatch) -> None:
    # Compiled modules import mypyc's runtime library (librt): an environment without it, or with another
    # version, names another build (and, finding none, runs pure Python) rather than loading one that fails.
    monkeypatch.setattr(native, "runtime_version", lambda: "0.17.0")
    with_it = native.source_digest()
    monkeypatch.setattr(native, "runtime_version", lambda: "0.18.0")
    other = native.source_digest()
    monkeypatch.setattr(native, "runtime_version", lambda: "")
    without = native.source_digest()
    assert len({with_it, other, without}) == 3


def test_the_runtime_version_is_read_without_importing_it() -> None:
    code = ("import sys, importlib.metadata as m, simulator.native as n; v = n.runtime_version(); "
            "print(v == (m.version('librt') if v else ''), 'librt' in sys.modules)")
    assert _python(code) == "True False"


def _can_compile() -> str | None:
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc is not installed"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    return None


@pytest.mark.skipif(_can_compile() is not None, reason=str(_can_compile()))
def test_compiled_build_gives_identical_results(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"FLEETSIM_NATIVE_CACHE": str(cache), "FLEETSIM_PURE_PYTHON": ""}
    # Built on first use (the opt-in), then loaded by that very process; a later one finds it built.
    first = _run_python("import simulator.native as n; print(n.active())", FLEETSIM_BUILD_NATIVE="1", **env)
    assert first.stdout.strip() == "True"
    assert "building it now" in first.stderr
    compiler = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0])
    assert compiler is not None
    # With GCC the build is profile-guided: its training ran on the instrumented modules (a failed one
    # would say so and fall back to a plain build, which this catches).
    guided = native._compiler_family(compiler) == "gcc"
    assert ("built (profile-guided): " if guided else "built: ") in first.stderr, first.stderr
    assert "training failed" not in first.stderr
    again = _run_python("import simulator.native as n; print(n.active())", FLEETSIM_BUILD_NATIVE="1", **env)
    assert again.stdout.strip() == "True" and again.stderr == ""
    tests = str(Path(__file__).resolve().parent)
    pure, compiled = tmp_path / "pure.npz", tmp_path / "compiled.npz"
    assert _python(RUN.format(tests=tests, out=str(pure)), **{**env, "FLEETSIM_PURE_PYTHON": "1"}) == "pure"
    assert _python(RUN.format(tests=tests, out=str(compiled)), **env) == "active"
    with np.load(pure) as a, np.load(compiled) as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            np.testing.assert_array_equal(b[name], a[name], err_msg=name)


def test_a_failed_build_on_first_use_says_why_once_and_runs_pure_python(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code = ("import simulator.native as n, simulator.core.scheduler as s; "
            "print(n.active(), n.pure_python_notice(), s.__file__)")
    done = _run_python(code, FLEETSIM_BUILD_NATIVE="1", FLEETSIM_NATIVE_CACHE=str(blocker / "cache"),
                       FLEETSIM_PURE_PYTHON="")
    active, notice, path = done.stdout.split()
    assert (active, notice) == ("False", "None") and path.endswith("scheduler.py")
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and "building it now" in lines[0]
    assert lines[1].startswith("fleetsim: native build failed (cannot create the build cache")
    assert lines[1].endswith("simulating in pure Python")
    # Not asked for: nothing is built and nothing said at import (the run's notice says it later).
    quiet = _run_python(code, FLEETSIM_NATIVE_CACHE=str(blocker / "cache"), FLEETSIM_PURE_PYTHON="")
    assert quiet.stderr == "" and quiet.stdout.split()[0] == "False" and "build-native" in quiet.stdout


def test_build_native_without_mypyc_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.cli.main import main

    monkeypatch.setenv("FLEETSIM_NATIVE_CACHE", str(tmp_path))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mypyc" else find_spec(name, *a))
    assert main(["build-native"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("fleetsim: error: mypyc is not installed") and "\n" not in err
    # mypyc without its runtime library (a mypy older than 2.4): said in one line too, before any compiling.
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(native, "runtime_version", lambda: "")
    assert main(["build-native"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("fleetsim: error: mypyc's runtime library (librt) is not installed") and "\n" not in err
    # A fresh process with an empty cache: nothing built for these sources, pure Python in use.
    status = _python("from simulator.cli.main import main; main(['build-native', '--status'])",
                     FLEETSIM_NATIVE_CACHE=str(tmp_path), FLEETSIM_PURE_PYTHON="")
    assert status.startswith("compiled hot path: not built for these sources")


def test_build_native_into_an_unwritable_cache_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.cli.main import main

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FLEETSIM_NATIVE_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # as if mypyc were installed
    monkeypatch.setattr(native, "runtime_version", lambda: "0.17.0")  # and its runtime library
    assert main(["build-native"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("fleetsim: error: cannot create the build cache") and "\n" not in err


class _FakeBuild:
    """``native._mypyc`` and the training's and compiler's processes, faked: each compile records its extra
    flags and leaves an (empty) extension file per module; the training writes a profile or fails."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cache: Path, *, compiler: str, training_ok: bool,
                 refused: str = "", pgo_env: str | None = None) -> None:
        monkeypatch.setenv("FLEETSIM_NATIVE_CACHE", str(cache))
        if pgo_env is None:
            monkeypatch.delenv(native.PGO_ENV, raising=False)
        else:
            monkeypatch.setenv(native.PGO_ENV, pgo_env)
        self.compiles: list[list[str]] = []
        self.trainings = 0
        self.training_ok = training_ok
        self.refused = refused
        """A flag the fake compiler refuses (the compile fails), if any."""
        self.compiler = compiler
        monkeypatch.setattr(native, "_mypyc", self._mypyc)
        monkeypatch.setattr(subprocess, "run", self._run)
        monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)

    def _mypyc(self, work: Path, sources: list[str], cflags: list[str]) -> None:
        self.compiles.append(list(cflags))
        if self.refused and self.refused in cflags:
            raise native.NativeBuildError(f"mypyc failed: error: unknown argument: '{self.refused}'")
        for module in native.MODULES:
            so = work.joinpath(*module.split(".")).with_name(module.split(".")[-1] + native.extension_suffix())
            so.write_bytes(b"")

    def _run(self, command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if command[1:] == ["--version"]:
            return subprocess.CompletedProcess(command, 0, self.compiler, "")
        assert command[1:] == ["-m", "simulator.native_training"]
        self.trainings += 1
        env = kwargs["env"]
        assert isinstance(env, dict) and native.PURE_ENV not in env and native.AUTO_ENV not in env
        profile = next(flag for flag in self.compiles[-1] if flag.startswith("-fprofile-generate="))
        if not self.training_ok:
            return subprocess.CompletedProcess(command, 1, "", "native training: boom")
        folder = Path(profile.split("=", 1)[1])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "x.gcda").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")


def _manifest(folder: Path) -> dict[str, object]:
    loaded = json.loads((folder / "manifest.json").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_a_gcc_build_is_instrumented_trained_and_compiled_again_with_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeBuild(monkeypatch, tmp_path, compiler="gcc (Debian 12.2.0-14) 12.2.0\nFree Software Foundation",
                      training_ok=True)
    said: list[str] = []
    folder = native.build(progress=said.append)
    assert fake.trainings == 1 and len(fake.compiles) == 2
    generate, use = fake.compiles
    profile = next(f for f in generate if f.startswith("-fprofile-generate=")).split("=", 1)[1]
    assert f"-fprofile-use={profile}" in use and "-fprofile-partial-training" in use
    for flags in fake.compiles:
        assert flags[:2] == list(native._LINK_LOCAL_FLAGS)
    assert _manifest(folder)["profile_guided"] is True and native.build_kind(folder) == " (profile-guided)"
    assert said[-1] == f"built (profile-guided): {folder}"


def test_a_failed_training_says_why_and_compiles_once_without_a_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeBuild(monkeypatch, tmp_path, compiler="gcc (GCC) 13.1.0", training_ok=False)
    said: list[str] = []
    folder = native.build(progress=said.append)
    assert fake.trainings == 1 and len(fake.compiles) == 2
    assert fake.compiles[1] == list(native._LINK_LOCAL_FLAGS)  # the plain compile: no profile flag
    assert any(line.startswith("training failed (native training: boom)") for line in said)
    assert _manifest(folder)["profile_guided"] is False and native.build_kind(folder) == ""
    assert said[-1] == f"built: {folder}"


@pytest.mark.parametrize(("compiler", "pgo_env", "asked", "flags"), [
    ("Apple clang version 15.0.0", "", None, list(native._LINK_LOCAL_FLAGS)),  # PGO is GCC's here
    ("gcc (GCC) 13.1.0", "0", None, list(native._LINK_LOCAL_FLAGS)),  # FLEETSIM_NATIVE_PGO=0
    ("gcc (GCC) 13.1.0", "", False, list(native._LINK_LOCAL_FLAGS)),  # build-native --no-pgo
    ("icx (Intel oneAPI)", "", None, []),  # an unknown compiler: none of the flags
])
def test_a_plain_build_is_one_compile_without_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiler: str, pgo_env: str, asked: bool | None,
    flags: list[str]
) -> None:
    fake = _FakeBuild(monkeypatch, tmp_path, compiler=compiler, training_ok=True, pgo_env=pgo_env)
    folder = native.build(progress=lambda line: None, profile_guided=asked)
    assert fake.trainings == 0 and fake.compiles == [flags]
    assert _manifest(folder)["profile_guided"] is False


def test_every_training_scenario_loads_and_the_mix_spans_the_shapes_people_simulate() -> None:
    """The training (run for real by the compiled-build test above) is a valid scenario each, one of each
    shape: chat, sessions routed both ways, preemptions, the step-by-step path, speculation, pools, tiers."""
    from simulator import native_training
    from simulator.scenario import load_mapping

    labels = []
    for label, raw, overrides in native_training.scenarios():
        load_mapping(raw, overrides)
        labels.append(label)
    assert len(set(labels)) == len(labels)
    text = " ".join(labels)
    for shape in ("chat", "session affinity", "prefix-aware", "overloaded", "step by step", "speculative",
                  "pools", "tiers"):
        assert shape in text


@pytest.mark.parametrize("refused", ["-fprofile-update=single", "-fno-semantic-interposition"])
def test_a_compiler_refusing_a_flag_gets_a_build_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: str
) -> None:
    """An older compiler refusing the instrumentation drops the profile; one refusing the link-local flags
    gets none of them: either way a working build, and the reason said."""
    fake = _FakeBuild(monkeypatch, tmp_path, compiler="gcc (GCC) 7.5.0", training_ok=True, refused=refused)
    said: list[str] = []
    folder = native.build(progress=said.append)
    assert fake.trainings == 0
    assert refused not in fake.compiles[-1] and _manifest(folder)["cflags"] == fake.compiles[-1]
    assert any(f"unknown argument: '{refused}'" in line for line in said)
    assert said[-1] == f"built: {folder}"
