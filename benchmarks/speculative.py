"""Where speculative decoding stops paying: ``python benchmarks/speculative.py [--no-engine] [--out F.json]
[--rates-out rates.yaml]`` (the engine's measured acceptance, as ``engine.speculative.acceptance_table`` reads).

Four tables, on the setting of ``scenarios/speculative.yaml`` (Llama-3-70B, TP4 on H100, a draft model at 5 %
of a target decode step per pass):

1. The cost model by decode batch B (1,024 tokens of context each): the time per output token without
   speculation and with k proposals at acceptance α (a step verifies B·(1 + k) tokens and pays k draft
   passes, then yields E = (1 - α^(k+1)) / (1 - α) tokens per row), their ratio, and the batch where the
   ratio falls below 1: the crossover batch.
2. Batch 1, simulated (requests one at a time): the TPOT cut against E / (verify step / decode step + k ×
   draft fraction), the expected tokens per step net of the draft.
3. The load sweep, simulated: TPOT p50 and throughput without and with speculation by arrival rate, and
   the crossover load (the first rate where speculation's TPOT is no better).
4. The real engine (CPU, the ``small`` model drafting for itself with its first layer, greedy): measured
   acceptance per draft position, draft and verification step times, TPOT with and without speculation.

Published figure to compare (vLLM's speculative decoding post, https://blog.vllm.ai/2024/10/17/spec-decode.html,
Llama-3-70B on 4×H100, ShareGPT, draft model Qwama-0.5B): up to 1.5x faster at 1 request/s, 1.4x slower at
high load. The simulator's draft cost and acceptance are assumptions (analytic), not that setup's measured
ones: compare the shape (a gain at low load that inverts at high load), not the digits.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from simulator.core.request import Request, RequestSpec
from simulator.core.speculation import Speculation, expected_tokens
from simulator.core.step import StepPlan
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import load_profile
from simulator.cost.speculative_step import speculative_step_s
from simulator.scenario import load_mapping
from simulator.simulation import run

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "speculative.yaml"
PROFILE = "h100-llama-3-70b-tp4-fitted-published"
DRAFT_FRACTION = 0.05
CONTEXT = 1024
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SETTINGS = ((2, 0.7), (4, 0.7), (4, 0.5), (4, 0.9))
RATES = (1, 2, 4, 8, 12, 16, 20, 24)
RECORD: dict[str, Any] = {}
"""What the tables found, written as JSON by ``--out``."""
PUBLISHED = {"low_load_speedup": 1.5, "high_load_slowdown": 1.4,
             "source": "https://blog.vllm.ai/2024/10/17/spec-decode.html"}


def _plan(batch: int, k: int) -> StepPlan:
    """A decode step of ``batch`` rows at CONTEXT tokens, each with k proposals (k = 0: plain decode)."""
    plan = StepPlan(0)
    for rid in range(batch):
        request = Request(RequestSpec(rid, 0.0, CONTEXT, 10_000))
        request.num_output_tokens = 1
        request.num_computed_tokens = CONTEXT
        plan.add(request, 1 + k)
    plan.num_spec_tokens = [k] * batch
    return plan


def per_token_ms(cost: CostModel, batch: int, k: int, rate: float) -> float:
    """Milliseconds per output token of one row at decode batch ``batch``."""
    if k == 0:
        return cost.step_time(_plan(batch, 0).shape) * 1e3
    spec = Speculation(num_speculative_tokens=k, acceptance_rates=(rate,) * k, draft_cost_fraction=DRAFT_FRACTION)
    step_s, _ = speculative_step_s(cost, _plan(batch, k), spec)
    return step_s * 1e3 / expected_tokens(rate, k)


def cost_table() -> None:
    cost = CostModel(load_profile(PROFILE))
    print(f"1. cost model, {PROFILE}: ms per output token by decode batch ({CONTEXT} tokens of context)")
    print(f"{'':16s}" + "".join(f"{b:>8d}" for b in BATCHES) + "   crossover batch")
    base = [per_token_ms(cost, b, 0, 0.0) for b in BATCHES]
    print(f"{'off':16s}" + "".join(f"{t:8.2f}" for t in base))
    for k, rate in SETTINGS:
        times = [per_token_ms(cost, b, k, rate) for b in BATCHES]
        cross = next((b for b, t, t0 in zip(BATCHES, times, base, strict=True) if t >= t0), None)
        RECORD.setdefault("crossover_batch", {})[f"k{k}-a{rate}"] = cross
        print(f"{f'k{k} a{rate}':16s}" + "".join(f"{t:8.2f}" for t in times)
              + f"   {cross if cross is not None else '> ' + str(BATCHES[-1])}")
        print(f"{'  speedup':16s}" + "".join(f"{t0 / t:8.2f}" for t, t0 in zip(times, base, strict=True)))


def _scenario(variants: dict[str, dict[str, Any]], **workload: Any) -> Any:
    raw = yaml.safe_load(SCENARIO.read_text())
    raw["variants"] = variants
    raw["workload"].update(workload)
    return load_mapping(raw)


def _spec(k: int, rate: float) -> dict[str, Any]:
    return {"engine.speculative": {"method": "draft_model", "num_speculative_tokens": k, "acceptance_rate": rate,
                                   "draft_cost_fraction": DRAFT_FRACTION}}


def batch_one() -> None:
    print("\n2. batch 1 (one request at a time, simulated): TPOT cut vs expected tokens per step net of the draft")
    variants = {"off": {}, **{f"k{k}-a{a}": _spec(k, a) for k, a in SETTINGS}}
    result = run(_scenario(variants, num_requests=30, arrival={"process": "poisson", "rate_rps": 0.01}))
    off = result.variants["off"].summary.tpot_mean_ms
    cost = CostModel(load_profile(PROFILE))
    decode_ms = per_token_ms(cost, 1, 0, 0.0)
    print(f"{'variant':12s}{'TPOT ms':>9s}{'cut':>7s}{'E tokens':>10s}{'predicted':>11s}{'tokens/step':>13s}"
          f"{'accept':>8s}")
    print(f"{'off':12s}{off:9.2f}")
    for k, a in SETTINGS:
        summary = result.variants[f"k{k}-a{a}"].summary
        spec = Speculation(num_speculative_tokens=k, acceptance_rates=(a,) * k, draft_cost_fraction=DRAFT_FRACTION)
        verify_ms = speculative_step_s(cost, _plan(1, k), spec)[0] * 1e3 - k * DRAFT_FRACTION * decode_ms
        predicted = expected_tokens(a, k) / (verify_ms / decode_ms + k * DRAFT_FRACTION)
        RECORD.setdefault("batch_one", {})[f"k{k}-a{a}"] = {
            "tpot_ms": summary.tpot_mean_ms, "tpot_off_ms": off, "cut": off / summary.tpot_mean_ms,
            "expected_tokens": expected_tokens(a, k), "predicted_cut": predicted}
        print(f"{f'k{k}-a{a}':12s}{summary.tpot_mean_ms:9.2f}{off / summary.tpot_mean_ms:7.2f}"
              f"{expected_tokens(a, k):10.2f}{predicted:11.2f}{summary.spec_tokens_per_step:13.2f}"
              f"{summary.spec_acceptance_rate:8.2f}")


def load_sweep() -> None:
    print("\n3. load sweep (simulated, 500 requests per point): TPOT p50 ms | output tok/s")
    settings = ((4, 0.7), (4, 0.5))
    variants: dict[str, dict[str, Any]] = {}
    for rps in RATES:
        variants[f"off@{rps}"] = {"workload.arrival.rate_rps": rps}
        for k, a in settings:
            variants[f"k{k}-a{a}@{rps}"] = {"workload.arrival.rate_rps": rps, **_spec(k, a)}
    result = run(_scenario(variants, num_requests=500))
    names = ["off", *(f"k{k}-a{a}" for k, a in settings)]
    print(f"{'rps':>5s}" + "".join(f"{n:>22s}" for n in names) + f"{'speedup (TPOT)':>30s}")
    crossover: dict[str, float | None] = {n: None for n in names[1:]}
    for rps in RATES:
        cells, ratios = [], []
        base = result.variants[f"off@{rps}"].summary
        for n in names:
            s = result.variants[f"{n}@{rps}"].summary
            cells.append(f"{s.tpot_p50_ms:10.1f} | {s.throughput_tok_s:7.0f}")
            if n != "off":
                ratios.append(f"{base.tpot_p50_ms / s.tpot_p50_ms:7.2f}")
                if crossover[n] is None and s.tpot_p50_ms >= base.tpot_p50_ms:
                    crossover[n] = rps
        print(f"{rps:5d}" + "".join(f"{c:>22s}" for c in cells) + f"{' '.join(ratios):>30s}")
    for n, load in crossover.items():
        where = f"{load} requests/s" if load is not None else f"beyond {RATES[-1]} requests/s"
        print(f"crossover load for {n}: {where}")
        RECORD.setdefault("crossover_rps", {})[n] = load
    tpot = {name: v.summary.tpot_p50_ms for name, v in result.variants.items()}
    top = RATES[-1]
    print(f"published (vLLM, draft model, Llama-3-70B 4xH100 ShareGPT; {PUBLISHED['source']}): "
          f"{PUBLISHED['low_load_speedup']}x faster at 1 request/s, {PUBLISHED['high_load_slowdown']}x slower at "
          "high load")
    RECORD["published"] = {**PUBLISHED, "simulated_low_load_speedup": tpot["off@1"] / tpot["k4-a0.7@1"],
                           "simulated_high_load_slowdown": tpot[f"k4-a0.5@{top}"] / tpot[f"off@{top}"]}
    print(f"simulated: k4 a0.7 {tpot['off@1'] / tpot['k4-a0.7@1']:.2f}x faster at 1 request/s; k4 a0.5 "
          f"{tpot[f'k4-a0.5@{top}'] / tpot[f'off@{top}']:.2f}x slower (TPOT p50) at {top} requests/s")


def engine_table() -> None:
    import torch

    from calibration.engine.configs import get_model
    from calibration.engine.engine import Engine
    from calibration.engine.speculative import acceptance_rates
    from simulator.core.config import SchedulerConfig

    torch.set_num_threads(1)  # steadier CPU timings on a shared machine
    print("\n4. real engine (CPU, model 'small' of 4 layers drafting for itself with its first layers, greedy, "
          "batch 1; random weights)")
    shape = get_model("small")
    print(f"{'k':>3s}{'draft layers':>14s}{'ms/token':>10s}{'cut':>7s}{'tokens/step':>13s}{'draft ms':>10s}"
          f"{'verify ms':>11s}  acceptance by position")
    base = 0.0
    for k, layers in ((0, 0), (2, 1), (2, 3), (4, 3)):
        spec = None if k == 0 else Speculation(num_speculative_tokens=k, acceptance_rates=(0.5,) * k)
        engine = Engine(shape, SchedulerConfig(num_blocks=256, block_size=16, speculation=spec), seed=0,
                        draft_layers=layers or None)
        engine.add_request(RequestSpec(0, 0.0, 64, 97))
        engine.step()  # the prompt
        start = time.perf_counter()
        while engine.has_work:
            engine.step()
        ms_per_token = (time.perf_counter() - start) * 1e3 / 96
        if k == 0:
            base = ms_per_token
            print(f"{k:3d}{'-':>14s}{ms_per_token:10.2f}")
            continue
        stats = engine.spec_stats
        per_step = 1 + sum(s.num_accepted_tokens for s in stats) / sum(s.num_rows for s in stats)
        draft_ms = 1e3 * sum(s.draft_s for s in stats) / len(stats)
        verify_ms = 1e3 * sum(s.verify_s for s in stats) / len(stats)
        rates = " ".join(f"{r:.2f}" for r in acceptance_rates(stats))
        RECORD.setdefault("engine", {})[f"k{k}-draft{layers}"] = {
            "ms_per_token": ms_per_token, "ms_per_token_off": base, "tokens_per_step": per_step,
            "draft_ms_per_step": draft_ms, "verify_ms_per_step": verify_ms,
            "acceptance_by_position": acceptance_rates(stats)}
        print(f"{k:3d}{layers:14d}{ms_per_token:10.2f}{base / ms_per_token:7.2f}{per_step:13.2f}{draft_ms:10.2f}"
              f"{verify_ms:11.2f}  {rates}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-engine", action="store_true", help="skip the real engine's table (torch)")
    parser.add_argument("--out", type=Path, help="also write what the tables found to this JSON file")
    parser.add_argument("--rates-out", type=Path,
                        help="write the engine's measured per-position acceptance (k 4, 3 draft layers) as a "
                             "table engine.speculative.acceptance_table reads")
    args = parser.parse_args()
    cost_table()
    batch_one()
    load_sweep()
    if not args.no_engine:
        engine_table()
    if args.rates_out is not None and "engine" in RECORD:
        measured = RECORD["engine"]["k4-draft3"]["acceptance_by_position"]
        # A position never reached (every earlier one rejected) has no rate: 0 keeps it unreached.
        table = {"acceptance_rates": [0.0 if math.isnan(r) else round(r, 4) for r in measured],
                 "source": "benchmarks/speculative.py: the engine's self-draft (3 of 4 layers of 'small', random "
                           "weights, greedy), k 4, batch 1, CPU"}
        args.rates_out.write_text(yaml.safe_dump(table, sort_keys=False))
    if args.out is not None:
        args.out.write_text(json.dumps(RECORD, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
