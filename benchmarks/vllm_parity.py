"""What following current vLLM v1 changes in simulated results: ``python benchmarks/vllm_parity.py``.

The core now does what vLLM v1 does on four points that older fleetsim (and older vLLM) did differently;
each is switched on in turn, cumulatively, on the same request streams:

1. ``before``: freed blocks all to the tail of the free queue, only prompt blocks hashed, synchronous
   scheduling (the core as it was, with the profile's overlapped host term it ran with).
2. ``+ free order``: freed blocks without a hash go to the front (vLLM's ``prepend_n``).
3. ``+ output hashes``: blocks are hashed as outputs fill them, so a recompute after preemption and a
   session's next turn (whose prompt holds the previous answer) hit them.
4. ``+ async``: async scheduling, vLLM's default: step n+1 scheduled while step n runs (finishes and
   arrivals take effect one step later, host work overlapped) — today's ``vllm`` preset.

and, beside them, ``no-async``: today's preset with ``--no-async-scheduling`` (host work between steps).

Cases: a cache-bound multi-turn chat (sessions sharing system prompts, the ``routing.yaml`` shape, on a
KV pool too small to keep every conversation), the Mooncake conversation trace on a bounded pool, and a
preemption-heavy load (long outputs on a small pool, stable but preempting). Prints prefix hit rate,
preemptions, prompt tokens computed (first computations plus recomputes), TTFT p50/p99 and throughput per
configuration.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simulator.simulation as simulation_module
from simulator.core.request import RequestSpec
from simulator.scenario import ReplicaSetup, Scenario, load_scenario, with_engine_host
from simulator.workload.generate import generate
from simulator.workload.traces import TRACES_TOKEN, traces_dir
from simulator.workload.workload import Workload

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    scenario: Path
    overrides: tuple[str, ...]


CASES = {
    "cache-bound multi-turn (sessions, 4 replicas, 1,500 blocks each)": Case(
        ROOT / "scenarios" / "routing.yaml",
        ("engine.kv.num_blocks=1500", "workload.num_requests=1200", "router.policy=session_affinity"),
    ),
    "Mooncake conversation trace (4 replicas, 2,500 blocks each)": Case(
        ROOT / "scenarios" / "mooncake.yaml", ("engine.kv.num_blocks=2500", "workload.num_requests=800"),
    ),
    "preemption-heavy (long outputs, 1 replica, 2,000 blocks, 3 req/s)": Case(
        ROOT / "scenarios" / "quickstart.yaml",
        ("fleet.replicas=1", "engine.kv.num_blocks=2000", "workload.num_requests=400",
         "workload.arrival.rate_rps=3", "workload.output_tokens.median=600"),
    ),
}


@dataclass(frozen=True)
class Rules:
    """Which of vLLM's current rules the run follows."""

    unhashed_first: bool
    output_hashes: bool
    async_scheduling: bool
    old_host: bool
    """Keep the overlapped host term whatever the scheduling mode (as fleetsim ran before the host term
    followed the engine)."""


CONFIGS = {
    "before": Rules(unhashed_first=False, output_hashes=False, async_scheduling=False, old_host=True),
    "+ free order": Rules(unhashed_first=True, output_hashes=False, async_scheduling=False, old_host=True),
    "+ output hashes": Rules(unhashed_first=True, output_hashes=True, async_scheduling=False, old_host=True),
    "+ async": Rules(unhashed_first=True, output_hashes=True, async_scheduling=True, old_host=False),
    "no-async": Rules(unhashed_first=True, output_hashes=True, async_scheduling=False, old_host=False),
}

METRICS = ("prefix_hit_rate", "preemptions", "prefill_tokens", "ttft_p50_ms", "ttft_p99_ms", "throughput_tok_s")


class PromptHashesOnly(Workload):
    """The same request stream with each request's hashes cut to its prompt's full blocks."""

    def __init__(self, inner: Workload) -> None:
        self.__dict__["_inner"] = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.__dict__["_inner"], name)

    def __len__(self) -> int:
        return len(self.__dict__["_inner"])

    def iter_specs(self, *, block_hashes: bool = True, lazy_chains: bool = False) -> Iterator[RequestSpec]:
        # Every spec's hashes as values (never a lazy tail), so that they can be cut: the same results.
        inner: Workload = self.__dict__["_inner"]
        for spec in inner.iter_specs(block_hashes=block_hashes):
            keep = spec.prompt_tokens // inner.block_size
            yield spec.with_hashes(spec.block_hashes[:keep]) if len(spec.block_hashes) > keep else spec

    def __iter__(self) -> Iterator[RequestSpec]:
        return self.iter_specs()


def simulate(scenario: Scenario, workload: Workload, rules: Rules) -> dict[str, float]:
    original = simulation_module.resolve_replica

    def resolve(sc: Scenario) -> ReplicaSetup:
        setup = original(sc)
        # The host term: the overlapped one fleetsim always used, or the one of the engine as it schedules.
        profile = with_engine_host(setup.profile, sc.engine.preset, rules.async_scheduling or rules.old_host)
        scheduler = replace(setup.scheduler, unhashed_blocks_first=rules.unhashed_first,
                            async_scheduling=rules.async_scheduling)
        return ReplicaSetup(profile=profile, scheduler=scheduler)

    prefill: list[int] = []
    simulation_module.resolve_replica = resolve  # type: ignore[assignment]
    try:
        stream = workload if rules.output_hashes else PromptHashesOnly(workload)
        result = simulation_module.simulate(
            scenario, stream, inspect=lambda _name, replicas: prefill.append(
                sum(r.num_prefill_tokens for r in replicas)))
    finally:
        simulation_module.resolve_replica = original
    summary = result.summary.to_dict()
    figures = {k: float(summary[k]) for k in METRICS if k in summary}
    figures["prefill_tokens"] = float(prefill[0])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=range(len(CASES)), type=int, action="append",
                        help="run only these cases (by index); default all")
    args = parser.parse_args()
    for index, (name, case) in enumerate(CASES.items()):
        if args.case and index not in args.case:
            continue
        if TRACES_TOKEN in case.scenario.read_text() and not traces_dir().is_dir():
            print(f"{name}: skipped, shared traces not found at {traces_dir()}")
            continue
        loaded = load_scenario(case.scenario, list(case.overrides))
        scenario = loaded.scenario.model_copy(update={"variants": {}})
        block_size = simulation_module.resolve_replica(scenario).scheduler.block_size
        workload = generate(scenario.workload, seed=scenario.seed, block_size=block_size, base_dir=loaded.base_dir)
        print(name)
        print(f"  {'':16s}" + "".join(f"{m:>18s}" for m in METRICS))
        for label, rules in CONFIGS.items():
            figures = simulate(scenario, workload, rules)
            print(f"  {label:16s}" + "".join(f"{figures[m]:>18.4g}" for m in METRICS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
