"""The ``fleetsim`` command line.

Every failure the user can cause (a bad file, an unknown key, an impossible setting, an existing output
folder) is one line on stderr and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError

EXIT_USAGE = 2

SUMMARY_COLUMNS = (
    ("requests_completed", "done", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.1f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.1f}"),
    ("tpot_p50_ms", "TPOT p50 ms", "{:.2f}"),
    ("tpot_p99_ms", "TPOT p99 ms", "{:.2f}"),
    ("e2e_p99_ms", "E2E p99 ms", "{:.0f}"),
    ("throughput_tok_s", "tok/s", "{:.0f}"),
    ("slo_attainment", "SLO att.", "{:.3f}"),
    ("kv_util_mean", "KV use", "{:.3f}"),
    ("kv_waste_mean", "KV waste", "{:.3f}"),
    ("running_peak", "peak run", "{:.0f}"),
    ("prefix_hit_rate", "prefix hit", "{:.3f}"),
    ("preemptions", "preempt", "{:.0f}"),
    ("cost_per_mtok_usd", "$/Mtok", "{:.3f}"),
)


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """Variants as rows, the headline metrics as columns."""
    header = ["variant", *(title for _, title, _ in SUMMARY_COLUMNS)]
    body = []
    for name, summary in rows.items():
        cells = [name]
        for key, _, fmt in SUMMARY_COLUMNS:
            value = summary.get(key)
            cells.append("-" if value is None else fmt.format(value))
        body.append(cells)
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in [header, *body]
    ]
    return "\n".join(lines)


def fresh_out_dir(name: str) -> Path:
    """runs/NAME, or runs/NAME-2, -3, ... so an earlier run is never touched."""
    base = Path("runs") / name
    candidate, k = base, 2
    while candidate.exists():
        candidate = base.with_name(f"{name}-{k}")
        k += 1
    return candidate


def checked_out_dir(out: Path, overwrite: bool) -> Path:
    """An --out the user named: refused when it holds files, unless --overwrite (never silently)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"output folder {out} exists and is not empty (choose another --out or pass --overwrite)")
    return out


def _progress_bar(enabled: bool) -> tuple[Callable[[str, int, int], None] | None, Callable[[], None]]:
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def update(variant: str, done: int, total: int) -> None:
        bar = bars.get(variant)
        if bar is None:
            bar = bars[variant] = tqdm(total=total, desc=f"{variant:>12}", unit="req", leave=True,
                                       file=sys.stderr, mininterval=0.5)
        bar.update(done - bar.n)

    def close() -> None:
        for bar in bars.values():
            bar.close()

    return update, close


def cmd_run(args: argparse.Namespace) -> int:
    from simulator.fleet.fleet import run
    from simulator.scenario import load_scenario

    loaded = load_scenario(args.scenario, args.set or [], seed=args.seed)
    out = checked_out_dir(Path(args.out), args.overwrite) if args.out else fresh_out_dir(loaded.scenario.name)
    progress, close = _progress_bar(not args.quiet)
    try:
        result = run(loaded, progress=progress)
    finally:
        close()
    saved = result.save(out, overwrite=args.overwrite)
    rows = {name: v.summary.to_dict() for name, v in result.variants.items()}
    print(format_table(rows))
    for variant in result.variants.values():
        if variant.profile.kind == "analytic":
            print(f"note: {variant.name}: cost model {variant.profile.name} is analytic, not measured")
    for name, summary in rows.items():
        verdict = summary.get("slo_met")
        if verdict is not None and loaded.scenario.slo is not None:
            print(f"SLO {'met' if verdict else 'NOT met'} by {name}: attainment {summary['slo_attainment']:.3f}")
    print(f"report: {saved / 'report.html'}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from simulator.cost.profile import list_profiles, load_profile

    for name in list_profiles():
        profile = load_profile(name)
        mape = f"held-out MAPE {profile.fit_error.mape:.1%}" if profile.fit_error else "no fit error (analytic)"
        print(f"{name:40s} {profile.kind.value:9s} {profile.provenance.device_name:28s} {mape}")
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    from simulator.core.config import Batching, KVPolicy, Preemption, QueuePolicy
    from simulator.core.presets import PRESETS
    from simulator.fleet.router import ROUTERS

    families: dict[str, list[str]] = {
        "batching": [b.value for b in Batching],
        "kv policy": [k.value for k in KVPolicy],
        "preemption": [p.value for p in Preemption],
        "queue": [q.value for q in QueuePolicy],
        "router": list(ROUTERS),
        "preset": list(PRESETS),
    }
    from simulator.workload.workload import ARRIVAL_PROCESSES, LENGTH_DISTRIBUTIONS, TraceFormat

    families["arrival"] = list(ARRIVAL_PROCESSES)
    families["length dist"] = list(LENGTH_DISTRIBUTIONS)
    families["trace format"] = [t.value for t in TraceFormat]
    for family, names in families.items():
        print(f"{family:14s} {', '.join(names)}")
    return 0


def cmd_build_native(args: argparse.Namespace) -> int:
    from simulator import native

    folder = native.build_dir()
    if args.status:
        loaded = native.loaded_from()
        if loaded is not None:
            print(f"compiled hot path: in use ({loaded})")
        elif (folder / "manifest.json").is_file():
            print(f"compiled hot path: built, not in use ({folder})")
        else:
            print(f"compiled hot path: not built for these sources ({folder})")
        return 0
    try:
        native.build()
    except native.NativeBuildError as err:
        print(f"fleetsim: error: {err}", file=sys.stderr)
        return 1
    print("later runs load it automatically (FLEETSIM_PURE_PYTHON=1 turns it off)")
    return 0


PLUGINS: dict[str, str] = {
    "dashboard": "simulator.cli.dashboard",
    "plan": "simulator.cli.plan",
    "calibration": "calibration.cli",
}
"""Subcommands that live in other modules (module path -> it defines ``register(subparsers)``)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetsim", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="simulate a scenario and write a report")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--out", help="output folder (default runs/NAME, never an existing one)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario field")
    p.add_argument("--seed", type=int, help="override the scenario's seed")
    p.add_argument("--overwrite", action="store_true", help="write into an existing non-empty --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("profiles", help="list shipped cost-model profiles with their provenance")
    p.set_defaults(func=cmd_profiles)

    p = sub.add_parser("policies", help="list registered policy names per family")
    p.set_defaults(func=cmd_policies)

    p = sub.add_parser("build-native", help="compile the per-step hot path with mypyc (optional, ~1.7x faster)")
    p.add_argument("--status", action="store_true", help="only say whether a build for these sources exists")
    p.set_defaults(func=cmd_build_native)

    for module in PLUGINS.values():
        importlib.import_module(module).register(sub)
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
