"""``fleetsim validate --endpoint``: bench a server, simulate the same requests with a profile, and state
the simulator's error per metric with a verdict.

The simulated replica runs the scenario's scheduler settings (start ``fleetsim serve --scenario`` with the
same file, or configure the server alike) with the profile given, and sees each request at the time the
bench actually sent it (``Workload.with_arrivals``). The error arithmetic and the verdict are
``calibration.fidelity`` / ``calibration.validate``'s; ``--repeat`` benches twice, and the server against
itself is the noise floor the verdict holds the simulator's error against. The run folder holds the
measured and the simulated run as variants of one result, so ``report.html`` shows them side by side.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibration.endpoint.bench import BenchOptions, BenchRun, bench_metrics, measured_variant, run_bench
from calibration.endpoint.report import run_result, save_bench
from calibration.endpoint.schedule import BenchWorkload
from calibration.fidelity import METRICS, relative_errors
from simulator.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointValidation:
    fidelity: dict[str, Any]
    folder: Path


def sent_arrivals(run: BenchRun, scheduled: np.ndarray) -> np.ndarray:
    """When each request reached the wire (its scheduled time if it was never sent), kept ascending."""
    sent = np.array([r.sent_s if not math.isnan(r.sent_s) else s for r, s in zip(run.records, scheduled, strict=True)])
    return np.maximum.accumulate(np.maximum(sent, 0.0))


def validate_endpoint(loaded: BenchWorkload, options: BenchOptions, *, out: Path, repeat: bool = False,
                      overwrite: bool = False) -> EndpointValidation:
    """Bench (twice with ``repeat``), simulate, compare, save."""
    from calibration.validate import CPU_TARGET, GPU_TARGET
    from simulator.scenario import client_path, resolve_replica, scenario_record
    from simulator.simulation import simulate

    scenario: Any = loaded.scenario
    if scenario is None:
        raise ConfigError("validate --endpoint needs --scenario (the simulated replica's settings)", field="scenario")
    setup = resolve_replica(scenario)
    profile = setup.profile
    client = client_path(scenario, [profile])
    if scenario.fleet.replicas != 1:
        raise ConfigError("validate --endpoint compares one server with one simulated replica: set fleet.replicas 1",
                          field="fleet.replicas")
    runs = {"measured": run_bench(loaded.requests, options)}
    measured = measured_variant(runs["measured"], slo=scenario.slo)
    workload = loaded.workload.with_arrivals(sent_arrivals(runs["measured"], loaded.workload.arrival_s))
    simulated = simulate(scenario, workload, name="simulated")
    variants = [measured, simulated]
    errors = relative_errors(measured.requests, simulated.requests)
    streaming = bench_metrics(runs["measured"])
    fidelity: dict[str, Any] = {
        "endpoint": options.base_url, "profile": profile.name, "profile_kind": profile.kind.value,
        "fidelity_target": CPU_TARGET if profile.hardware.upper() == "CPU" else GPU_TARGET,
        "num_requests": len(loaded.requests), "completed": streaming["completed"], "failed": streaming["failed"],
        **{m: errors[m] for m in METRICS}, "throughput_err": errors["throughput_err"],
        "realtime": {"source": "endpoint"},
        "streaming": {"mean_tokens_per_chunk": streaming["mean_tokens_per_chunk"],
                      "usage_reported": streaming["usage_reported"],
                      "network_latency_ms_simulated": client.latency_s * 1e3,
                      "flush_interval_ms_simulated": client.flush_interval_s * 1e3},
    }
    if repeat:
        runs["measured-repeat"] = run_bench(loaded.requests, options)
        again = measured_variant(runs["measured-repeat"], name="measured-repeat", slo=scenario.slo)
        variants.append(again)
        fidelity["repeat"] = {"engine_vs_engine": relative_errors(measured.requests, again.requests),
                              "sim_vs_engine": relative_errors(again.requests, simulated.requests)}
    result = run_result(f"validate-{scenario.name}", variants, {v.name: scenario_record(scenario) for v in variants})
    folder = save_bench(result, runs, out, overwrite=overwrite)
    (folder / "fidelity.json").write_text(json.dumps(_finite(fidelity), indent=2) + "\n", encoding="utf-8")
    return EndpointValidation(fidelity=fidelity, folder=folder)


def print_validation(v: EndpointValidation) -> None:
    from calibration.validate import print_error_table, print_errors, verdict

    f = v.fidelity
    print(f"validation of {f['profile']} against {f['endpoint']}: {f['completed']} of {f['num_requests']} "
          f"requests completed ({f['failed']} failed); tokens per SSE chunk "
          f"{f['streaming']['mean_tokens_per_chunk'] or float('nan'):.2f}")
    print_error_table(f, "measured")
    rep = f.get("repeat")
    if rep is not None:
        print("noise floor, the server's second run against its first (same requests):")
        print_errors(rep["engine_vs_engine"])
    print(verdict(f).replace("of the engine", "of the endpoint"))
    print(f"report: {v.folder / 'report.html'}")


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return _finite(value.item())
    return value
