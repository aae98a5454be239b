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
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from simulator.errors import ConfigError
from simulator.worker_pool import WorkerDied

EXIT_USAGE = 2

BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"
"""numpy's OpenBLAS starts a thread per core when numpy is imported, and they spin for a while: ~60-110 ms of
CPU per start on two cores (``benchmarks/startup.py``), for nothing, since a simulation's numpy work is
element-wise (no matrix products). ``SIMULATING`` commands run as their own process set this to 1 unless the
user did (their ``--jobs`` workers inherit it); the real engine's (``calibrate``, ``validate``) do not: where
torch's matrix products go through OpenBLAS (ARM wheels), one thread would change what they measure."""

SIMULATING = frozenset({"run", "plan", "sweep"})
"""The commands whose work is simulation: numpy element-wise, no BLAS."""

PLUGINS: dict[str, str] = {
    "run": "simulator.cli.run",
    "info": "simulator.cli.info",
    "dashboard": "simulator.cli.dashboard",
    "plan": "simulator.cli.plan",
    "traces": "simulator.cli.traces",
}
"""The simulator's command families (module path -> it defines ``register(subparsers)``), in help order."""

COMMANDS: dict[str, str] = {
    "run": "simulator.cli.run",
    "profiles": "simulator.cli.info",
    "policies": "simulator.cli.info",
    "build-native": "simulator.cli.info",
    "dashboard": "simulator.cli.dashboard",
    "plan": "simulator.cli.plan",
    "sweep": "simulator.cli.plan",
    "traces": "simulator.cli.traces",
}
"""Each of the simulator's commands and the module of ``PLUGINS`` that registers it: a command line naming
one builds only that module's parser, without reading the installed packages' metadata (version, entry
points), which is most of the command line's own start-up."""

ENTRY_POINT_GROUP = "fleetsim.commands"
"""Entry points of installed packages adding commands: each names a ``register(subparsers)`` function."""


def installed_version() -> str:
    """The installed distribution's version ("unknown" when run from a checkout that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version  # not at import: ~50 ms, rarely needed

    try:
        return version("fleetsim")
    except PackageNotFoundError:
        return "unknown"


class _VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str = "show the version and exit") -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"fleetsim {installed_version()}")  # on stdout, as argparse's own version action
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse's parser with a usage error in one line, as every other error: the message and where the
    usage is (argparse printed the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def build_parser(argv: Sequence[str] | None = None,
                 plugins: Sequence[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    """The parser for ``argv`` (None: the process's arguments): when it names one of the simulator's own
    commands, only that command family's; otherwise every command, the installed plugins' too, and
    ``plugins``' (``register`` functions of command families a checkout that was never installed has no
    entry point for: ``python -m calibration``)."""
    parser = _Parser(prog="fleetsim", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    args = list(sys.argv[1:] if argv is None else argv)
    module = COMMANDS.get(args[0]) if args else None
    if module is not None and module in PLUGINS.values():
        importlib.import_module(module).register(sub)
        return parser
    from importlib.metadata import entry_points  # not at import: ~50 ms, only the whole command list reads it

    for module in PLUGINS.values():
        importlib.import_module(module).register(sub)
    for register in plugins:
        register(sub)
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        register = entry.load()
        if register not in plugins:  # installed too: registered once
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None, plugins: Sequence[Callable[[Any], None]] = ()) -> int:
    """``fleetsim``; ``plugins``: further command families' ``register`` functions (``build_parser``)."""
    parser = build_parser(argv, plugins)  # imports the command's module only: not numpy yet (test_startup checks)
    args = parser.parse_args(argv)
    if argv is None and args.command in SIMULATING:
        os.environ.setdefault(BLAS_THREADS_ENV, "1")
    args.own_process = argv is None  # the process's own command line: one command, then exit (collector.start_up)
    try:
        code: int = args.func(args)
        return code
    except ConfigError as err:
        print(f"fleetsim: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except FileExistsError as err:
        print(f"fleetsim: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except WorkerDied as err:  # a plan's or a sweep's worker process (``run`` says what it saved itself)
        print(f"fleetsim: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into head: not an error
        return 0
    except KeyboardInterrupt:
        print("fleetsim: interrupted", file=sys.stderr)
        return 130
    finally:
        if args.own_process:  # the process exits next: its shutdown need not walk what the command left
            from simulator.collector import before_exit

            before_exit()


if __name__ == "__main__":
    sys.exit(main())
