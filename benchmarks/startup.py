"""Start-up: what a short ``fleetsim run`` costs before and after its few simulated requests.

    python benchmarks/startup.py                      # 20 runs of a 10-request quickstart
    python benchmarks/startup.py --runs 40 --imports  # and the slowest imports of one run
    python benchmarks/paired.py HEAD~1 -- benchmarks/startup.py --runs 10   # against a revision

Each run is a fresh process, as a user's (or a sweep worker's) is: ``fleetsim run SCENARIO`` on
``--requests`` requests into a new folder, for each save ``--saves`` names: ``summary`` (``--summary-only``,
a sweep worker's), ``tables`` (``--no-report``) and ``report`` (the default: tables, summary and report.html).
Prints the minimum and the median wall time and CPU time per run, beside the bare interpreter's
(``python -c pass``), so the part that is fleetsim's shows. The first run of each is left out (it writes
bytecode caches, even under ``PYTHONDONTWRITEBYTECODE``). On a shared machine the median moves by 20 % from
one minute to the next: compare revisions with ``paired.py``, or count instructions under callgrind
(``valgrind --tool=callgrind python -m ...``), which repeat to within 0.01 %.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path.cwd() if (Path.cwd() / "simulator").is_dir() else Path(__file__).resolve().parents[1]
"""The checkout whose fleetsim runs: the current folder when it is one (``paired.py`` runs this file from this
checkout in a revision's worktree), else this file's."""
CLI = "import sys; from simulator.cli.main import main; sys.exit(main())"
SAVES: dict[str, tuple[str, ...]] = {"summary": ("--summary-only",), "tables": ("--no-report",), "report": ()}
"""What a run writes -> its flags: summary.json alone; the tables too; and the report (the default)."""


def _timed(command: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one run of ``command`` (in ``env``, else this process's
    environment), which must succeed."""
    # Error output to a file, not a pipe: a child writing more than a pipe holds would block until read.
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            log.seek(0)
            raise SystemExit(f"startup.py: the run failed: {log.read().decode(errors='replace').strip()[-300:]}")
    return wall, usage.ru_utime + usage.ru_stime


def _series(make_command: Callable[[int], list[str]], runs: int) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    # The first run is left out: it compiles and caches the bytecode of every module it imports. It may,
    # whatever the caller's PYTHONDONTWRITEBYTECODE says (set in some CI and container images): without
    # fresh caches each timed run would compile every source edited since they were written, which no
    # installed fleetsim does.
    caching = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    for number in range(runs + 1):
        wall, cpu = _timed(make_command(number), None if number else caching)
        if number:
            walls.append(wall)
            cpus.append(cpu)
    return walls, cpus


def _slowest_imports(command: Sequence[str], top: int) -> list[tuple[float, str]]:
    """The ``top`` imports of one run by cumulative time (``-X importtime``), in milliseconds."""
    done = subprocess.run([command[0], "-X", "importtime", *command[1:]], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    found = []
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if match and len(match.group(2)) <= 2:  # top-level imports and their direct children
            found.append((int(match.group(1)) / 1e3, match.group(2) + match.group(3)))
    return sorted(found, reverse=True)[:top]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="scenarios/quickstart.yaml", help="scenario to run (quickstart)")
    parser.add_argument("--requests", type=int, default=10, help="requests simulated (10)")
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each (20)")
    parser.add_argument("--saves", nargs="+", choices=sorted(SAVES), default=list(SAVES),
                        help="what each run writes: summary (--summary-only), tables (--no-report), report "
                             "(the default run); all three unless told")
    parser.add_argument("--imports", action="store_true", help="also list the slowest imports of one run")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.requests < 1:
        raise SystemExit("startup.py: --runs and --requests must be >= 1")
    with tempfile.TemporaryDirectory(prefix="fleetsim-startup-") as scratch:
        def fleetsim(save: str) -> Callable[[int], list[str]]:
            def command(number: int) -> list[str]:
                return [sys.executable, "-c", CLI, "run", args.scenario, *SAVES[save], "--quiet",
                        "--set", f"workload.num_requests={args.requests}", "--out", f"{scratch}/{save}-{number}"]
            return command

        bare_walls, bare_cpus = _series(lambda _: [sys.executable, "-c", "pass"], args.runs)
        print(f"{args.scenario}, {args.requests} requests, {args.runs} runs (fresh processes):")
        rows = [(f"fleetsim run, {save}", *_series(fleetsim(save), args.runs)) for save in args.saves]
        for label, w, c in (*rows, ("python alone", bare_walls, bare_cpus)):
            print(f"  {label:22s} wall min {min(w) * 1e3:6.0f} ms  median {statistics.median(w) * 1e3:6.0f} ms"
                  f"   CPU median {statistics.median(c) * 1e3:6.0f} ms")
        if args.imports:
            print(f"slowest imports of one run, {args.saves[-1]} (cumulative ms, -X importtime):")
            for ms, name in _slowest_imports(fleetsim(args.saves[-1])(args.runs + 1), 15):
                print(f"  {ms:7.1f}  {name}")

if __name__ == "__main__":
    main()
