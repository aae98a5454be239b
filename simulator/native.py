"""An optional compiled build of the simulator's hot path: the same source files, compiled with mypyc.

``fleetsim build-native`` compiles the serving core (``simulator.core``), the cost model, the run recorders,
the arrival feed, the load list and the replica loop to C extensions with mypyc — the very files the
pure-Python package runs, unchanged, so the policy code still exists once. A simulated request then costs
about a ninth of the instructions (see ``benchmarks/sim_speed.py``); its hottest integers are annotated
``i64`` (mypyc's machine integers, imported for type checking only: plain ints in Python). Nothing else
changes: results are identical (a test builds it and compares).

With GCC the build is profile-guided, as CPython's own release builds are: compiled instrumented, run on a
mix of small simulations (``simulator.native_training``), compiled again laid out for the branches that run
took; the modules' functions call each other directly rather than through the dynamic linker
(``_LINK_LOCAL_FLAGS``). Together about 1.2x faster than the plain build before them; without the profile
(``FLEETSIM_NATIVE_PGO=0``: one compile, a third of the time) the direct calls keep about a third of that.

The build lands in a cache folder named by a digest of those sources and of the interpreter. At import,
``simulator`` loads the compiled modules only if a build of exactly the files on disk exists; after any
edit it runs pure Python until rebuilt, so a stale binary can never run. ``FLEETSIM_PURE_PYTHON=1``
forces pure Python; ``FLEETSIM_NATIVE_CACHE`` moves the cache (default ``~/.cache/fleetsim/native``);
``FLEETSIM_BUILD_NATIVE=1`` (an opt-in, asked once in the environment, never a prompt) builds it at that
import when it is missing or stale, saying so on stderr, so that edited sources never run slow unnoticed;
a build that fails says why in one line and the process goes on in pure Python.

Standard library only (``simulator/__init__`` installs the loader before ``simulator.core`` is imported).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

MODULES = (
    "simulator.core.config",
    "simulator.core.mix",
    "simulator.core.request",
    "simulator.core.step",
    "simulator.core.block_pool",
    "simulator.core.kv_manager",
    "simulator.core.kv_transfer",
    "simulator.core.kv_tiers",
    "simulator.core.scheduler",
    "simulator.core.decode_run",
    "simulator.core.speculation",
    "simulator.cost.interpolation",
    "simulator.cost.cost_model",
    "simulator.cost.speculative_step",
    "simulator.results.request_log",
    "simulator.results.series",
    "simulator.fleet.clock",
    "simulator.fleet.replica",
    "simulator.fleet.arrival_feed",
    "simulator.fleet.loads",
    "simulator.fleet.hash_ring",
    "simulator.fleet.prefix_index",
    "simulator.fleet.prefix_route",
    "simulator.workload.shared_hashes",
)
"""The modules compiled, all of them on the per-step path."""

PURE_ENV = "FLEETSIM_PURE_PYTHON"
CACHE_ENV = "FLEETSIM_NATIVE_CACHE"
PGO_ENV = "FLEETSIM_NATIVE_PGO"
"""Set to 0 to build without the profile-guided pass (one compile, about a minute, slower code)."""
BUILD_RECIPE = "flags-1"
"""How a build is made (compiler flags, the profile-guided pass), part of a build's digest: a change to it
leaves earlier builds unused rather than running code made the old way."""
_LINK_LOCAL_FLAGS = ("-fno-semantic-interposition", "-fvisibility=hidden")
"""GCC and clang flags for the compiled modules: their functions call each other directly (and may be
inlined) rather than through the dynamic linker's tables, which a shared library's exported functions
otherwise need; only the modules' init functions, which CPython marks exported, stay visible. The
simulated results are the same (no floating-point option changes)."""
_MANIFEST = "manifest.json"
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""The folder holding the ``simulator`` package."""


class NativeBuildError(Exception):
    """The compiled build could not be made (no mypyc, no C compiler, a compile error)."""


def _source(module: str) -> Path:
    return _PACKAGE_ROOT.joinpath(*module.split(".")).with_suffix(".py")


def source_digest() -> str:
    """Digest of the compiled modules' sources, the interpreter and mypyc's runtime library: names the build
    that matches them."""
    h = hashlib.sha256()
    h.update(sys.implementation.cache_tag.encode())
    h.update(extension_suffix().encode())
    h.update(f"librt {runtime_version()}".encode())
    h.update(BUILD_RECIPE.encode())
    for module in MODULES:
        h.update(module.encode())
        h.update(_source(module).read_bytes())
    return h.hexdigest()[:20]


def runtime_version() -> str:
    """The version of mypyc's runtime library (``librt``, installed with mypy) in this environment, empty
    when it has none. Compiled modules import it (``block_pool``'s per-block counts are its ``vec`` arrays),
    so a build serves only environments with the version it was compiled against: part of its digest (an
    environment without it, or with another version, finds no build and runs pure Python, saying so).
    Read off its ``.dist-info`` folder's name, without importing it or ``importlib.metadata``."""
    spec = importlib.util.find_spec("librt")
    if spec is None or not spec.submodule_search_locations:
        return ""
    for location in spec.submodule_search_locations:
        try:
            with os.scandir(Path(location).parent) as entries:
                for entry in entries:
                    if entry.name.startswith("librt-") and entry.name.endswith(".dist-info"):
                        return entry.name[len("librt-"):-len(".dist-info")]
        except OSError:
            continue
    return "unknown"


def extension_suffix() -> str:
    """The interpreter's extension-module suffix (sysconfig's EXT_SUFFIX; the import system lists it first,
    without importing sysconfig at every start)."""
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetsim" / "native"


def build_dir(digest: str | None = None) -> Path:
    return cache_root() / (digest or source_digest())


class _NativeFinder:
    """Serves the compiled modules (and mypyc's shared library) from one build folder: a meta path finder
    (``find_spec`` is all the import system asks of one; importlib.abc is not imported at every start)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        location = self.files.get(fullname)
        if location is None:
            return None
        return importlib.util.spec_from_file_location(fullname, location)


_finder: _NativeFinder | None = None
_loaded_from: Path | None = None


NOTICE_ENV = "FLEETSIM_NO_NATIVE_NOTICE"
"""Set to 1 to silence the pure-Python notice of ``pure_python_notice``."""

AUTO_ENV = "FLEETSIM_BUILD_NATIVE"
"""Set to 1 to build the compiled modules at import when no build of the current sources exists."""

_build_failed: str | None = None
"""Why the build ``AUTO_ENV`` asked for failed in this process (already said on stderr), if it did."""


def pure_python_notice() -> str | None:
    """The one line a run prints on stderr when it simulates in pure Python although it was not asked to
    (``FLEETSIM_PURE_PYTHON`` unset): no build of the current sources exists, or it is stale. None when
    the compiled modules are in use, pure Python was asked for, or the notice is silenced."""
    if active() or _build_failed is not None or _set(PURE_ENV) or _set(NOTICE_ENV):
        return None
    return ("note: simulating in pure Python (no native build of these sources for this environment): "
            "pip install -e '.[native]' && fleetsim build-native runs the hot path compiled, several times "
            f"faster, with the same results ({AUTO_ENV}=1 builds it whenever the sources change); "
            f"{NOTICE_ENV}=1 silences this")


def _set(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def active() -> bool:
    """Whether this process loads the compiled modules (installed at ``simulator`` import)."""
    return _finder is not None


def loaded_from() -> Path | None:
    """The build folder this process loads the compiled modules from, if it does."""
    return _loaded_from


def install() -> bool:
    """Load the compiled modules from here on if a build of exactly the current sources exists (with
    ``AUTO_ENV`` set, after building it if none does)."""
    if _finder is not None:
        return True
    if _set(PURE_ENV):
        return False
    if any(module in sys.modules for module in MODULES):
        return False  # already imported as Python: never mix the two builds in one process
    if _load():
        return True
    if not _set(AUTO_ENV):
        return False
    try:
        if (build_dir() / _MANIFEST).is_file():
            return False  # a build exists but is incomplete (``fleetsim build-native --status`` says)
    except OSError:
        return False  # the sources cannot be read to name the build: nothing to build from either
    return _build_on_first_use() and _load()


def _build_on_first_use() -> bool:
    """``build`` for ``AUTO_ENV``, its progress and any failure on stderr (one line: the process goes on in
    pure Python, and its pure-Python notice stays silent)."""
    global _build_failed

    def progress(line: str) -> None:
        print(f"fleetsim: {line}", file=sys.stderr, flush=True)

    progress(f"{AUTO_ENV}=1 and no native build of these sources: building it now")
    try:
        build(progress=progress)
    except (NativeBuildError, OSError) as err:  # OSError: copying or staging the build (a full disk)
        _build_failed = str(err)
        progress(f"native build failed ({err}): simulating in pure Python")
        return False
    return True


def _load() -> bool:
    """Install the finder for the build of the current sources, if it is there and whole."""
    global _finder, _loaded_from
    try:
        folder = build_dir()
        manifest = json.loads((folder / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    files = {name: folder / rel for name, rel in manifest.get("files", {}).items()}
    if set(MODULES) - set(files) or not all(p.is_file() for p in files.values()):
        return False
    _finder = _NativeFinder(files)
    _loaded_from = folder
    sys.meta_path.insert(0, _finder)
    return True


def build(progress: Callable[[str], None] = print, *, profile_guided: bool | None = None) -> Path:
    """Compile ``MODULES`` with mypyc into the cache folder for the current sources; returns it.

    The whole ``simulator`` package is copied to a scratch folder (mypyc type-checks the compiled modules
    against their imports), compiled there, and only the extension files are kept. With GCC (the compiler
    CPython names) the build is profile-guided unless ``profile_guided`` is False or ``PGO_ENV`` is 0:
    compiled once instrumented, run on ``simulator.native_training``, compiled again with what that run
    measured; if any of that fails it says why and compiles once without it. A profile changes only how the
    C is laid out and inlined, never what it computes."""
    import shutil  # here, not at import: every run imports this module, few build
    import sysconfig
    import tempfile

    digest = source_digest()
    target = build_dir(digest)
    if (target / _MANIFEST).is_file():
        progress(f"already built for these sources: {target}")
        return target
    if importlib.util.find_spec("mypyc") is None:
        raise NativeBuildError("mypyc is not installed (pip install 'fleetsim[native]')")
    if not runtime_version():
        raise NativeBuildError("mypyc's runtime library (librt) is not installed: pip install 'fleetsim[native]' "
                               "(mypy >= 2.4 brings it)")
    try:
        _ensure(cache_root())  # before minutes of compiling: the cache must be writable
    except OSError as err:
        raise NativeBuildError(f"cannot create the build cache {cache_root()}: {err.strerror or err}") from None
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    compiler_path = shutil.which(compiler)
    if compiler_path is None:
        raise NativeBuildError(f"no C compiler ({compiler}) found: mypyc needs the one Python was built with")
    family = _compiler_family(compiler_path)
    flags = list(_LINK_LOCAL_FLAGS) if family in ("gcc", "clang") else []
    if profile_guided is None:
        profile_guided = os.environ.get(PGO_ENV, "") != "0"
    guided = profile_guided and family == "gcc"
    if profile_guided and not guided:
        progress(f"not profile-guided: that needs GCC, and the C compiler is {family} ({compiler})")
    with tempfile.TemporaryDirectory(prefix="fleetsim-native-") as scratch:
        work = Path(scratch) / "src"
        shutil.copytree(_PACKAGE_ROOT / "simulator", work / "simulator",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        sources = [str(Path(*m.split(".")).with_suffix(".py")) for m in MODULES]
        if guided:
            try:
                guided = _profile(work, sources, flags, Path(scratch), progress)
            except NativeBuildError as err:
                progress(f"profile-guided build failed ({err}): compiling without a profile")
                guided = False
        if not guided:
            progress(f"compiling {len(sources)} modules with mypyc (about a minute)...")
            try:
                _mypyc(work, sources, flags)
            except NativeBuildError as err:
                if not flags:
                    raise
                # An older compiler that refuses one of them: the flags only make the code faster.
                progress(f"compiling with {' '.join(flags)} failed ({err}): compiling without them")
                flags = []
                _mypyc(work, sources, flags)
        staging = Path(tempfile.mkdtemp(prefix=f"{digest}-", dir=_ensure(cache_root())))
        files: dict[str, str] = {}
        suffix = extension_suffix()
        for so in work.rglob(f"*{suffix}"):
            rel = so.relative_to(work)
            if rel.parts[0] == "build":
                continue  # intermediate copies; mypyc also places every extension beside its source
            name = ".".join(rel.parts)[: -len(suffix)]
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, staging / rel)
            files[name] = str(rel)
        missing = set(MODULES) - set(files)
        if missing:
            shutil.rmtree(staging, ignore_errors=True)
            raise NativeBuildError(f"mypyc produced no extension for {', '.join(sorted(missing))}")
        manifest = {"digest": digest, "files": files, "profile_guided": guided, "cflags": flags}
        (staging / _MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            staging.rename(target)  # atomic: a concurrent build of the same sources may have won
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    progress(f"built{' (profile-guided)' if guided else ''}: {target}")
    return target


def _compiler_family(path: str) -> str:
    """``gcc``, ``clang`` or ``unknown``: what ``path --version`` says it is."""
    import subprocess

    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    text = done.stdout.lower()
    if "clang" in text:
        return "clang"  # (Apple's ``gcc`` is clang: it says so)
    if "free software foundation" in text or "gcc" in text:
        return "gcc"
    return "unknown"


def _mypyc(work: Path, sources: list[str], cflags: list[str]) -> None:
    """Run mypyc on ``sources`` in ``work``, its C compiled with ``cflags`` added (setuptools appends
    ``CFLAGS`` to the compile and the link); every earlier output there is removed first."""
    import shutil
    import subprocess

    shutil.rmtree(work / "build", ignore_errors=True)
    for so in work.rglob(f"*{extension_suffix()}"):
        so.unlink()
    env = {**os.environ, "CFLAGS": " ".join([os.environ.get("CFLAGS", ""), *cflags]).strip()}
    # The scratch copy has no pyproject.toml: a third-party package without type information is compiled as
    # an untyped object rather than failing the build.
    done = subprocess.run([sys.executable, "-m", "mypyc", "--ignore-missing-imports", *sources], cwd=work,
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise NativeBuildError("mypyc failed: " + " | ".join(tail))


def _profile(work: Path, sources: list[str], flags: list[str], scratch: Path,
             progress: Callable[[str], None]) -> bool:
    """The profile-guided build in ``work``: instrumented, trained, compiled again with the profile.
    False (having said why) when the training fails; a failed compile raises ``NativeBuildError``. Either
    way the caller then compiles plainly. The second compile reads the profile by object file path, so both
    run in the same folder."""
    import shutil
    import subprocess

    profile = scratch / "profile"
    progress(f"compiling {len(sources)} modules with mypyc, instrumented (1 of 2; about three minutes in all)...")
    _mypyc(work, sources, [*flags, f"-fprofile-generate={profile}", "-fprofile-update=single"])
    data = _PACKAGE_ROOT / "calibration"
    if data.is_dir():  # the shipped profiles and engine, GPU and link tables, found beside the package
        try:
            (work / "calibration").symlink_to(data, target_is_directory=True)
        except OSError:
            shutil.copytree(data, work / "calibration", ignore=shutil.ignore_patterns("__pycache__"))
    progress("training it on a mix of small simulations (simulator.native_training)...")
    # (``-m`` puts the scratch folder first on the path: its package is the one imported.)
    env = {k: v for k, v in os.environ.items() if k not in (PURE_ENV, AUTO_ENV)}
    env[CACHE_ENV] = str(scratch / "no-build")  # so the instrumented modules beside the sources load
    env[NOTICE_ENV] = "1"
    try:
        done = subprocess.run([sys.executable, "-m", "simulator.native_training"], cwd=work, env=env,
                              capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        progress(f"training failed ({err}): compiling without a profile")
        return False
    if done.returncode != 0 or not any(profile.rglob("*.gcda")):
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no profile written"]
        progress(f"training failed ({tail[0]}): compiling without a profile")
        return False
    progress(f"compiling {len(sources)} modules with mypyc, with the profile (2 of 2)...")
    _mypyc(work, sources, [*flags, f"-fprofile-use={profile}", "-fprofile-partial-training",
                           "-Wno-missing-profile", "-Wno-coverage-mismatch"])
    return True


def build_kind(folder: Path) -> str:
    """`` (profile-guided)`` for a build folder whose manifest says so, else empty (for status lines)."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
    except (OSError, ValueError):
        return ""
    return " (profile-guided)" if isinstance(manifest, dict) and manifest.get("profile_guided") else ""


def _ensure(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder
