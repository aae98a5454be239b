"""``fleetsim plan`` and ``fleetsim sweep``: subcommands registered into the CLI by ``register``.

Output goes to a new folder (runs/NAME-plan, runs/GRID-sweep, never an existing one unless --out names
it); progress goes to stderr so stdout holds only the answer.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from simulator.cli.output import checked_out_dir, fresh_out_dir, non_negative
from simulator.errors import ConfigError


def cmd_plan(args: argparse.Namespace) -> int:
    from simulator.planning.criteria import parse_search, parse_slo
    from simulator.planning.plan import plan, print_log

    if args.layouts:
        return _plan_layouts(args)
    slo = parse_slo(args.slo) if args.slo else None
    search = parse_search(args.search or [])
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    out = checked_out_dir(Path(args.out), args.overwrite) if args.out else None
    result = plan(
        args.scenario,
        slo=slo,
        load_factor=args.load_factor,
        max_replicas=args.max_replicas,
        search=search,
        seeds=args.seeds,
        overrides=args.set or [],
        variant=args.variant,
        knee=not args.no_knee,
        workers=args.workers,
        log=None if args.quiet else print_log,
    )
    out = out or fresh_out_dir(f"{result.scenario_name}-plan")
    path = result.save(out)
    from simulator.planning.plan_report import save_plan_report

    page = save_plan_report(result, out)
    print(result.text())
    print(f"plan: {path}")
    print(f"page: {page} (latency and attainment against replicas)")
    if args.autoscalers and result.replicas is not None:
        from simulator.planning.autoscaling import compare_policies
        from simulator.planning.plan import loaded_scenario
        from simulator.scenario import load_mapping

        loaded = loaded_scenario(args.scenario, tuple(args.set or []))
        if slo is not None:  # the plan's SLO: the --slo fields over the scenario's, as the plan judged by
            raw = {**loaded.raw, "slo": {**(loaded.raw.get("slo") or {}),
                                         **slo.model_dump(exclude_unset=True, exclude_none=True)}}
            loaded = load_mapping(raw, source=loaded.source)
        comparison = compare_policies(loaded, static_replicas=result.replicas,
                                      log=None if args.quiet else print_log, jobs=args.workers or None)
        print(comparison.text())
        print(f"autoscalers: {comparison.save(out)}")
    return 0 if result.replicas is not None else 1


def _plan_layouts(args: argparse.Namespace) -> int:
    """``fleetsim plan --layouts``: aggregated vs disaggregated, the xPyD ratio and the GPU per pool."""
    from simulator.planning.criteria import parse_hardware, parse_slo
    from simulator.planning.layouts import plan_layouts
    from simulator.planning.plan import print_log

    layouts = [item.strip() for item in args.layouts.split(",") if item.strip()]
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    out = checked_out_dir(Path(args.out), args.overwrite) if args.out else None
    result = plan_layouts(
        args.scenario, slo=parse_slo(args.slo) if args.slo else None, layouts=layouts,  # type: ignore[arg-type]
        hardware=parse_hardware(args.pool_hardware or []), objective=args.objective, max_gpus=args.max_gpus,
        load_factor=args.load_factor, seeds=args.seeds, overrides=args.set or [], variant=args.variant,
        workers=args.workers, log=None if args.quiet else print_log,
    )
    out = out or fresh_out_dir(f"{result.scenario_name}-layouts")
    path = result.save(out)
    print(result.text())
    print(f"plan: {path}")
    return 0 if result.best is not None else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    from simulator.planning.sweep import load_grid, save_sweep, sweep

    grid, _, _ = load_grid(args.grid)  # a bad grid file fails here, before any worker starts
    name = f"{Path(args.grid).stem}-sweep"
    out = checked_out_dir(Path(args.out), args.overwrite) if args.out else fresh_out_dir(name)
    frame = sweep(args.grid, executor=args.executor, workers=args.workers, address=args.address,
                  show_progress=not args.quiet)
    keys = list(grid.grid)
    paths = save_sweep(frame, keys, out, latency=args.latency)
    failed = int(frame["error"].notna().sum())
    print(f"{len(frame)} rows from {frame['task_id'].nunique()} tasks; {failed} failed")
    _print_front(frame, keys, args.latency)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 1 if failed else 0


def _print_front(frame: Any, keys: list[str], latency: str) -> None:
    from simulator.planning.sweep import pareto_points

    points = pareto_points(frame, keys, y=latency)
    if points.empty:  # every task failed (each said so)
        return
    front = points[points["on_front"].astype(bool)].sort_values("cost_per_mtok_usd")
    if front.empty:
        return
    print(f"Pareto front (cost per Mtok vs {latency}, mean over seeds):")
    for _, row in front.iterrows():
        point = ", ".join(f"{k}={row[k]}" for k in keys)
        print(f"  {row['cost_per_mtok_usd']:.3f} $/Mtok  {row[latency]:9.1f} ms  "
              f"attainment {row['slo_attainment']:.3f}  {point}")


def register(subparsers: Any) -> None:
    """Add ``plan`` and ``sweep`` to the CLI's subparsers."""
    from simulator.planning import DEFAULT_SEEDS

    p = subparsers.add_parser("plan", help="smallest fleet meeting an SLO, one replica's knee, cost, sensitivity")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--slo", metavar="K=V,...",
                   help="SLO, e.g. ttft_ms=500,tpot_ms=50,target=0.9 (any slo field; default: the scenario's)")
    p.add_argument("--max-replicas", type=int, default=64, help="give up beyond this many replicas (64)")
    p.add_argument("--search", action="append", metavar="KEY.PATH=V1,V2",
                   help="also try these values of a knob (repeat for a cartesian product); best by cost")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help=f"seeds per point ({DEFAULT_SEEDS}): two show their range, three or more a bootstrap interval")
    p.add_argument("--load-factor", type=float, default=1.0, help="plan for this multiple of the scenario's load")
    p.add_argument("--variant", help="plan this variant of the scenario (default: the base)")
    p.add_argument("--no-knee", action="store_true", help="skip the one-replica saturation search")
    p.add_argument("--workers", type=non_negative,
                   help="processes running seeds in parallel (default: one per seed); with --autoscalers, also the "
                        "compared fleets (default: one per CPU core when they replay 20,000 requests or more)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario field")
    p.add_argument("--layouts", metavar="L1,L2",
                   help="plan the layout instead: aggregated, disaggregated (the xPyD ratio), or both")
    p.add_argument("--pool-hardware", action="append", metavar="ROLE=GPU1,GPU2",
                   help="with --layouts, GPUs to try for a role: mixed, prefill or decode (default: the scenario's)")
    p.add_argument("--objective", choices=["gpus", "cost"], default="gpus",
                   help="with --layouts, the fewest GPUs (ties: lower cost) or the lowest $ per Mtok")
    p.add_argument("--max-gpus", type=int, default=16, help="with --layouts, give up beyond this many GPUs (16)")
    p.add_argument("--autoscalers", action="store_true",
                   help="then run the plan's static fleet beside every autoscaled variant of the scenario (its "
                        "autoscaling sections): GPU-hours, $/day, SLO-minutes lost; writes autoscalers.csv")
    p.add_argument("--out", help="output folder for plan.json, trials.csv and plan.html (default runs/NAME-plan)")
    p.add_argument("--overwrite", action="store_true", help="write into an existing non-empty --out")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_plan)

    p = subparsers.add_parser("sweep", help="run a grid of overrides x seeds locally or on Ray")
    p.add_argument("grid", help="grid YAML: scenario, seeds, grid, set")
    p.add_argument("--executor", choices=["local", "ray"], default="local", help="process pool or Ray (local)")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--workers", type=int, help="local processes (default: CPU count); CPUs of a local Ray")
    p.add_argument("--latency", default="e2e_p99_ms", help="latency metric of the Pareto view (e2e_p99_ms)")
    p.add_argument("--out", help="output folder (default runs/GRID-sweep)")
    p.add_argument("--overwrite", action="store_true", help="write into an existing non-empty --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

