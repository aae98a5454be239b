"""``fleetsim traces``: the public traces the shipped scenarios replay, where each comes from, whether this
machine has it, and ``--download`` to fetch one (checked against its sha256) into the cache folder."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import simulator

SCENARIOS_DIR = Path(simulator.__file__).resolve().parent.parent / "scenarios"
"""The shipped scenarios (in a checkout; an installed package without them lists no users)."""

_TRACE_REF = re.compile(r"\$\{traces\}[/\\]([^\s'\"]+)")


def scenarios_using(folder: Path = SCENARIOS_DIR) -> dict[str, list[str]]:
    """Trace file name -> the shipped scenario files (``scenarios/NAME.yaml``) that name it as ``${traces}/``."""
    users: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        for name in sorted(set(_TRACE_REF.findall(path.read_text(encoding="utf-8")))):
            users.setdefault(name, []).append(f"scenarios/{path.name}")
    return users


def cmd_traces(args: argparse.Namespace) -> int:
    from simulator.workload.trace_catalogue import download, download_command, file_sha256, load_catalogue
    from simulator.workload.trace_sources import TRACES_ENV, download_dir, resolve_trace_path, trace_folders

    catalogue = load_catalogue()
    folder = Path(args.dir).expanduser() if args.dir else None
    if args.download:
        names = list(catalogue) if args.download == ["all"] else args.download
        for name in names:
            path = download(name, folder)
            print(f"{name}: {path} (sha256 checked)")
        return 0
    users = scenarios_using()
    where = " then ".join(str(f) for f in trace_folders())
    print(f"Scenarios read ${{traces}}/FILE from {where}"
          f"{f' (${TRACES_ENV})' if len(trace_folders()) == 1 else ''}; downloads go to {download_dir()}.")
    order = sorted(catalogue, key=lambda name: (name not in users, name))
    for name in order:
        source = catalogue[name]
        path = resolve_trace_path(f"${{traces}}/{name}")
        print(f"\n{name}  ({source.format.value}; used by {', '.join(users.get(name, [])) or 'no shipped scenario'})")
        print(f"  what     {source.title}")
        print(f"  source   {source.url}")
        print(f"  licence  {source.licence}")
        print(f"  sha256   {source.sha256}  ({source.size_bytes:,} bytes)")
        if path.is_file():
            state = "checksum ok" if file_sha256(path) == source.sha256 else "CHECKSUM DIFFERS from the published file"
            print(f"  here     {path} ({state})")
        else:
            print(f"  missing  get it with: fleetsim traces --download {name}")
            print(f"           or: {download_command(name, folder)}")
    unknown = sorted(set(users) - set(catalogue))
    for name in unknown:
        print(f"\n{name}  (used by {', '.join(users[name])}; not a public trace of the catalogue)")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fleetsim traces``."""
    p = subparsers.add_parser("traces", help="list the public traces the scenarios replay and where to get each")
    p.add_argument("--download", nargs="+", metavar="NAME",
                   help="fetch these traces (file names, or 'all') and check each one's sha256")
    p.add_argument("--dir", metavar="DIR",
                   help="download into DIR instead of the cache folder (scenarios then need FLEETSIM_TRACES=DIR)")
    p.set_defaults(func=cmd_traces)
