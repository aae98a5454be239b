"""``fleetsim profiles``, ``policies`` and ``build-native``: what is shipped and registered, and the
optional compiled hot path."""

from __future__ import annotations

import argparse
import sys


def cmd_profiles(args: argparse.Namespace) -> int:
    from simulator.cost.profile import list_profiles, load_profile

    print(f"{'profile':40s} {'kind':16s} {'device':28s} fit")
    for name in list_profiles():
        profile = load_profile(name)
        mape = f"held-out MAPE {profile.fit_error.mape:.1%}" if profile.fit_error else "no fit error (analytic)"
        engine = (f"  (the {profile.measured_on} engine's own: a default only where no other profile matches)"
                  if profile.measured_on else "")
        print(f"{name:40s} {profile.kind.value:16s} {profile.provenance.device_name:28s} {mape}{engine}")
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    from simulator.core.config import Batching, KVPolicy, Preemption, QueuePolicy, Role
    from simulator.core.kv_tiers import EVICTION_POLICIES, TierKind, TierSource
    from simulator.core.presets import PRESETS
    from simulator.cost.link import load_links
    from simulator.fleet.autoscaler import AUTOSCALERS
    from simulator.fleet.config import FirstToken, TransferMode
    from simulator.fleet.router import ROUTERS

    families: dict[str, list[str]] = {
        "batching": [b.value for b in Batching],
        "kv policy": [k.value for k in KVPolicy],
        "preemption": [p.value for p in Preemption],
        "queue": [q.value for q in QueuePolicy],
        "router": list(ROUTERS),
        "autoscaler": list(AUTOSCALERS),
        "preset": list(PRESETS),
        "pool role": [r.value for r in Role],
        "kv link": list(load_links()),
        "kv transfer": [t.value for t in TransferMode],
        "first token": [f.value for f in FirstToken],
        "tier eviction": list(EVICTION_POLICIES),
        "tier kind": [k.value for k in TierKind],
        "tier source": [s.value for s in TierSource],
    }
    from simulator.workload.arrival import ARRIVAL_PROCESSES
    from simulator.workload.lengths import LENGTH_DISTRIBUTIONS
    from simulator.workload.traces import TraceFormat

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
            print(f"compiled hot path: in use{native.build_kind(loaded)} ({loaded})")
        elif (folder / "manifest.json").is_file():
            print(f"compiled hot path: built{native.build_kind(folder)}, not in use ({folder})")
        else:
            print(f"compiled hot path: not built for these sources in this environment ({folder})")
        return 0
    try:
        native.build(profile_guided=False if args.no_pgo else None)
    except native.NativeBuildError as err:
        print(f"fleetsim: error: {err}", file=sys.stderr)
        return 1
    print("later runs load it automatically (FLEETSIM_PURE_PYTHON=1 turns it off)")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fleetsim profiles``, ``fleetsim policies`` and ``fleetsim build-native``."""
    p = subparsers.add_parser("profiles", help="list shipped cost-model profiles with their provenance")
    p.set_defaults(func=cmd_profiles)

    p = subparsers.add_parser("policies", help="list registered policy names per family")
    p.set_defaults(func=cmd_policies)

    p = subparsers.add_parser("build-native", help="compile the per-step hot path with mypyc (optional, several times "
                              "faster, same results)")
    p.add_argument("--status", action="store_true", help="only say whether a build for these sources exists")
    p.add_argument("--no-pgo", action="store_true",
                   help="one compile without a profile (about a minute) rather than the profile-guided build "
                        "(about three; ~1.1x faster code; GCC only); also FLEETSIM_NATIVE_PGO=0")
    p.set_defaults(func=cmd_build_native)
