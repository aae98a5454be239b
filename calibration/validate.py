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
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from simulator.core.config import SchedulerConfig
from simulator.core.request import RequestSpec, RequestStatus
from simulator.core.step import StepPlan, StepShape
from simulator.cost.cost_model import CostModel
from simulator.cost.profile import Profile, load_profile
from simulator.errors import ConfigError
from simulator.results.metrics import RequestLog
from simulator.workload.workload import Workload

Mode = Literal["realtime", "lockstep", "both"]
METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
PERCENTILES: tuple[int, ...] = (50, 90, 99)

Composition = tuple[tuple[int, int], ...]
"""One step as (request id, new tokens) per scheduled request, in plan order."""


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
    from simulator.workload.workload import TraceConfig, WorkloadConfig, generate

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


# ----- the engine side ---------------------------------------------------------------------------------


@dataclass(slots=True)
class EngineRun:
    """What the engine did: per-request log, step compositions and per-step times."""

    log: RequestLog
    steps: list[Composition]
    step_shapes: list[StepShape]
    device_s: list[float]
    cycle_s: list[float]
    cpu_s: list[float] = field(default_factory=list)
    """Thread CPU time of each ``engine.step()`` (the profile's clock on CPU with one torch thread)."""
    predicted_s: list[float] = field(default_factory=list)
    """Cost model's step time of each step (lockstep mode)."""
    admitted_at_step: dict[int, int] = field(default_factory=dict)
    """Step index before which each request was handed to the engine."""
    wall_s: float = 0.0


def _composition(request_ids: Sequence[int], num_new: Sequence[int]) -> Composition:
    return tuple(zip(request_ids, num_new, strict=True))


def _make_engine(profile: Profile, config: SchedulerConfig, options: ValidationOptions) -> Any:
    import torch

    from calibration.engine.configs import get_model
    from calibration.engine.engine import Engine

    if options.threads and not options.device.startswith("cuda"):
        torch.set_num_threads(options.threads)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    model = options.model or profile.model
    return Engine(get_model(model, profile.tp), config, device=options.device, dtype=dtypes[profile.dtype],
                  backend="sdpa_gather" if not options.device.startswith("cuda") else "triton_paged",
                  seed=options.seed)


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


class _WallClock:
    """Real time: arrivals wait on the wall clock; tokens are stamped by the engine as they appear."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.t0 = engine.now()

    def now(self) -> float:
        return self._engine.now() - self.t0

    def idle_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now()))

    def account(self, run: EngineRun, record: Any, cpu_s: float) -> None:
        _account(run, record, self.t0, cpu_s)


class _VirtualClock:
    """Lockstep: a clock advanced by the cost model's time of each step the engine runs, as a simulated
    replica's would be; the engine's own times are recorded but decide nothing."""

    def __init__(self, cost: CostModel) -> None:
        self._cost = cost
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def idle_until(self, t: float) -> None:
        self._t = max(self._t, t)  # idle: the replica sleeps until the next arrival

    def account(self, run: EngineRun, record: Any, cpu_s: float) -> None:
        step_s = self._cost.step_time(record.shape)
        self._t += step_s
        run.predicted_s.append(step_s)
        _account(run, record, None, cpu_s, virtual_end_s=self._t)


def run_engine_realtime(engine: Any, specs: Sequence[RequestSpec], prompts: Sequence[Sequence[int]],
                        *, progress: bool = True) -> EngineRun:
    """Serve ``specs`` on the wall clock: each request is added at the first step boundary at or after
    its arrival time; while idle the loop sleeps until the next arrival."""
    return _serve(engine, specs, prompts, _WallClock(engine), desc="engine (real time)", progress=progress)


def run_engine_lockstep(engine: Any, specs: Sequence[RequestSpec], prompts: Sequence[Sequence[int]],
                        cost: CostModel, *, progress: bool = True) -> EngineRun:
    """Serve ``specs`` on a virtual clock advanced by ``cost`` per step: a request is added at the step
    boundary where a simulated replica would see it. Deterministic; times are measured but not used
    for decisions."""
    return _serve(engine, specs, prompts, _VirtualClock(cost), desc="engine (lockstep)", progress=progress)


def _serve(engine: Any, specs: Sequence[RequestSpec], prompts: Sequence[Sequence[int]],
           clock: _WallClock | _VirtualClock, *, desc: str, progress: bool) -> EngineRun:
    """The replay loop both modes share: hand over arrivals at each step boundary, step the engine, and
    let ``clock`` say what time it is, how idling passes, and how a step is accounted."""
    log = RequestLog(len(specs))
    run = EngineRun(log=log, steps=[], step_shapes=[], device_s=[], cycle_s=[])
    bar = _bar(len(specs), desc, progress)
    wall0 = time.perf_counter()
    i, n = 0, len(specs)
    while i < n or engine.has_work:
        i = _add_arrivals(engine, specs, prompts, i, clock.now(), run)
        if not engine.has_work:
            clock.idle_until(specs[i].arrival_s)
            continue
        cpu0 = time.thread_time()
        record = engine.step()
        cpu_s = time.thread_time() - cpu0
        if record.shape.num_seqs == 0:
            if i >= n:
                raise RuntimeError("the engine has work it cannot start and no arrival will change that")
            clock.idle_until(specs[i].arrival_s)
            continue
        clock.account(run, record, cpu_s)
        if bar is not None:
            bar.update(len(record.finished_ids))
    run.wall_s = time.perf_counter() - wall0
    if bar is not None:
        bar.close()
    return run


def _add_arrivals(engine: Any, specs: Sequence[RequestSpec], prompts: Sequence[Sequence[int]], i: int,
                  now: float, run: EngineRun) -> int:
    """Hand the engine every request that has arrived by ``now``, from index ``i``; returns the next index."""
    log = run.log
    while i < len(specs) and specs[i].arrival_s <= now:
        spec = specs[i]
        log.on_arrival(spec.request_id, spec.arrival_s, spec.prompt_tokens, spec.output_tokens, None)
        if engine.add_request(spec, prompts[i]).status is RequestStatus.REJECTED:
            log.on_rejected(spec.request_id, spec.arrival_s)
        run.admitted_at_step[spec.request_id] = len(run.steps)
        i += 1
    return i


def _account(run: EngineRun, record: Any, t0: float | None, cpu_s: float, *,
             virtual_end_s: float | None = None) -> None:
    """Log first tokens and finishes of one step: at the engine's token timestamps (real time) or at the
    virtual step end (lockstep)."""
    run.steps.append(_composition(record.request_ids, record.num_new_tokens))
    run.step_shapes.append(record.shape)
    run.device_s.append(record.device_s)
    run.cycle_s.append(record.cycle_s)
    run.cpu_s.append(cpu_s)
    finished = set(record.finished_ids)
    for event in record.events:
        t = virtual_end_s if virtual_end_s is not None else event.timestamp_s - (t0 or 0.0)
        run.log.on_first_token(event.request_id, t)
        if event.request_id in finished:
            run.log.on_finish(event.request_id, t, 0, 0)


# ----- the simulator side ------------------------------------------------------------------------------


def simulate_recorded(config: SchedulerConfig, cost: CostModel, specs: Sequence[RequestSpec]) -> list[Composition]:
    """The simulator's step compositions: a SimPy replica (step by step) whose scheduler records each plan."""
    import simpy

    from simulator.fleet.arrival_feed import ArrivalFeed
    from simulator.fleet.replica import Replica, run_until
    from simulator.results.metrics import ReplicaSeries

    env = simpy.Environment()
    log = RequestLog(len(specs))
    plans: list[StepPlan] = []

    def record(plan: StepPlan) -> None:
        if plan.requests:
            plans.append(plan)

    replica = Replica(env, 0, config, cost, log, ReplicaSeries(0, 1.0), fast_path=False, on_plan=record)

    ArrivalFeed(env, specs, log, [replica])
    run_until(env)
    return [_composition([r.request_id for r in p.requests], p.num_new_tokens) for p in plans]


# ----- comparison --------------------------------------------------------------------------------------


def _percentiles_ms(log: RequestLog) -> dict[str, dict[int, float]]:
    lat = log.latencies_ms()
    done = ~np.isnan(log.columns()["finish_s"])
    out = {}
    for metric in METRICS:
        values = lat[f"{metric}_ms"][done]
        values = values[~np.isnan(values)]
        out[metric] = {q: float(np.percentile(values, q)) if len(values) else math.nan for q in PERCENTILES}
    return out


def throughput_tok_s(log: RequestLog) -> float:
    c = log.columns()
    done = ~np.isnan(c["finish_s"])
    span = float(np.nanmax(c["finish_s"]) - np.nanmin(c["arrival_s"]))
    return float(c["output_tokens"][done].sum()) / span if span > 0 else math.nan


def relative_errors(engine: RequestLog, simulated: RequestLog) -> dict[str, Any]:
    """(simulated − engine) / engine of each percentile, and of output-token throughput."""
    eng, sim = _percentiles_ms(engine), _percentiles_ms(simulated)
    out: dict[str, Any] = {}
    for metric in METRICS:
        out[metric] = {f"p{q}_err": _rel(sim[metric][q], eng[metric][q]) for q in PERCENTILES}
        out[metric].update({f"p{q}_engine_ms": eng[metric][q] for q in PERCENTILES})
        out[metric].update({f"p{q}_sim_ms": sim[metric][q] for q in PERCENTILES})
    out["throughput_err"] = _rel(throughput_tok_s(simulated), throughput_tok_s(engine))
    return out


def _rel(predicted: float, observed: float) -> float:
    return (predicted - observed) / observed if observed and math.isfinite(observed) else math.nan


def step_agreement(engine_steps: Sequence[Composition], sim_steps: Sequence[Composition]) -> dict[str, Any]:
    """Share of step indices whose compositions are identical (over the longer sequence), and the first
    index where they differ (None when identical throughout)."""
    longest = max(len(engine_steps), len(sim_steps))
    same = sum(1 for a, b in zip(engine_steps, sim_steps, strict=False) if a == b)
    first = next((i for i, (a, b) in enumerate(zip(engine_steps, sim_steps, strict=False)) if a != b), None)
    if first is None and len(engine_steps) != len(sim_steps):
        first = min(len(engine_steps), len(sim_steps))
    return {
        "engine_steps": len(engine_steps),
        "sim_steps": len(sim_steps),
        "identical_share": same / longest if longest else 1.0,
        "first_difference": first,
    }


def per_step_errors(predicted_s: Sequence[float], measured_s: Sequence[float]) -> dict[str, float]:
    """Relative error of predicted against measured step times: MAPE, p50/p99 of |error|, and of the total."""
    pred = np.asarray(predicted_s, dtype=np.float64)
    obs = np.asarray(measured_s, dtype=np.float64)
    rel = (pred - obs) / obs
    return {
        "mape": float(np.mean(np.abs(rel))),
        "p50_abs_err": float(np.percentile(np.abs(rel), 50)),
        "p99_abs_err": float(np.percentile(np.abs(rel), 99)),
        "mean_err": float(np.mean(rel)),
        "total_time_err": float(pred.sum() / obs.sum() - 1.0),
    }


# ----- report ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ValidationReport:
    fidelity: dict[str, Any]
    """Contents of fidelity.json."""
    out_dir: Path
    files: list[Path]


def figure_cdfs(engine: RequestLog, simulated: RequestLog, *, title: str) -> Any:
    """CDFs of TTFT, TPOT and E2E: engine against simulator, one panel each."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{m.upper()} (ms)" for m in METRICS])
    for col, metric in enumerate(METRICS, start=1):
        for name, log, color in (("engine", engine, "#1f77b4"), ("simulator", simulated, "#d62728")):
            values = np.sort(log.latencies_ms()[f"{metric}_ms"])
            values = values[~np.isnan(values)]
            if not len(values):
                continue
            fig.add_trace(
                go.Scatter(x=values, y=np.arange(1, len(values) + 1) / len(values), mode="lines", name=name,
                           line={"color": color}, legendgroup=name, showlegend=col == 1),
                row=1, col=col,
            )
        fig.update_xaxes(type="log", row=1, col=col)
    fig.update_yaxes(title_text="share of requests", row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig


def validate(options: ValidationOptions, *, out_dir: str | Path, progress: bool = True) -> ValidationReport:
    """Replay one workload on the engine and in the simulator; write fidelity.json, fidelity.html and
    per-request / per-step CSVs to ``out_dir``."""
    from calibration.fit import save_figure
    from simulator.cost.profile import resolve_profile_path
    from simulator.fleet.fleet import simulate
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
    files: list[Path] = []
    fidelity: dict[str, Any] = {
        "profile": profile.name,
        "profile_mape": profile.fit_error.mape if profile.fit_error else None,
        "num_requests": len(specs),
        "rate_rps": rate,
        "mean_prompt_tokens": float(workload.prompt_tokens.mean()),
        "mean_output_tokens": float(workload.output_tokens.mean()),
        "scheduler": {"max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
                      "num_blocks": config.num_blocks, "block_size": config.block_size},
    }
    engine = _make_engine(profile, config, options)
    _warm_up(engine)
    prompts = _prompts(specs, engine.shape.vocab_size, options.seed)

    if options.mode in ("lockstep", "both"):
        lock = run_engine_lockstep(engine, specs, prompts, cost, progress=progress)
        sim_steps = simulate_recorded(config, cost, specs)
        agreement = step_agreement(lock.steps, sim_steps)
        admitted_same = all(lock.admitted_at_step.get(s.request_id) is not None for s in specs)
        fidelity["lockstep"] = {
            **agreement,
            "identical": agreement["identical_share"] == 1.0 and agreement["engine_steps"] == agreement["sim_steps"],
            "all_admitted": admitted_same,
            "per_step_cycle": per_step_errors(lock.predicted_s, lock.cycle_s),
            "per_step_cpu": per_step_errors(lock.predicted_s, lock.cpu_s),
            "per_step_device": per_step_errors(
                [CostModel(profile).device_time(s) for s in lock.step_shapes], lock.device_s
            ),
        }
        files.append(_steps_csv(out / "lockstep_steps.csv", lock))
        engine = _make_engine(profile, config, options)  # fresh KV pool and queues for the next mode
        _warm_up(engine)

    if options.mode in ("realtime", "both"):
        from calibration.drift import plan_probe

        drift_plan = plan_probe(profile_path, engine.runner, vocab_size=engine.shape.vocab_size)
        probes = [drift_plan.measure(engine.runner)] if drift_plan is not None else []
        real = run_engine_realtime(engine, specs, prompts, progress=progress)
        if drift_plan is not None:
            probes.append(drift_plan.measure(engine.runner))
        simulated = simulate(scenario, workload)
        sim_steps = simulate_recorded(config, cost, specs)
        errors = relative_errors(real.log, simulated.requests)
        fidelity.update({m: errors[m] for m in METRICS})
        fidelity["throughput_err"] = errors["throughput_err"]
        fidelity["realtime"] = {
            **step_agreement(real.steps, sim_steps),
            "per_step_cycle": per_step_errors([cost.step_time(s) for s in real.step_shapes], real.cycle_s),
            "per_step_cpu": per_step_errors([cost.step_time(s) for s in real.step_shapes], real.cpu_s),
            "engine_wall_s": real.wall_s,
            "engine_throughput_tok_s": throughput_tok_s(real.log),
            "sim_throughput_tok_s": throughput_tok_s(simulated.requests),
        }
        # The profile is on the quiet-machine clock (thread CPU time on CPU); other processes stretch the
        # engine's wall clock. The same simulation with every step stretched by the engine's own median
        # wall/CPU ratio separates that from cost-model error (labelled: it borrows a figure from the engine).
        stretch = float(np.median(np.asarray(real.cycle_s) / np.maximum(np.asarray(real.cpu_s), 1e-9)))
        sim_cfg = scenario.simulation.model_copy(update={"cost_factor": stretch})
        stretched = simulate(scenario.model_copy(update={"simulation": sim_cfg}), workload)
        fidelity["host_contention_adjusted"] = {"wall_over_cpu": stretch,
                                                **relative_errors(real.log, stretched.requests)}
        files.append(_steps_csv(out / "realtime_steps.csv", real))
        requests = real.log.to_frame().merge(
            simulated.requests.to_frame()[["request_id", "ttft_ms", "tpot_ms", "e2e_ms"]],
            on="request_id", suffixes=("_engine", "_sim"),
        )
        path = out / "requests.csv"
        requests.to_csv(path, index=False)
        files.append(path)
        title = f"{profile.name}: engine vs simulator, {len(specs)} requests at {rate:.2f} req/s"
        files.append(save_figure(figure_cdfs(real.log, simulated.requests, title=title), out / "fidelity.html"))
        if options.repeat_realtime:
            engine = _make_engine(profile, config, options)
            _warm_up(engine)
            again = run_engine_realtime(engine, specs, prompts, progress=progress)
            if drift_plan is not None:
                probes.append(drift_plan.measure(engine.runner))
            fidelity["repeat"] = {
                "engine_vs_engine": relative_errors(real.log, again.log),
                "sim_vs_engine": relative_errors(again.log, simulated.requests),
                "per_step_cycle": per_step_errors([cost.step_time(s) for s in again.step_shapes], again.cycle_s),
                "engine_wall_s": again.wall_s,
            }
            files.append(_steps_csv(out / "realtime_repeat_steps.csv", again))
        if probes:
            # The host's speed change since calibration, measured outside the replay (calibration.drift).
            # The headline errors above keep the profile as it is; this is what remains with the
            # simulator's clock scaled by that change: the part of the error that is the cost model's shape.
            speed = float(np.mean([p.speed_ratio for p in probes]))
            drifted = scenario.model_copy(update={
                "simulation": scenario.simulation.model_copy(update={"cost_factor": speed})})
            fidelity["host_drift"] = {
                "speed_ratio": speed,
                "probes": [p.as_dict() for p in probes],
                "adjusted": relative_errors(real.log, simulate(drifted, workload).requests),
            }

    path = out / "fidelity.json"
    path.write_text(json.dumps(_json_safe(fidelity), indent=2) + "\n")
    files.append(path)
    return ValidationReport(fidelity=fidelity, out_dir=out, files=files)


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
        print(f"{'metric':8s} {'p50 err':>9s} {'p90 err':>9s} {'p99 err':>9s}   engine p50/p99 ms   sim p50/p99 ms")
        for metric in METRICS:
            m = f[metric]
            print(f"{metric:8s} {m['p50_err']:+9.2%} {m['p90_err']:+9.2%} {m['p99_err']:+9.2%}   "
                  f"{m['p50_engine_ms']:8.1f}/{m['p99_engine_ms']:8.1f}   "
                  f"{m['p50_sim_ms']:8.1f}/{m['p99_sim_ms']:8.1f}")
        print(f"throughput err {f['throughput_err']:+.2%}")
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
        _print_errors(drift["adjusted"])
    rep = f.get("repeat")
    if rep is not None:
        print("noise floor, the engine's second real-time run against its first (same workload):")
        _print_errors(rep["engine_vs_engine"])
        print("the simulator against that second run:")
        _print_errors(rep["sim_vs_engine"])
    for path in report.files:
        print(f"wrote {path}")


def _print_errors(errors: dict[str, Any]) -> None:
    for metric in METRICS:
        m = errors[metric]
        print(f"  {metric:6s} p50 {m['p50_err']:+7.2%}  p90 {m['p90_err']:+7.2%}  p99 {m['p99_err']:+7.2%}")
    print(f"  throughput {errors['throughput_err']:+.2%}")


def _bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, mininterval=0.5)
