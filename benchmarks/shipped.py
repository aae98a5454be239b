"""Every shipped scenario at its shipped size, checked: the nightly job beside CI (which runs each one cut
to a few hundred requests, ``tests/simulator/test_shipped_scenarios.py``, or to 40 from the README's commands).

    python benchmarks/shipped.py                       # every scenario in scenarios/, one after another
    python benchmarks/shipped.py kv_tiers routing      # some of them
    python benchmarks/shipped.py --set engine.kv.num_blocks=3000   # an override applied to every one

Each run verifies its invariants (``check=True``: every request finished once or counted, tokens add up, KV
blocks conserved, latencies in order); some bugs show only at full size (a KV pool that fills, a cache that
compacts, a queue head that stays blocked for thousands of steps). Prints per scenario its variants,
simulated requests, wall seconds, simulated requests per second and peak RSS (each scenario in a forked
process of its own, so the figure is its own); a failure prints its one-line reason and the exit status is
1. A scenario replaying a public trace is skipped, saying so, where the traces folder is absent (as in the
tests).
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from pathlib import Path

from simulator.errors import ConfigError
from simulator.results.invariants import InvariantError
from simulator.scenario import load_scenario
from simulator.simulation import run
from simulator.workload.traces import TRACES_TOKEN, traces_dir

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def check(path: Path, overrides: list[str]) -> tuple[str, bool]:
    """Run one scenario with the run check: its line, and whether it failed."""
    label = f"{path.stem:16s}"
    if path.is_file() and TRACES_TOKEN in path.read_text(encoding="utf-8") and not traces_dir().is_dir():
        return f"{label} skipped: it replays a public trace and {traces_dir()} is absent (set FLEETSIM_TRACES)", False
    start = time.perf_counter()
    try:
        result = run(load_scenario(path, overrides), check=True)
    except (InvariantError, ConfigError) as err:
        return f"{label} FAILED: {err}", True
    wall = time.perf_counter() - start
    requests = sum(v.summary.requests_arrived for v in result.variants.values())
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (f"{label} {len(result.variants):2d} variants {requests:>10,} requests {wall:8.1f} s "
            f"{requests / wall:>9,.0f} req/s  peak RSS {rss_mb:,.0f} MB  check passed"), False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="scenario names (files in scenarios/, without .yaml); default: all")
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="an override applied to every scenario")
    args = parser.parse_args(argv)
    paths = sorted(SCENARIOS.glob("*.yaml")) if not args.names else [SCENARIOS / f"{n}.yaml" for n in args.names]
    failed = 0
    forked = "fork" in multiprocessing.get_all_start_methods()
    for path in paths:
        if forked:  # a child per scenario: its peak RSS is its own, not an earlier, larger scenario's
            with multiprocessing.get_context("fork").Pool(1) as pool:
                line, broke = pool.apply(check, (path, args.set))
        else:
            line, broke = check(path, args.set)
        print(line, flush=True)
        failed += broke
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
