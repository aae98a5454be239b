"""The KV memory hierarchy on Mooncake's conversation trace: each configuration of ``scenarios/kv_tiers.yaml``
(GPU only, + host DRAM, + NVMe, + the shared store) against the unbounded-cache ideal computed from the
trace's hash ids, with an unbounded tier per replica and an unbounded store shared by the replicas added
(on one replica, either reaches the ideal exactly).

    python benchmarks/kv_tiers.py                         # the scenario as shipped (600 requests, 4 replicas)
    python benchmarks/kv_tiers.py --set workload.num_requests=300 --set fleet.replicas=1
    python benchmarks/kv_tiers.py --host-gib 16,64,256    # how much host DRAM per GPU is worth buying

Prints hit rate by place, the TTFT split, SLO attainment and the cost per output token with the tiers' per
variant. Numbers, never pass/fail.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from simulator.results.kv_tiers import ideal_hit_rate
from simulator.scenario import fleet_block_size, load_mapping
from simulator.simulation import run
from simulator.workload.generate import generate

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "kv_tiers.yaml"
MOONCAKE = ("gpu_only", "host", "host_ssd", "host_ssd_store")
UNBOUNDED = {"name": "host", "read_gb_s": 25, "write_gb_s": 25}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--host-gib", default="", help="host DRAM sizes per GPU to add as host_<GiB> variants")
    args = parser.parse_args(argv)
    raw = yaml.safe_load(SCENARIO.read_text(encoding="utf-8"))
    raw["variants"] = {name: raw["variants"].get(name, {}) for name in MOONCAKE}
    # Unbounded: a host tier per replica (sees only its own replica's prefixes), and a store shared by all,
    # written as blocks are computed (a cache shared by everyone: the ideal's premise).
    raw["variants"]["unbounded_host"] = {"kv_tiers": {"tiers": [UNBOUNDED]}}
    raw["variants"]["unbounded_store"] = {"kv_tiers": {"tiers": [], "shared_store": {
        **UNBOUNDED, "name": "store", "kind": "remote", "source": "compute"}}}
    host = raw["variants"]["host"]["kv_tiers"]["tiers"][0]
    for gib in (float(x) for x in args.host_gib.split(",") if x):
        raw["variants"][f"host_{gib:g}"] = {"kv_tiers": {"tiers": [{**host, "capacity_gib": gib}]}}
    loaded = load_mapping(raw, args.set, source=SCENARIO)
    base = loaded.variants()["gpu_only"]
    block_size = fleet_block_size(base)
    workload = generate(base.workload, seed=base.seed, block_size=block_size, base_dir=loaded.base_dir)
    ideal = ideal_hit_rate([s.block_hashes for s in workload.iter_specs(block_hashes=True)],
                           workload.prompt_tokens, block_size)
    print(f"{len(workload)} Mooncake requests on {base.fleet.replicas} replica(s), {block_size}-token blocks; "
          f"unbounded-cache ideal hit rate {ideal:.6f}")
    result = run(loaded)
    print(f"{'variant':16} {'hit rate':>9} {'by place':60} {'TTFT p50':>9} {'mean q/load/compute ms':>24} "
          f"{'SLO att':>8} {'$/Mtok':>7}")
    for name, v in result.variants.items():
        s = v.summary
        if v.tiers is None:
            rate, places, split = s.prefix_hit_rate, f"device {s.prefix_hit_rate:.4f}", "-"
            cost = s.cost_per_mtok_usd
        else:
            rate = v.tiers.hit_rate["total"]
            places = ", ".join(f"{k} {x:.4f}" for k, x in v.tiers.hit_rate.items() if k != "total")
            t = v.tiers.ttft_split_ms
            split = f"{t['queue']:.0f} / {t['load']:.1f} / {t['compute']:.0f}"
            cost = v.tiers.cost_per_mtok_usd
        print(f"{name:16} {rate:9.6f} {places:60} {s.ttft_p50_ms:9.1f} {split:>24} {s.slo_attainment:8.3f} "
              f"{cost:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
