"""Re-score a recorded validation: the engine's side of a ``fleetsim validate`` run (its ``requests.csv``,
``fidelity.json`` and step CSVs) against the simulator run again with another profile, on any machine.

A GPU is lent rarely and briefly; a replay it recorded stays true of the engine it ran. When a profile is
refitted (a term added to the model form, host terms measured again), this says how the simulator with the
new profile tracks that same recorded replay: TTFT/TPOT/E2E percentile errors against the engine's real-time
run (and its repeat, the noise floor, when recorded), and the per-step device and cycle errors of the cost
model on every recorded engine step. No torch, no device.

    python -m calibration.rescore calibration/measured/h200-llama-3-8b-tp1-validation-2026-12-04 \
        --profile h200-llama-3-8b-tp1-measured
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fidelity import METRICS, PERCENTILES, per_step_errors, relative_errors
from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import load_profile, resolve_profile_path
from simulator.errors import ConfigError
from simulator.results.request_log import RequestLog
from simulator.workload.workload import Workload

STEP_FILES: tuple[str, ...] = ("lockstep_steps", "realtime_steps", "realtime_repeat_steps")
"""Step CSVs a validation writes (``.csv``, or gzipped ``.csv.gz`` as shipped), each rescored when present."""


def _read(recorded: Path, stem: str) -> pd.DataFrame | None:
    for name in (f"{stem}.csv", f"{stem}.csv.gz"):
        if (recorded / name).exists():
            try:
                return pd.read_csv(recorded / name)
            except (OSError, ValueError) as err:
                raise ConfigError(f"unreadable recorded file: {err}", file=recorded / name) from None
    return None


def engine_log(requests: pd.DataFrame) -> RequestLog:
    """The engine's request log as ``requests.csv`` recorded it (arrival, first token and finish times)."""
    needed = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s")
    missing = [c for c in needed if c not in requests.columns]
    if missing:
        raise ConfigError(f"requests.csv lacks columns: {', '.join(missing)}", field=missing[0])
    log = RequestLog(len(requests))
    columns = zip(requests["request_id"].tolist(), requests["arrival_s"].tolist(), requests["prompt_tokens"].tolist(),
                  requests["output_tokens"].tolist(), requests["first_token_s"].tolist(), requests["finish_s"].tolist(),
                  strict=True)
    for rid, arrival, prompt, output, first_token, finish in columns:
        log.on_arrival(int(rid), float(arrival), int(prompt), int(output), None)
        if not math.isnan(first_token):
            log.on_first_token(int(rid), float(first_token))
        if not math.isnan(finish):
            log.on_finish(int(rid), float(finish), 0, 0)
    return log


def simulated_log(recorded_fidelity: dict[str, Any], requests: pd.DataFrame, profile_name: str) -> RequestLog:
    """The simulator's request log of the recorded workload (its requests' arrivals and lengths, the recorded
    scheduler settings) with ``profile_name``: the one-replica scenario ``fleetsim validate`` builds."""
    from calibration.validate import ValidationOptions, build_scenario
    from simulator.simulation import simulate

    scheduler = recorded_fidelity["scheduler"]
    options = ValidationOptions(profile=profile_name, num_requests=len(requests),
                                max_num_seqs=int(scheduler["max_num_seqs"]),
                                max_num_batched_tokens=int(scheduler["max_num_batched_tokens"]),
                                num_blocks=int(scheduler["num_blocks"]))
    profile_path = resolve_profile_path(profile_name)
    profile = load_profile(profile_path)
    workload = Workload(arrival_s=requests["arrival_s"].to_numpy(dtype=np.float64),
                        prompt_tokens=requests["prompt_tokens"].to_numpy(dtype=np.int64),
                        output_tokens=requests["output_tokens"].to_numpy(dtype=np.int64),
                        block_size=int(scheduler["block_size"]))
    scenario = build_scenario(profile_path, profile, options, float(recorded_fidelity["rate_rps"]))
    return simulate(scenario, workload).requests


def step_errors(steps: pd.DataFrame, cost: CostModel) -> dict[str, Any]:
    """The cost model's per-step errors on recorded engine steps: device time, cycle time (device + host),
    and the device time of steps with and without prefill tokens apart."""
    fields = ("num_seqs", "num_new_tokens", "num_decode_seqs", "decode_context_sum", "num_prefill_tokens")
    b, n, d, ctx, p = (steps[name].astype(np.int64).tolist() for name in fields)
    pairs = steps["prefill_attention_pairs"].astype(np.float64).tolist()
    shapes = [StepShape(*row) for row in zip(b, n, d, ctx, p, pairs, strict=True)]
    device = [cost.device_time(s) for s in shapes]
    cycle = [cost.step_time(s) for s in shapes]
    prefill = (steps["num_prefill_tokens"] > 0).tolist()
    measured_device: list[float] = steps["device_s"].astype(np.float64).tolist()
    out: dict[str, Any] = {
        "steps": len(steps),
        "per_step_device": per_step_errors(device, measured_device),
        "per_step_cycle": per_step_errors(cycle, steps["cycle_s"].astype(np.float64).tolist()),
    }
    for label, want in (("decode_device", False), ("prefill_device", True)):
        rows = [i for i, is_prefill in enumerate(prefill) if is_prefill == want]
        if rows:
            out[label] = per_step_errors([device[i] for i in rows], [measured_device[i] for i in rows])
    return out


def rescore(recorded: str | Path, profile_name: str) -> dict[str, Any]:
    """The recorded validation's engine against the simulator with ``profile_name``: percentile errors
    against the real-time run (``sim_vs_engine``), the recorded noise floor when there is one, and per-step
    errors on each recorded step file."""
    recorded = Path(recorded)
    fidelity_path = recorded / "fidelity.json"
    try:
        recorded_fidelity = json.loads(fidelity_path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"not a recorded validation: {err}", file=fidelity_path) from None
    requests = _read(recorded, "requests")
    if requests is None:
        raise ConfigError("not a recorded validation: no requests.csv", file=recorded)
    engine = engine_log(requests)
    simulated = simulated_log(recorded_fidelity, requests, profile_name)
    cost = CostModel(load_profile(profile_name))
    result: dict[str, Any] = {
        "recorded": str(recorded),
        "recorded_profile": recorded_fidelity.get("profile"),
        "profile": profile_name,
        "num_requests": len(requests),
        "rate_rps": recorded_fidelity["rate_rps"],
        "sim_vs_engine": relative_errors(engine, simulated),
    }
    repeat = recorded_fidelity.get("repeat")
    if repeat is not None:
        result["engine_vs_engine"] = repeat["engine_vs_engine"]
    for stem in STEP_FILES:
        steps = _read(recorded, stem)
        if steps is not None:
            result[stem] = step_errors(steps, cost)
    return result


def print_rescore(result: dict[str, Any]) -> None:
    print(f"recorded validation {result['recorded']} (engine replayed with {result['recorded_profile']}), "
          f"{result['num_requests']} requests at {result['rate_rps']:.2f} req/s; simulator with {result['profile']}")
    print("metric     " + "".join(f"p{q} err   ".rjust(10) for q in PERCENTILES)
          + "   engine noise floor (p50/p90/p99)")
    errors, floor = result["sim_vs_engine"], result.get("engine_vs_engine")
    for metric in METRICS:
        row = "".join(f"{errors[metric][f'p{q}_err']:+9.2%} " for q in PERCENTILES)
        noise = "/".join(f"{floor[metric][f'p{q}_err']:+.1%}" for q in PERCENTILES) if floor else "-"
        print(f"{metric:8s} {row}   {noise}")
    print(f"throughput err {errors['throughput_err']:+.2%}")
    for stem in STEP_FILES:
        steps = result.get(stem)
        if steps is None:
            continue
        keys = [key for key in ("per_step_device", "decode_device", "prefill_device", "per_step_cycle") if key in steps]
        parts = [f"{key.removeprefix('per_step_')} MAPE {steps[key]['mape']:.1%} "
                 f"(total {steps[key]['total_time_err']:+.1%})" for key in keys]
        print(f"{stem} ({steps['steps']} steps): " + ", ".join(parts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("recorded", type=Path, help="a validation's --out folder (fidelity.json, requests.csv, ...)")
    parser.add_argument("--profile", required=True, help="profile the simulator runs (path or shipped name)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    try:
        result = rescore(args.recorded, args.profile)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_rescore(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
