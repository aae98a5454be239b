"""Why disaggregation pays on one workload and not on another, from the simulator's own step traces.

    python benchmarks/disaggregation.py                         # scenarios/disaggregation.yaml, every variant
    python benchmarks/disaggregation.py --variant summarise_aggregated_2 --variant summarise_1p1d

Runs the scenario's variants step by step (``simulation.fast_path`` off, so that every step makes a plan)
with a ``StepTrace`` on every replica, then prints per variant the SLO verdict and goodput per GPU, and per
pool role what its steps were made of: the share of decode tokens that rode in a step with prompt tokens,
the mean time of the step a decode token rode in (what TPOT is made of), the mean decode-only and
prompt-carrying step times, and how busy the pool's GPUs were. Numbers, never pass/fail.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence

from simulator.fleet.replica import Replica
from simulator.results.step_trace import StepTrace
from simulator.scenario import load_mapping, load_scenario
from simulator.simulation import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("scenario", nargs="?", default="scenarios/disaggregation.yaml")
    parser.add_argument("--variant", action="append", default=[], help="only these variants (repeatable)")
    parser.add_argument("--set", action="append", default=[], help="override, as fleetsim run --set")
    args = parser.parse_args(argv)
    loaded = load_scenario(args.scenario, [*args.set, "simulation.fast_path=false"])
    if args.variant:
        unknown = set(args.variant) - set(loaded.scenario.variants)
        if unknown:
            parser.error(f"no variant {sorted(unknown)}; variants are {sorted(loaded.scenario.variants)}")
        raw = {**loaded.raw, "variants": {k: v for k, v in loaded.scenario.variants.items() if k in args.variant}}
        loaded = load_mapping(raw, source=loaded.source)
    traces: dict[str, StepTrace] = {}
    roles: dict[str, dict[str, list[int]]] = {}

    def prepare(name: str, replicas: Sequence[Replica]) -> None:
        trace = traces[name] = StepTrace()
        groups: dict[str, list[int]] = defaultdict(list)
        for replica in replicas:
            replica.on_plan = trace.recorder(replica.replica_id, replica.cost_model.step_time)
            groups[str(replica.scheduler.config.role)].append(replica.replica_id)
        roles[name] = dict(groups)

    result = run(loaded, prepare=prepare)
    print(f"{'variant':24s} {'GPUs':>4s} {'SLO att.':>8s} {'good/GPU':>8s} {'TPOT p50':>8s} {'TTFT p99':>8s}  "
          f"{'role':7s} {'dec w/ prompt':>13s} {'dec step ms':>11s} {'dec-only ms':>11s} {'prompt step ms':>14s} "
          f"{'busy':>5s}")
    for name, variant in result.variants.items():
        s = variant.summary
        head = (f"{name:24s} {s.num_gpus:4d} {s.slo_attainment:8.3f} {s.goodput_rps / s.num_gpus:8.2f} "
                f"{s.tpot_p50_ms:8.1f} {s.ttft_p99_ms:8.0f}")
        for role, ids in roles[name].items():
            f = traces[name].figures(ids)
            busy = f.busy_s / (len(ids) * (s.duration_s + s.warmup_s))
            if role == "prefill":  # no decode tokens: a one-token row there is a prompt's last token
                decode = f"{'-':>13s} {'-':>11s} {'-':>11s}"
            else:
                decode = f"{f.decode_tokens_with_prefill:13.1%} {f.decode_step_ms:11.1f} {f.decode_only_step_ms:11.1f}"
            print(f"{head}  {role:7s} {decode} {f.prefill_step_ms:14.1f} {busy:5.0%}")
            head = " " * len(head)
    return 0


if __name__ == "__main__":
    sys.exit(main())
