"""A day of traffic: what cold starts cost a reactive autoscaler, and how fast a simulated day runs.

    python benchmarks/day.py curve                 # cold start vs SLO-minutes lost and cost (scenarios/day.yaml)
    python benchmarks/day.py curve --hours 12 --provision 0 120 300 600
    python benchmarks/day.py curve --hours 12 --policies concurrency --target 40 --oracle-rps 4   # tighter
    python benchmarks/day.py compare               # static N (searched) vs every policy of the day scenario
    python benchmarks/day.py speed --replicas 64   # a day at 64 replicas: wall time, events, requests
    python benchmarks/day.py speed --replicas 64 --rps-per-replica 0.1 [--plain]   # a lighter day; --plain: static path
    python benchmarks/day.py speed --replicas 64 --hours 2 --set engine.prefix_caching=false   # what the cache costs

``curve`` runs the day scenario's ``concurrency`` and ``slo`` variants at several provisioning times (the
cold start is provisioning + weights / bandwidth + warm-up) and the oracle once per cold start, and prints
SLO-minutes lost, SLO attainment, GPU-hours and dollars per day: a reactive policy loses more of the SLO
in the ramps and bursts the longer a replica takes to start, while the oracle, asking a cold start ahead,
does not. ``compare`` finds the fewest static replicas meeting the SLO over the day and prints it beside
each policy. ``speed`` simulates a day on a static fleet of ``--replicas`` replicas at ``--rps-per-replica``
at the peak, and prints wall and CPU time, SimPy events, and requests (the compiled build runs when
``fleetsim build-native`` has built it: the first line says which).
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any

from simulator import native, yaml_text
from simulator.fleet.clock import event_ids
from simulator.fleet.replica import Replica
from simulator.results.run_result import VariantResult
from simulator.scenario import load_mapping
from simulator.simulation import run

DAY = Path(__file__).resolve().parents[1] / "scenarios" / "day.yaml"


def _only(name: str, overrides: list[str], **autoscaling: float | None) -> Any:
    """The day scenario with only its variant ``name``, with ``overrides`` applied to the base (the variant's
    own settings still win); ``autoscaling``: settings of the variant's autoscaler instead of its own (None:
    its own)."""
    raw = yaml_text.safe_load(DAY.read_text())
    variant = dict(raw["variants"][name])
    changed = {key: value for key, value in autoscaling.items() if value is not None}
    if changed:
        variant["autoscaling"] = {**variant["autoscaling"], **changed}
    raw["variants"] = {name: variant}
    return load_mapping(raw, overrides, source=DAY)


def _variant(loaded: Any) -> VariantResult:
    return next(iter(run(loaded).variants.values()))


def _row(label: str, v: VariantResult, seconds: float) -> str:
    assert v.day is not None
    f = v.day.figures
    s = v.summary
    return (f"{label:28s} {f.slo_minutes_lost:6d} {s.slo_attainment:9.4f} {f.gpu_hours:9.1f} "
            f"{f.cost_per_day_usd:9.0f} {f.num_cold_starts:6d} {f.requests_retried:8d} {s.requests_failed or 0:6d} "
            f"{seconds:7.1f}")


HEADER = (f"{'variant':28s} {'SLOmin':>6s} {'attain':>9s} {'GPU-h':>9s} {'$/day':>9s} {'cold':>6s} "
          f"{'retried':>8s} {'failed':>6s} {'wall s':>7s}")


def _timed(label: str, loaded: Any) -> None:
    start = time.perf_counter()
    v = _variant(loaded)
    print(_row(label, v, time.perf_counter() - start), flush=True)


def curve(args: argparse.Namespace) -> None:
    window = [f"workload.duration_s={args.hours * 3600:g}"] if args.hours < 24 else []
    print(f"day scenario, first {args.hours:g} h; cold start = provisioning + 17.5 s weights + 30 s warm-up")
    print(HEADER)
    for provision in args.provision:
        cold = [f"lifecycle.provision_s={provision:g}", *window]
        for policy in args.policies:
            target = args.target if policy == "concurrency" else None
            label = f"{policy}{'' if target is None else f' {target:g}'} cold {provision + 47.5:g} s"
            _timed(label, _only(policy, cold, target=target))
        oracle = "oracle" if args.oracle_rps is None else f"oracle {args.oracle_rps:g}"
        _timed(f"{oracle} cold {provision + 47.5:g} s", _only("oracle", cold, rps_per_replica=args.oracle_rps))


def compare(args: argparse.Namespace) -> None:
    window = [f"workload.duration_s={args.hours * 3600:g}"] if args.hours < 24 else []
    print(f"day scenario, first {args.hours:g} h: the fewest static replicas meeting the SLO, then each policy")
    print(HEADER)
    for replicas in range(args.static_from, args.static_to + 1):
        start = time.perf_counter()
        v = _variant(_only("static-5", [f"fleet.replicas={replicas}", *window]))
        print(_row(f"static {replicas}", v, time.perf_counter() - start), flush=True)
        if v.summary.slo_met and v.day is not None and v.day.figures.slo_minutes_lost <= args.max_slo_minutes:
            break
    for policy in ("concurrency", "slo", "oracle"):
        _timed(policy, _only(policy, window))


def speed(args: argparse.Namespace) -> None:
    peak = args.replicas * args.rps_per_replica
    overrides = _only("static-5", [f"fleet.replicas={args.replicas}", f"workload.arrival.peak_rps={peak:g}",
                                   f"workload.arrival.trough_rps={peak / 8:g}", "workload.arrival.bursts=[]",
                                   "failures.node_failures=[]", *args.set,
                                   *(["lifecycle=null", "failures=null"] if args.plain else []),
                                   f"workload.duration_s={args.hours * 3600:g}", "simulation.sample_interval_s=300"])
    envs: list[Any] = []

    def prepare(name: str, replicas: Any) -> None:
        first: Replica = replicas[0]
        envs.append(first.env)

    print(f"compiled hot path in use: {native.active()}")
    loaded = overrides
    wall = time.perf_counter()
    cpu = time.process_time()
    result = run(loaded, prepare=prepare)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    v = next(iter(result.variants.values()))
    events = event_ids(envs[0]).next_id
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    path = "static path" if args.plain else "dynamic path"
    print(f"{path}: {args.replicas} replicas, {args.hours:g} h, peak {peak:g} req/s: "
          f"{v.summary.requests_arrived:,} requests, "
          f"{events:,} SimPy events, wall {wall:.1f} s, CPU {cpu:.1f} s, "
          f"{v.summary.requests_arrived / cpu:,.0f} requests per CPU second, peak RSS {rss_mb:,.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("curve")
    c.add_argument("--hours", type=float, default=24.0)
    c.add_argument("--provision", type=float, nargs="+", default=[0, 60, 300, 900])
    c.add_argument("--policies", nargs="+", default=["concurrency", "slo"])
    c.add_argument("--target", type=float, default=None,
                   help="the concurrency policy's requests per replica instead of the scenario's (less headroom)")
    c.add_argument("--oracle-rps", type=float, default=None,
                   help="the oracle's requests/s per replica instead of the scenario's (4: the most that meets the "
                        "SLO, the tightest lower bound)")
    c.set_defaults(func=curve)
    p = sub.add_parser("compare")
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--static-from", type=int, default=3)
    p.add_argument("--static-to", type=int, default=10)
    p.add_argument("--max-slo-minutes", type=int, default=30)
    p.set_defaults(func=compare)
    s = sub.add_parser("speed")
    s.add_argument("--replicas", type=int, default=64)
    s.add_argument("--rps-per-replica", type=float, default=1.0)
    s.add_argument("--hours", type=float, default=24.0)
    s.add_argument("--plain", action="store_true", help="the static fleet's own path (no lifecycle, no failures)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a scenario override")
    s.set_defaults(func=speed)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
