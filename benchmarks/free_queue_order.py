"""Effect of vLLM's current free-queue order on simulated results: ``python benchmarks/free_queue_order.py``.

vLLM v1 hands out freed blocks without a hash before anything else (``prepend_n``), so cached prefixes
live longer; the older order sent every freed block to the tail. Both run here on the same request
streams: a cache-bound multi-turn replay (the Mooncake conversation trace on one replica with a small KV
pool) and a preemption-heavy synthetic load (long outputs on a pool too small for them). Prints hit
rate, preemptions and TTFT p99 before (older order) and after (vLLM's).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simulator.scenario as scenario_module
import simulator.simulation as simulation_module
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    **{f"cache-bound multi-turn (Mooncake, 4 replicas, {n:,} blocks each)": (
        ROOT / "scenarios" / "mooncake.yaml",
        [f"engine.kv.num_blocks={n}", "workload.num_requests=800"],
    ) for n in (2500, 5000)},
    "preemption-heavy (long outputs, 600 blocks)": (
        ROOT / "scenarios" / "quickstart.yaml",
        ["fleet.replicas=1", "engine.kv.num_blocks=600", "workload.num_requests=400",
         "workload.arrival.rate_rps=8", "workload.output_tokens.median=600"],
    ),
}


def run(path: Path, overrides: list[str], unhashed_first: bool) -> dict[str, float]:
    original = scenario_module.resolve_replica

    def resolve(scenario):  # type: ignore[no-untyped-def]
        setup = original(scenario)
        return replace(setup, scheduler=replace(setup.scheduler, unhashed_blocks_first=unhashed_first))

    simulation_module.resolve_replica = resolve  # type: ignore[assignment]
    try:
        loaded = load_scenario(path, overrides)
        loaded = replace(loaded, scenario=loaded.scenario.model_copy(update={"variants": {}}))
        result = simulation_module.run(loaded)
    finally:
        simulation_module.resolve_replica = original
    summary = next(iter(result.variants.values())).summary.to_dict()
    return {k: float(summary[k]) for k in ("prefix_hit_rate", "preemptions", "ttft_p99_ms", "throughput_tok_s")}


def main() -> int:
    for name, (path, overrides) in CASES.items():
        before = run(path, overrides, unhashed_first=False)
        after = run(path, overrides, unhashed_first=True)
        print(name)
        for key in before:
            print(f"  {key:18s} older order {before[key]:10.4g}   vLLM order {after[key]:10.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
