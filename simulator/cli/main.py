"""The ``fleetsim`` command line.

Every failure the user can cause (a bad file, an unknown key, an impossible setting, an existing output
folder) is one line on stderr and exit status 2; never a traceback.

Each command family is a module with ``register(subparsers)``: the simulator's own are listed in
``PLUGINS``; other installed packages add theirs through the ``fleetsim.commands`` entry-point group
(``calibration`` adds ``calibrate`` and ``validate`` so, which keeps the simulator from importing it).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version

from simulator.errors import ConfigError

EXIT_USAGE = 2

PLUGINS: dict[str, str] = {
    "run": "simulator.cli.run",
    "info": "simulator.cli.info",
    "dashboard": "simulator.cli.dashboard",
    "plan": "simulator.cli.plan",
    "traces": "simulator.cli.traces",
}
"""The simulator's command families (module path -> it defines ``register(subparsers)``), in help order."""

ENTRY_POINT_GROUP = "fleetsim.commands"
"""Entry points of installed packages adding commands: each names a ``register(subparsers)`` function."""


def installed_version() -> str:
    """The installed distribution's version ("unknown" when run from a checkout that was never installed)."""
    try:
        return version("fleetsim")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetsim", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"fleetsim {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in PLUGINS.values():
        importlib.import_module(module).register(sub)
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        entry.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except ConfigError as err:
        print(f"fleetsim: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except FileExistsError as err:
        print(f"fleetsim: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into head: not an error
        return 0
    except KeyboardInterrupt:
        print("fleetsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
