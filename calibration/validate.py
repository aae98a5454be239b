"""Validation: one workload on the real engine and in the simulator with the fitted profile, compared.

Both sides run the same ``simulator.core.Scheduler`` with the same ``SchedulerConfig`` and the same
RequestSpecs, on one replica; so the only thing that can differ is time — the cost model's error.

Two modes:

- ``realtime``: requests enter the engine at their arrival times on the wall clock (checked at every step
  boundary, as a serving loop does); TTFT/TPOT/E2E come from the engine's token timestamps. The
  simulator replays the same specs through ``simulator.fleet.fleet.simulate``. Decisions match step for step
  as long as both see each arrival at the same step boundary, so the share of identical steps is
  reported (not asserted: a 5 % slower step can move an arrival across a boundary).
- ``lockstep``: deterministic. The engine is driven on a virtual clock that advances by the profile's
  predicted step time, exactly as a simulated replica's clock does, so each arrival is fed to both at the
  same step index; step compositions must then be identical, and they are checked. The engine still
  measures every step, which gives the per-step error of the cost model on a real step sequence.

Outputs: ``fidelity.json`` (p50/p90/p99 relative errors of TTFT, TPOT, E2E, throughput error; per-step
errors; identical-step shares), ``fidelity.html`` (CDFs, engine vs simulator) and per-request and
per-step CSVs.

This module resolves what is replayed (options, workload, scenario), runs each mode and writes and prints
the report; the replay loops are calibration/replay.py, the error arithmetic calibration/fidelity.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from calibration.fidelity import (
    METRICS,
    figure_cdfs,
    per_step_errors,
    relative_errors,
    step_agreement,
    throughput_tok_s,
)
from calibration.replay import EngineRun, run_engine_lockstep, run_engine_realtime, simulate_recorded
from simulator.core.config import SchedulerConfig
from simulator.core.request import RequestSpec
from simulator.core.step import StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import Profile, load_profile
from simulator.errors import ConfigError
from simulator.results.request_log import RequestLog
from simulator.workload.workload import Workload

Mode = Literal["realtime", "lockstep", "both"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationOptions:
    """What to replay and how."""

    profile: str
    """Measured profile (path or shipped name)."""
    model: str | None = None
    """Engine model; default the profile's."""
    num_requests: int = 200
    rate_rps: float | None = None
    """Mean arrival rate; None = ``default_rate`` (a moderate load by the profile)."""
    trace: str = "${traces}/azure_llm_2023_conv.csv"
    """Azure-format trace whose arrival pattern and length mix are replayed (lengths scaled)."""
    prompt_scale: float = 0.25
    output_scale: float = 0.25
    max_prompt_tokens: int = 1024
    max_output_tokens: int = 128
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    mode: Mode = "both"
    threads: int | None = 1
    """torch CPU threads (as the profile was measured)."""
    seed: int = 0
    device: str = "cpu"
    num_blocks: int | None = None
    """KV pool override (blocks); None = the profile's KV capacity."""
    repeat_realtime: bool = False
    """Replay the real-time run a second time on a fresh engine: how far the engine differs from itself on
    the same workload is the host's noise floor, the yardstick for the simulator's error."""


# ----- workload ----------------------------------------------------------------------------------------


def scaled_trace_workload(options: ValidationOptions, *, block_size: int, rate_rps: float) -> Workload:
    """The trace's first ``num_requests`` rows at ``rate_rps``, lengths scaled so a CPU engine keeps up."""
    from simulator.workload.config import TraceConfig, WorkloadConfig
    from simulator.workload.generate import generate

    config = WorkloadConfig(
        num_requests=options.num_requests,
        trace=TraceConfig(format="azure", path=options.trace, rate_rps=rate_rps),  # type: ignore[arg-type]
    )
    base = generate(config, seed=options.seed, block_size=block_size)
    prompt = np.clip(np.rint(base.prompt_tokens * options.prompt_scale), 1, options.max_prompt_tokens)
    output = np.clip(np.rint(base.output_tokens * options.output_scale), 1, options.max_output_tokens)
    return Workload(arrival_s=base.arrival_s, prompt_tokens=prompt.astype(np.int64),
                    output_tokens=output.astype(np.int64), block_size=block_size)


def trace_shape(options: ValidationOptions) -> tuple[float, float]:
    """Mean prompt and output tokens of the scaled trace rows that will be replayed."""
    from simulator.workload.traces import load_trace

    rows = load_trace("azure", options.trace, max_rows=options.num_requests)
    prompt = np.clip(np.rint(np.maximum(rows.prompt_tokens, 1) * options.prompt_scale), 1, options.max_prompt_tokens)
    output = np.clip(np.rint(np.maximum(rows.output_tokens, 1) * options.output_scale), 1, options.max_output_tokens)
    return float(prompt.mean()), float(output.mean())


DEFAULT_UTILISATION = 0.35
"""Target busy share of the default arrival rate. The estimate below prices decode steps at half the batch
limit; at moderate load batches are smaller (measured on CPU: most steps decode 1–4 requests), so the real
busy share runs about twice the estimate. A replica near saturation turns small step errors into large
queueing errors at the tail, which measures the queue, not the cost model."""


def default_rate(profile: Profile, options: ValidationOptions, *, utilisation: float = DEFAULT_UTILISATION) -> float:
    """Requests/s at which one replica is about ``utilisation`` busy, by the profile: per request, one
    prefill of the mean prompt plus its share of decode steps at half the batch limit."""
    cost = CostModel(profile)
    prompt, output = trace_shape(options)
    batch = max(1, options.max_num_seqs // 2)
    ctx = int(prompt + output / 2)
    chunk = min(int(prompt), options.max_num_batched_tokens)
    prefill = cost.step_time(StepShape(1, chunk, 0, 0, chunk, chunk * chunk / 2)) * max(1.0, prompt / chunk)
    decode = cost.step_time(StepShape(batch, batch, batch, batch * ctx, 0, 0.0)) / batch
    return utilisation / (prefill + output * decode)


# ----- scenario and scheduler config shared by both sides ---------------------------------------------


def build_scenario(profile_path: Path, profile: Profile, options: ValidationOptions, rate_rps: float) -> Any:
    """A one-replica scenario for the simulator with the engine settings the engine will run."""
    from simulator.scenario import load_mapping

    engine: dict[str, Any] = {
        "batching": "chunked",
        "max_num_seqs": options.max_num_seqs,
        "max_num_batched_tokens": options.max_num_batched_tokens,
        "prefix_caching": False,  # the replayed trace has no shared prefixes; keep both sides free of them
        "kv": {"block_size": 16, "preemption": "recompute", "policy": "paged"},
    }
    if options.num_blocks is not None:
        engine["kv"]["num_blocks"] = options.num_blocks
    raw = {
        "schema_version": 1,
        "name": "validate",
        "seed": options.seed,
        "workload": {
            "num_requests": options.num_requests,
            "trace": {"format": "azure", "path": options.trace, "rate_rps": rate_rps},
        },
        "fleet": {"replicas": 1, "hardware": profile.hardware, "model": profile.model, "tp": profile.tp,
                  "profile": str(profile_path)},
        "engine": engine,
        "simulation": {"fast_path": True},
    }
    return load_mapping(raw).scenario

# ----- the engine ----------------------------------------------------------------------------------------


def _make_engine(profile: Profile, config: SchedulerConfig, options: ValidationOptions) -> Any:
    import torch

    from calibration.engine.configs import get_model
    from calibration.engine.engine import Engine

    if options.threads and not options.device.startswith("cuda"):
        torch.set_num_threads(options.threads)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    model = options.model or profile.model
    cuda = options.device.startswith("cuda")
    # Decode through CUDA graphs exactly when the profile was measured with them (it lists their batches):
    # the engine replayed must be the engine measured.
    return Engine(get_model(model, profile.tp), config, device=options.device, dtype=dtypes[profile.dtype],
                  backend="triton_paged" if cuda else "sdpa_gather", seed=options.seed,
                  cuda_graphs=cuda and bool(profile.cuda_graph_batch_sizes))


def _prompts(specs: Sequence[RequestSpec], vocab_size: int, seed: int) -> list[list[int]]:
    """Prompt ids made before the clock starts, so the serving loop does not pay for them."""
    from calibration.engine.engine import pseudo_prompt

    return [pseudo_prompt(s.request_id, s.prompt_tokens, vocab_size, seed) for s in specs]


def _warm_up(engine: Any) -> None:
    """One throwaway prefill + decode on a scratch engine state (allocator, first-call costs)."""
    seqs_ids = engine.runner.shape.vocab_size - 1
    from calibration.engine.attention import ScheduledSeq

    blocks = tuple(range(min(4, engine.runner.num_blocks)))
    n = min(32, len(blocks) * engine.runner.block_size)
    for _ in range(3):
        engine.runner.execute([ScheduledSeq(num_new_tokens=n, num_computed_tokens=0, block_table=blocks)],
                              [seqs_ids] * n)
        engine.runner.execute([ScheduledSeq(num_new_tokens=1, num_computed_tokens=n - 1, block_table=blocks)],
                              [seqs_ids])


# ----- the modes ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ValidationSetup:
    """What both sides replay, resolved from the options before either runs."""

    options: ValidationOptions
    profile_path: Path
    profile: Profile
    rate_rps: float
    """Mean arrival rate replayed (the options' or ``default_rate``)."""
    scenario: Any
    """The simulator's one-replica scenario (``build_scenario``)."""
    config: SchedulerConfig
    """The scheduler config both sides run: the scenario's replica's."""
    workload: Workload
    specs: list[RequestSpec]
    cost: CostModel
    """The profile's cost model (lockstep's clock and the predicted step times)."""
    out: Path
    """Folder the report is written to."""

    def fresh_engine(self, previous: Any = None) -> Any:
        """A new engine (empty KV pool and queues), warmed up, its CUDA graphs captured; ``previous``, the
        engine it replaces, gives its device memory back first (two pools of the profile's capacity do not
        fit on one GPU)."""
        if previous is not None:
            previous.runner.release()
        engine = _make_engine(self.profile, self.config, self.options)
        _warm_up(engine)
        # A graph captured on first use would put its capture into the timed step that needed it.
        engine.runner.capture_graphs_upto(self.config.max_num_seqs,
                                          self.options.max_prompt_tokens + self.options.max_output_tokens)
        return engine


def prepare(options: ValidationOptions, out_dir: str | Path) -> ValidationSetup:
    """Load the measured profile and derive the rate, scenario, scheduler config and workload from it."""
    from simulator.cost.profile import resolve_profile_path
    from simulator.scenario import resolve_replica

    profile_path = resolve_profile_path(options.profile)
    profile = load_profile(profile_path)
    if not profile.is_measured:
        raise ConfigError(f"{profile.name} is analytic: validation compares a measured profile with its engine",
                          field="profile")
    rate = options.rate_rps or default_rate(profile, options)
    scenario = build_scenario(profile_path, profile, options, rate)
    config = resolve_replica(scenario).scheduler
    workload = scaled_trace_workload(options, block_size=config.block_size, rate_rps=rate)
    specs = workload.specs()
    cost = CostModel(profile)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return ValidationSetup(options=options, profile_path=profile_path, profile=profile, rate_rps=rate,
                           scenario=scenario, config=config, workload=workload, specs=specs, cost=cost, out=out)


def validate(options: ValidationOptions, *, out_dir: str | Path, progress: bool = True) -> ValidationReport:
    """Replay one workload on the engine and in the simulator; write fidelity.json, fidelity.html and
    per-request / per-step CSVs to ``out_dir``."""
    setup = prepare(options, out_dir)
    fidelity = _workload_summary(setup)
    files: list[Path] = []
    engine = setup.fresh_engine()
    prompts = _prompts(setup.specs, engine.shape.vocab_size, options.seed)
    if options.mode in ("lockstep", "both"):
        fidelity["lockstep"], steps_csv = compare_lockstep(setup, engine, prompts, progress=progress)
        files.append(steps_csv)
        engine = setup.fresh_engine(engine)  # fresh KV pool and queues for the next mode
    if options.mode in ("realtime", "both"):
        realtime, realtime_files = compare_realtime(setup, engine, prompts, progress=progress)
        fidelity.update(realtime)
        files.extend(realtime_files)
    path = setup.out / "fidelity.json"
    path.write_text(json.dumps(_json_safe(fidelity), indent=2) + "\n")
    files.append(path)
    return ValidationReport(fidelity=fidelity, out_dir=setup.out, files=files)


GPU_TARGET = 0.05
"""Simulated vs real p50 and p99 TTFT, TPOT and E2E within 5 % on a GPU (DESIGN §8)."""
CPU_TARGET = 0.10
"""... and within 10 % on a CPU, whose timings drift more from one minute to the next."""


def verdict(fidelity: dict[str, Any]) -> str:
    """One line: whether the real-time replay meets the fidelity target, and if not, which figures miss it
    and whether the engine's own noise floor (``--repeat``) misses it there too."""
    target = fidelity.get("fidelity_target", CPU_TARGET)
    if "realtime" not in fidelity:
        return "verdict: no real-time replay (lockstep only): latency fidelity not judged"
    misses = [f"{m} {q} {fidelity[m][f'{q}_err']:+.1%}" for m in METRICS for q in ("p50", "p99")
              if abs(fidelity[m][f"{q}_err"]) > target]
    if not misses:
        return f"verdict: PASS: p50 and p99 TTFT, TPOT and E2E within {target:.0%} of the engine"
    text = f"verdict: FAIL: outside {target:.0%}: {', '.join(misses)}"
    floor = fidelity.get("repeat", {}).get("engine_vs_engine")
    if floor is not None:
        noisy = [f"{m} {q}" for m in METRICS for q in ("p50", "p99") if abs(floor[m][f"{q}_err"]) > target]
        if noisy:
            text += f" (the engine against itself also misses it at {', '.join(noisy)}: host noise)"
    else:
        text += " (run with --repeat to see the host's own noise floor)"
    return text


def _workload_summary(setup: ValidationSetup) -> dict[str, Any]:
    """The head of fidelity.json: the profile, the workload replayed and the scheduler limits."""
    profile, workload, config = setup.profile, setup.workload, setup.config
    return {
        "profile": profile.name,
        "profile_mape": profile.fit_error.mape if profile.fit_error else None,
        "fidelity_target": CPU_TARGET if profile.hardware.upper() == "CPU" else GPU_TARGET,
        "num_requests": len(setup.specs),
        "rate_rps": setup.rate_rps,
        "mean_prompt_tokens": float(workload.prompt_tokens.mean()),
        "mean_output_tokens": float(workload.output_tokens.mean()),
        "scheduler": {"max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
                      "num_blocks": config.num_blocks, "block_size": config.block_size},
    }


def compare_lockstep(setup: ValidationSetup, engine: Any, prompts: Sequence[Sequence[int]], *,
                     progress: bool) -> tuple[dict[str, Any], Path]:
    """The lockstep run against the simulator's recorded steps: whether every decision is the same, and the
    cost model's per-step error on the engine's real step sequence; with its per-step CSV."""
    lock = run_engine_lockstep(engine, setup.specs, prompts, setup.cost, progress=progress)
    sim_steps = simulate_recorded(setup.config, setup.cost, setup.specs)
    agreement = step_agreement(lock.steps, sim_steps)
    admitted_same = all(lock.admitted_at_step.get(s.request_id) is not None for s in setup.specs)
    lockstep = {
        **agreement,
        "identical": agreement["identical_share"] == 1.0 and agreement["engine_steps"] == agreement["sim_steps"],
        "all_admitted": admitted_same,
        "per_step_cycle": per_step_errors(lock.predicted_s, lock.cycle_s),
        "per_step_cpu": per_step_errors(lock.predicted_s, lock.cpu_s),
        "per_step_device": per_step_errors(
            [CostModel(setup.profile).device_time(s) for s in lock.step_shapes], lock.device_s
        ),
    }
    return lockstep, _steps_csv(setup.out / "lockstep_steps.csv", lock)


def compare_realtime(setup: ValidationSetup, engine: Any, prompts: Sequence[Sequence[int]], *,
                     progress: bool) -> tuple[dict[str, Any], list[Path]]:
    """The real-time run against the simulator (latency percentiles, step agreement, host contention), then
    optionally a second run (the noise floor), then the host's drift since calibration; with the files."""
    from calibration.drift import plan_probe

    drift_plan = plan_probe(setup.profile_path, engine.runner, vocab_size=engine.shape.vocab_size)
    probes = [drift_plan.measure(engine.runner)] if drift_plan is not None else []
    real = run_engine_realtime(engine, setup.specs, prompts, progress=progress)
    if drift_plan is not None:
        probes.append(drift_plan.measure(engine.runner))
    simulated = _simulate(setup)
    fidelity = _realtime_errors(setup, real, simulated)
    files = _realtime_files(setup, real, simulated)
    if setup.options.repeat_realtime:
        engine = setup.fresh_engine(engine)
        again = run_engine_realtime(engine, setup.specs, prompts, progress=progress)
        if drift_plan is not None:
            probes.append(drift_plan.measure(engine.runner))
        fidelity["repeat"] = {
            "engine_vs_engine": relative_errors(real.log, again.log),
            "sim_vs_engine": relative_errors(again.log, simulated),
            "per_step_cycle": per_step_errors([setup.cost.step_time(s) for s in again.step_shapes], again.cycle_s),
            "engine_wall_s": again.wall_s,
        }
        files.append(_steps_csv(setup.out / "realtime_repeat_steps.csv", again))
    if probes:
        # The host's speed change since calibration, measured outside the replay (calibration.drift).
        # The headline errors above keep the profile as it is; this is what remains with the
        # simulator's clock scaled by that change: the part of the error that is the cost model's shape.
        speed = float(np.mean([p.speed_ratio for p in probes]))
        fidelity["host_drift"] = {
            "speed_ratio": speed,
            "probes": [p.as_dict() for p in probes],
            "adjusted": relative_errors(real.log, _simulate(setup, cost_factor=speed)),
        }
    return fidelity, files


def _simulate(setup: ValidationSetup, *, cost_factor: float | None = None) -> RequestLog:
    """The simulator's request log of the workload; ``cost_factor`` stretches every step's time."""
    from simulator.simulation import simulate

    scenario = setup.scenario
    if cost_factor is not None:
        scenario = scenario.model_copy(update={
            "simulation": scenario.simulation.model_copy(update={"cost_factor": cost_factor})})
    return simulate(scenario, setup.workload).requests


def _realtime_errors(setup: ValidationSetup, real: EngineRun, simulated: RequestLog) -> dict[str, Any]:
    """Latency and throughput errors of the simulator against the real-time run, its step agreement and
    per-step errors, and the same errors once the host's contention is taken out."""
    cost = setup.cost
    sim_steps = simulate_recorded(setup.config, cost, setup.specs)
    errors = relative_errors(real.log, simulated)
    fidelity: dict[str, Any] = {m: errors[m] for m in METRICS}
    fidelity["throughput_err"] = errors["throughput_err"]
    fidelity["realtime"] = {
        **step_agreement(real.steps, sim_steps),
        "per_step_cycle": per_step_errors([cost.step_time(s) for s in real.step_shapes], real.cycle_s),
        "per_step_cpu": per_step_errors([cost.step_time(s) for s in real.step_shapes], real.cpu_s),
        "engine_wall_s": real.wall_s,
        "engine_throughput_tok_s": throughput_tok_s(real.log),
        "sim_throughput_tok_s": throughput_tok_s(simulated),
    }
    # The profile is on the quiet-machine clock (thread CPU time on CPU); other processes stretch the
    # engine's wall clock. The same simulation with every step stretched by the engine's own median
    # wall/CPU ratio separates that from cost-model error (labelled: it borrows a figure from the engine).
    stretch = float(np.median(np.asarray(real.cycle_s) / np.maximum(np.asarray(real.cpu_s), 1e-9)))
    stretched = _simulate(setup, cost_factor=stretch)
    fidelity["host_contention_adjusted"] = {"wall_over_cpu": stretch, **relative_errors(real.log, stretched)}
    return fidelity


def _realtime_files(setup: ValidationSetup, real: EngineRun, simulated: RequestLog) -> list[Path]:
    """The real-time run's per-step CSV, its per-request CSV (engine and simulator side by side) and the
    CDF figure."""
    from calibration.fit import save_figure

    out = setup.out
    files = [_steps_csv(out / "realtime_steps.csv", real)]
    requests = real.log.to_frame().merge(
        simulated.to_frame()[["request_id", "ttft_ms", "tpot_ms", "e2e_ms"]],
        on="request_id", suffixes=("_engine", "_sim"),
    )
    path = out / "requests.csv"
    requests.to_csv(path, index=False)
    files.append(path)
    title = f"{setup.profile.name}: engine vs simulator, {len(setup.specs)} requests at {setup.rate_rps:.2f} req/s"
    files.append(save_figure(figure_cdfs(real.log, simulated, title=title), out / "fidelity.html"))
    return files


# ----- report ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ValidationReport:
    fidelity: dict[str, Any]
    """Contents of fidelity.json."""
    out_dir: Path
    files: list[Path]


def _steps_csv(path: Path, run: EngineRun) -> Path:
    frame = pd.DataFrame(
        {
            "step": np.arange(len(run.steps)),
            "num_seqs": [s.num_seqs for s in run.step_shapes],
            "num_new_tokens": [s.num_new_tokens for s in run.step_shapes],
            "num_decode_seqs": [s.num_decode_seqs for s in run.step_shapes],
            "decode_context_sum": [s.decode_context_sum for s in run.step_shapes],
            "num_prefill_tokens": [s.num_prefill_tokens for s in run.step_shapes],
            "prefill_attention_pairs": [s.prefill_attention_pairs for s in run.step_shapes],
            "device_s": run.device_s,
            "cycle_s": run.cycle_s,
            "cpu_s": run.cpu_s,
        }
    )
    if run.predicted_s:
        frame["predicted_s"] = run.predicted_s
    frame.to_csv(path, index=False)
    return path


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value


def print_report(report: ValidationReport) -> None:
    f = report.fidelity
    print(f"validation of {f['profile']} (fit MAPE {f['profile_mape']:.2%}): {f['num_requests']} requests at "
          f"{f['rate_rps']:.2f} req/s, mean prompt {f['mean_prompt_tokens']:.0f} / output "
          f"{f['mean_output_tokens']:.0f} tokens")
    if "lockstep" in f:
        lock = f["lockstep"]
        print(f"lockstep: {lock['engine_steps']} engine steps, {lock['sim_steps']} simulated; identical share "
              f"{lock['identical_share']:.3f} ({'IDENTICAL' if lock['identical'] else 'DIFFERENT'}); per-step "
              f"cycle-time MAPE {lock['per_step_cycle']['mape']:.2%} (wall), {lock['per_step_cpu']['mape']:.2%} "
              f"(thread CPU); total {lock['per_step_cycle']['total_time_err']:+.2%} (wall), "
              f"{lock['per_step_cpu']['total_time_err']:+.2%} (thread CPU)")
    if "realtime" in f:
        rt = f["realtime"]
        print(f"realtime: identical steps {rt['identical_share']:.3f} ({rt['engine_steps']} engine, "
              f"{rt['sim_steps']} simulated); per-step cycle MAPE {rt['per_step_cycle']['mape']:.2%} (wall), "
              f"{rt['per_step_cpu']['mape']:.2%} (thread CPU)")
        print_error_table(f, "engine")
        adj = f.get("host_contention_adjusted")
        if adj is not None:
            print(f"with steps stretched by the engine's wall/CPU ratio {adj['wall_over_cpu']:.2f}: "
                  + "  ".join(f"{m} p50 {adj[m]['p50_err']:+.1%} p99 {adj[m]['p99_err']:+.1%}" for m in METRICS)
                  + f"  throughput {adj['throughput_err']:+.1%}")
    drift = f.get("host_drift")
    if drift is not None:
        ratios = ", ".join(f"{p['speed_ratio']:.3f}" for p in drift["probes"])
        print(f"host drift: the profile's grid points re-timed now take x{drift['speed_ratio']:.3f} their "
              f"calibration time (probes {ratios}); the simulator with its clock scaled by that:")
        print_errors(drift["adjusted"])
    rep = f.get("repeat")
    if rep is not None:
        print("noise floor, the engine's second real-time run against its first (same workload):")
        print_errors(rep["engine_vs_engine"])
        print("the simulator against that second run:")
        print_errors(rep["sim_vs_engine"])
    print(verdict(f))
    for path in report.files:
        print(f"wrote {path}")


def print_error_table(f: dict[str, Any], measured: str) -> None:
    """Each metric's p50/p90/p99 error with the ``measured`` side's and the simulator's p50/p99, then the
    throughput error (a fidelity record's figures)."""
    print(f"{'metric':8s} {'p50 err':>9s} {'p90 err':>9s} {'p99 err':>9s}   {measured} p50/p99 ms   sim p50/p99 ms")
    for metric in METRICS:
        m = f[metric]
        print(f"{metric:8s} {m['p50_err']:+9.2%} {m['p90_err']:+9.2%} {m['p99_err']:+9.2%}   "
              f"{m['p50_engine_ms']:8.1f}/{m['p99_engine_ms']:8.1f}   {m['p50_sim_ms']:8.1f}/{m['p99_sim_ms']:8.1f}")
    print(f"throughput err {f['throughput_err']:+.2%}")


def print_errors(errors: dict[str, Any]) -> None:
    """Errors per metric at p50/p90/p99 and of throughput, indented (a noise floor, an adjusted view)."""
    for metric in METRICS:
        m = errors[metric]
        print(f"  {metric:6s} p50 {m['p50_err']:+7.2%}  p90 {m['p90_err']:+7.2%}  p99 {m['p99_err']:+7.2%}")
    print(f"  throughput {errors['throughput_err']:+.2%}")
