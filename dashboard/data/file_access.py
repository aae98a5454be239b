"""Which files the dashboard reads: the shipped scenarios, profiles and traces, and what the user uploads.

The dashboard is a server: whoever reaches the page chooses the scenario, and a scenario names files by
path (``workload.trace.path``, an empirical length distribution's ``path``, ``fleet.profile``). So every
scenario mapping the dashboard loads, validates or runs passes ``check_paths`` first, before any file it
names is opened: a trace must be one of the public traces (``${traces}/FILE``, resolved in the traces
folders) or, for a shipped scenario, a file inside the allowed folders; a profile must be a shipped one.
Absolute paths, ``..`` and symbolic links out of those folders are refused. The error quotes the path cut
short and never a file's contents; ``fleetsim run`` reads any file its user names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path, PurePath
from typing import Any

from simulator.cost.profile import list_profiles, profiles_dir
from simulator.errors import ConfigError
from simulator.workload.trace_sources import TRACES_TOKEN, resolve_trace_path, trace_folders
from simulator.workload.traces import quoted

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"
"""The shipped scenarios."""

PATH_KEYS = ("path",)
"""Scenario keys holding a trace file (``workload.trace.path``, ``workload.*_tokens.path``)."""
PROFILE_KEYS = ("profile",)
"""Scenario keys holding a profile name or file (``fleet.profile``)."""

TRACE_RULE = (f"the dashboard reads only the public traces as {TRACES_TOKEN}/FILE (`fleetsim traces` lists them) "
              "and files beside the shipped scenarios; run other files with `fleetsim run`")
PROFILE_RULE = "the dashboard runs shipped profiles only (`fleetsim profiles` lists them); run a profile file with " \
               "`fleetsim run`"


def allowed_folders() -> tuple[Path, ...]:
    """Folders the dashboard may read files from (their real paths, symbolic links resolved)."""
    return tuple(folder.resolve() for folder in (SCENARIOS_DIR, profiles_dir(), *trace_folders()))


def check_paths(raw: Mapping[str, Any], source: Path | None) -> None:
    """Refuse a scenario mapping (variants included) that names a file outside the allowed folders.

    ``source`` is the scenario file relative trace paths resolve against: a shipped scenario's; None for
    an upload or a scenario built in the page, whose traces can only be ``${traces}/FILE``."""
    for field, value in _file_fields(raw):
        if field.rsplit(".", 1)[-1] in PROFILE_KEYS:
            if value not in list_profiles():
                raise ConfigError(f"{PROFILE_RULE}; got {quoted(value)}", field=field)
        else:
            _check_trace(field, value, source)


def _check_trace(field: str, text: str, source: Path | None) -> None:
    if text.startswith(TRACES_TOKEN):
        name = text[len(TRACES_TOKEN) :].lstrip("/\\")
        if not name or PurePath(name).name != name or "\\" in name or name in (".", ".."):
            raise ConfigError(f"{TRACE_RULE}; {quoted(text)} is not {TRACES_TOKEN}/FILE", field=field)
        folders: tuple[Path, ...] = tuple(f.resolve() for f in trace_folders())
    else:
        if source is None or PurePath(text).is_absolute() or ".." in PurePath(text).parts or text.startswith("~"):
            raise ConfigError(f"{TRACE_RULE}; got {quoted(text)}", field=field)
        folders = allowed_folders()
    resolved = resolve_trace_path(text, source.parent if source is not None else None).resolve()
    if not any(resolved.is_relative_to(folder) for folder in folders):
        raise ConfigError(f"{TRACE_RULE}; {quoted(text)} leads outside them", field=field)


def _file_fields(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted field, text) of every string under a key naming a file, at any depth (variants' dotted
    overrides such as ``{"workload.trace.path": ...}`` included)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            field = f"{prefix}{key}"
            if isinstance(item, str) and str(key).rsplit(".", 1)[-1] in (*PATH_KEYS, *PROFILE_KEYS):
                yield field, item
            else:
                yield from _file_fields(item, f"{field}.")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _file_fields(item, f"{prefix}{index}.")
