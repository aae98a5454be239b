"""Where a scenario's trace file is looked for: the folders ``${traces}/FILE`` resolves in.

``$FLEETSIM_TRACES`` when set, and only there. Otherwise the project's shared data next to the checkout
(``<repo>/../shared/data/traces``, which the tests read), then the user's cache folder
(``$FLEETSIM_TRACE_CACHE``, default ``~/.cache/fleetsim/traces``), where ``fleetsim traces --download``
puts the public traces (``trace_catalogue``). A file missing from all of them is an error that says how
to get it. This module only computes paths; it reads and writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

TRACES_TOKEN = "${traces}"
"""A trace path starting with this token resolves in ``trace_folders()``, so scenarios stay portable."""

TRACES_ENV = "FLEETSIM_TRACES"
"""Environment variable naming the one folder ``${traces}`` means (the others are then not searched)."""
CACHE_ENV = "FLEETSIM_TRACE_CACHE"
"""Environment variable naming the cache folder downloaded traces go to."""


def traces_dir() -> Path:
    """The first folder ``${traces}`` looks in: $FLEETSIM_TRACES, else ``<repo root>/../shared/data/traces``."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"


def trace_cache_dir() -> Path:
    """Where ``fleetsim traces --download`` puts traces: $FLEETSIM_TRACE_CACHE, else
    ``$XDG_CACHE_HOME/fleetsim/traces`` (``~/.cache/fleetsim/traces``)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetsim" / "traces"


def trace_folders() -> tuple[Path, ...]:
    """The folders ``${traces}/FILE`` is looked for in, in order."""
    if os.environ.get(TRACES_ENV):
        return (traces_dir(),)
    return (traces_dir(), trace_cache_dir())


def resolve_trace_path(path: str | Path, base_dir: Path | None = None) -> Path:
    """Expand ``${traces}`` (the first folder holding the file; the first folder when none does) and make a
    relative path relative to ``base_dir`` (the scenario's folder)."""
    text = str(path)
    if text.startswith(TRACES_TOKEN):
        name = text[len(TRACES_TOKEN) :].lstrip("/\\")
        folders = trace_folders()
        return next((folder / name for folder in folders if (folder / name).is_file()), folders[0] / name)
    resolved = Path(text).expanduser()
    if not resolved.is_absolute() and base_dir is not None:
        resolved = base_dir / resolved
    return resolved


def download_dir() -> Path:
    """Where a downloaded trace goes: the last folder ``${traces}`` looks in (the cache folder, or
    $FLEETSIM_TRACES when that is set), so a scenario finds it there."""
    return trace_folders()[-1]


def missing_hint(file: Path) -> str:
    """How to get a missing trace file that a ``${traces}`` path named; empty for any other path."""
    folders = trace_folders()
    if file.parent not in folders:
        return ""
    looked = " nor ".join(str(folder) for folder in folders)
    return (f" (not in {looked}): `fleetsim traces` lists the public traces with their URL and sha256, and "
            f"`fleetsim traces --download {file.name}` fetches one into {download_dir()}")
